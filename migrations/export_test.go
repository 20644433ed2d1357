package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// ApplyUpTo applies the migrations up to version only, as a database of
// an earlier release has them, for tests of the later ones.
func ApplyUpTo(ctx context.Context, db *sql.DB, version int64) error {
	inner, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(&timeoutSession{inner: inner, lockTimeout: DefaultOptions().LockTimeout}),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return err
	}
	if _, err := provider.UpTo(ctx, version); err != nil {
		return fmt.Errorf("up to %d: %w", version, err)
	}
	return nil
}

// WaitedForLock is waitedForLock, for the runner's retry test.
var WaitedForLock = waitedForLock
