package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
)

// ErrSchema marks a database whose schema this build cannot serve: older
// than its migrations, or contracted past what it uses.
var ErrSchema = errors.New("schema not servable by this build")

// Version is the schema version this build expects: its highest migration.
func Version() int64 {
	names, _ := fs.Glob(files, "*.sql") // the pattern is valid
	var v int64
	for _, name := range names {
		if n, err := goose.NumericComponent(name); err == nil && n > v {
			v = n
		}
	}
	return v
}

// State is what a database says of its schema.
type State struct {
	// Version is the highest migration applied (0: none).
	Version int64
	// MinSchema is the lowest schema version a build must expect to run
	// on this database, set by the contract steps applied (0: none).
	MinSchema int64
	// Removed says what the latest of those steps removed.
	Removed string
}

const versionQuery = `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`

const contractQuery = `
SELECT min_schema, removed FROM schema_contracts ORDER BY min_schema DESC, version DESC LIMIT 1`

// ReadState reads the schema's version and its contract steps.
func ReadState(ctx context.Context, db *sql.DB) (State, error) {
	var s State
	// A table named in a query must exist when it is parsed, so whether
	// each does is asked first.
	var goose, contracts bool
	err := db.QueryRowContext(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL,
		to_regclass('schema_contracts') IS NOT NULL`).Scan(&goose, &contracts)
	if err != nil {
		return State{}, fmt.Errorf("schema tables: %w", err)
	}
	if !goose {
		return s, nil // never migrated
	}
	if err := db.QueryRowContext(ctx, versionQuery).Scan(&s.Version); err != nil {
		return State{}, fmt.Errorf("schema version: %w", err)
	}
	if !contracts {
		return s, nil
	}
	err = db.QueryRowContext(ctx, contractQuery).Scan(&s.MinSchema, &s.Removed)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return State{}, fmt.Errorf("schema contracts: %w", err)
	}
	return s, nil
}

// Verify returns an error wrapping ErrSchema, naming both versions, when
// the database's schema is older than this build needs or a contract step
// has removed what it uses.
func Verify(ctx context.Context, db *sql.DB) error {
	s, err := ReadState(ctx, db)
	if err != nil {
		return err
	}
	return s.Serves(Version())
}

// Serves says whether a build expecting schema version want can run on s.
func (s State) Serves(want int64) error {
	if s.Version < want {
		return fmt.Errorf("%w: the database's schema is version %d, this build needs %d: "+
			"run `munchable-webhooks migrate` of this release first (or set MIGRATE_ON_START=true)",
			ErrSchema, s.Version, want)
	}
	if s.MinSchema > want {
		return fmt.Errorf("%w: the database's schema is version %d, and a contract step removed %s, "+
			"which builds expecting a schema below %d use; this build expects %d: run a release expecting %d or later",
			ErrSchema, s.Version, s.Removed, s.MinSchema, want, s.MinSchema)
	}
	return nil
}
