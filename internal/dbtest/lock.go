package dbtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// LockTable takes an ACCESS EXCLUSIVE lock on table in the database at
// dbURL, in a transaction on a connection of its own, as a long migration
// or a stuck session would: every other statement on the table waits. The
// returned func releases the lock; t.Cleanup releases it too.
func LockTable(t testing.TB, dbURL, table string) (release func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("lock %s: %v", table, err)
	}
	// Closing the connection ends the transaction and with it the lock.
	release = func() { _ = conn.Close(context.Background()) }
	t.Cleanup(release)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatalf("lock %s: %v", table, err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()); err != nil {
		t.Fatalf("lock %s: %v", table, err)
	}
	return release
}
