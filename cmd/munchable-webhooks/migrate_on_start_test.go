package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/migrations"
)

func execSQL(t *testing.T, dbURL string, stmts ...string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, stmt := range stmts {
		if _, err := conn.Exec(t.Context(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

func schemaVersion(t *testing.T, dbURL string) int64 {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v int64
	if err := conn.QueryRow(t.Context(), `SELECT max(version_id) FROM goose_db_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// MIGRATE_ON_START=false: serve leaves an older schema as it is and
// refuses it, naming both versions; on a migrated one it starts, without
// migrating.
func TestServeWithoutMigrateOnStart(t *testing.T) {
	t.Parallel()
	want := migrations.Version()
	dbURL := dbtest.NewDatabase(t)
	// The schema as it was before the highest migration ran, as far as
	// goose can tell.
	execSQL(t, dbURL, fmt.Sprintf(`DELETE FROM goose_db_version WHERE version_id >= %d`, want))
	older := schemaVersion(t, dbURL)

	env := validEnv()
	env["DATABASE_URL"] = dbURL
	env["MIGRATE_ON_START"] = "false"
	var out bytes.Buffer
	// A serve that wrongly starts stops when ctx ends, and returns nil.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	err := run(ctx, []string{"munchable-webhooks", "serve"}, environ(env), &out, &out)
	cancel()
	if !errors.Is(err, migrations.ErrSchema) {
		t.Fatalf("serve on schema %d with MIGRATE_ON_START=false: %v, want ErrSchema\n%s", older, err, &out)
	}
	if msg := fmt.Sprintf("schema is version %d, this build needs %d", older, want); !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not say %q", err, msg)
	}
	if got := schemaVersion(t, dbURL); got != older {
		t.Errorf("schema version %d after serve with MIGRATE_ON_START=false, want %d (not migrated)", got, older)
	}

	s := startService(t, map[string]string{"MIGRATE_ON_START": "false"})
	resp := s.postStripe(t, fixture(t))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("delivery with MIGRATE_ON_START=false on a migrated schema answered %d, want 200", resp.StatusCode)
	}
	if strings.Contains(s.logs.String(), "migrations applied") {
		t.Error("serve with MIGRATE_ON_START=false ran the migrations")
	}
}

// A later release's contract step removed what this build uses: serve
// refuses, with or without migrating first, and says which release can run.
func TestServeRefusesAContractedSchema(t *testing.T) {
	t.Parallel()
	want := migrations.Version()
	dbURL := dbtest.NewDatabase(t)
	execSQL(t, dbURL, fmt.Sprintf(
		`INSERT INTO schema_contracts (version, min_schema, removed) VALUES (%d, %d, 'the column x')`, want+3, want+1))
	for _, onStart := range []string{"true", "false"} {
		env := validEnv()
		env["DATABASE_URL"] = dbURL
		env["MIGRATE_ON_START"] = onStart
		var out bytes.Buffer
		// A serve that wrongly starts stops when ctx ends, and returns nil.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		err := run(ctx, []string{"munchable-webhooks", "serve"}, environ(env), &out, &out)
		cancel()
		if !errors.Is(err, migrations.ErrSchema) {
			t.Fatalf("MIGRATE_ON_START=%s: serve = %v, want ErrSchema\n%s", onStart, err, &out)
		}
		for _, s := range []string{"removed the column x", fmt.Sprintf("this build expects %d", want), fmt.Sprintf("expecting %d or later", want+1)} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("MIGRATE_ON_START=%s: error %q does not say %q", onStart, err, s)
			}
		}
	}
}
