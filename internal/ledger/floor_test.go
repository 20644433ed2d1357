package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// waitReadable waits until the read horizon has passed every change in
// the table: retention deletes nothing above it, and on a server shared
// with other tests a transaction of theirs may hold it back a moment.
func waitReadable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var passed bool
		err := pool.QueryRow(context.Background(), `
SELECT coalesce(max(txid) < pg_snapshot_xmin(pg_current_snapshot()), true) FROM changes`).Scan(&passed)
		if err != nil {
			t.Fatal(err)
		}
		if passed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the read horizon did not pass the changes within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// oldChanges adds n changes dated 40 days ago, each in its own
// transaction, and returns their ids.
func oldChanges(t *testing.T, pool *pgxpool.Pool, n int) []int64 {
	t.Helper()
	var ids []int64
	for range n {
		var id int64
		if err := pool.QueryRow(context.Background(), `INSERT INTO changes (at, kind, subject)
VALUES (now() - interval '40 days', 'subscription', 's') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func kept(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM changes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// cursorAfter reads the feed to its end from the start and returns the
// cursor after the change id (the zero cursor when id is 0).
func cursorAfter(t *testing.T, pool *pgxpool.Pool, id int64) ledger.Cursor {
	t.Helper()
	var c ledger.Cursor
	for {
		page, next, err := ledger.Read(context.Background(), pool, c, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			t.Fatalf("change %d not in the feed", id)
		}
		if page[0].ID == id {
			return page[0].Cursor
		}
		c = next
	}
}

// TestRetentionKeepsWhatAConsumerHasNotPassed: an enabled consumer's
// cursor holds back the changes at and after its floor; one no longer
// enabled holds nothing back; a cursor behind what was deleted is told.
func TestRetentionKeepsWhatAConsumerHasNotPassed(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	l := ledger.New(pool, 5)
	ids := oldChanges(t, pool, 4)
	waitReadable(t, pool)
	// The consumer has read the first change: its floor is at or below
	// the second's txid.
	c := cursorAfter(t, pool, ids[0])
	if _, err := pool.Exec(ctx, `INSERT INTO feed_consumers (name, cursor, updated_at, floor)
VALUES ('forward', $1, now(), $2::text::xid8)`, c.String(), fmt.Sprint(c.Floor())); err != nil {
		t.Fatal(err)
	}
	if err := ledger.CheckCursor(ctx, pool, c); err != nil {
		t.Fatalf("CheckCursor before any trim = %v", err)
	}
	if _, n, err := l.Trim(ctx, 720*time.Hour); err != nil || n > 1 {
		t.Fatalf("Trim with a lagging consumer = %d, %v; want at most the one change it read", n, err)
	}
	if got := kept(t, pool); got < 3 {
		t.Fatalf("changes kept = %d, want the 3 the consumer has not read", got)
	}
	if err := ledger.CheckCursor(ctx, pool, c); err != nil {
		t.Errorf("CheckCursor of the lagging consumer = %v, want no gap: nothing it needs was deleted", err)
	}

	// Forwarding switched off: the consumer holds nothing back, and its
	// cursor, should it come back, has a gap.
	if _, err := pool.Exec(ctx, `UPDATE feed_consumers SET enabled = false`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Trim(ctx, 720*time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := kept(t, pool); got != 0 {
		t.Errorf("changes kept with the consumer disabled = %d, want 0", got)
	}
	if err := ledger.CheckCursor(ctx, pool, c); !errors.Is(err, ledger.ErrCursorExpired) {
		t.Errorf("CheckCursor behind deleted changes = %v, want ErrCursorExpired", err)
	}
	if err := ledger.CheckCursor(ctx, pool, ledger.Cursor{}); err != nil {
		t.Errorf("CheckCursor of the start of the feed = %v, want nil: it reads what is kept", err)
	}
}

// TestRetentionKeepsWhatTheHorizonHasNotPassed: while a transaction is
// open, a change committed after it began is not readable by anyone yet,
// however old its at says it is, and retention keeps it.
func TestRetentionKeepsWhatTheHorizonHasNotPassed(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	l := ledger.New(pool, 5)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // holds the horizon
		t.Fatal(err)
	}
	oldChanges(t, pool, 3)
	if _, n, err := l.Trim(ctx, 720*time.Hour); err != nil || n != 0 {
		t.Fatalf("Trim behind an open transaction = %d, %v; want 0", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitReadable(t, pool)
	if _, n, err := l.Trim(ctx, 720*time.Hour); err != nil || n != 3 {
		t.Errorf("Trim once the transaction ended = %d, %v; want 3", n, err)
	}
}

// TestHorizonWatch: the lag grows while one transaction holds the
// horizon, and is 0 once it ends.
func TestHorizonWatch(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	var w ledger.HorizonWatch
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	// A transaction that completes after ours began waits behind it.
	oldChanges(t, pool, 1)
	start := time.Now()
	// Other tests' transactions on the shared server may hold the horizon
	// too; ours holds it from now until it ends, so a sample a minute
	// "later" sees a minute of lag, at least from the first sample that
	// saw ours.
	var lag time.Duration
	for i := range 3 {
		if lag, err = w.Sample(ctx, pool, start.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if lag < time.Minute {
		t.Errorf("lag after three samples a minute apart behind one transaction = %s, want at least 1m", lag)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}
