package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestBookkeepingReadsTheBatchNotTheHistory runs the relay's statements
// for due and recorded deliveries as the relay runs them, on one
// connection: a few times while relay_deliveries is small (where a
// prepared statement settles on a generic plan), then once the table holds
// 50,000 finished deliveries that no ANALYZE has seen, as on a young,
// busy database. Each may read about the batch and the open deliveries;
// one that reads the consumer's history grows with every delivery ever
// made (it was 16 ms a batch at 60,000, and growing).
func TestBookkeepingReadsTheBatchNotTheHistory(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // one connection, one plan cache
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := New(Config{Pool: pool})
	const batch = 100
	next := int64(1)
	// round takes a batch of pending deliveries, runs the due query and
	// records them all as delivered, and returns the tuples the due query
	// and the record read from relay_deliveries.
	round := func() (due, record int64) {
		t.Helper()
		ids, subjects, bodies := make([]int64, batch), make([]string, batch), make([]string, batch)
		for i := range ids {
			ids[i] = next
			subjects[i] = fmt.Sprintf("sub_%d", next)
			bodies[i] = fmt.Sprintf(`{"id":%d,"kind":"subscription","subject":"sub_%d","at":"2026-12-05T00:00:00Z"}`, next, next)
			next++
		}
		if _, err := pool.Exec(ctx, pendingSQL, AppWebhookConsumer, ids, subjects, subjects, bodies); err != nil {
			t.Fatal(err)
		}
		var outcomes []*delivery
		due = readIn(t, pool, func(tx pgx.Tx) {
			rows, err := tx.Query(ctx, dueSQL, r.batchArgs(AppWebhookConsumer, batch)...)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				d := &delivery{}
				if err := rows.Scan(&d.change.ID, &d.attempts, new([]byte)); err != nil {
					t.Fatal(err)
				}
				outcomes = append(outcomes, d)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		})
		if len(outcomes) != batch {
			t.Fatalf("due: %d deliveries, want %d", len(outcomes), batch)
		}
		record = readIn(t, pool, func(tx pgx.Tx) {
			if err := r.record(ctx, tx, AppWebhookConsumer, outcomes); err != nil {
				t.Fatal(err)
			}
		})
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries WHERE state <> 'delivered'`).Scan(&open); err != nil || open != 0 {
			t.Fatalf("after the record: %d deliveries not delivered (%v)", open, err)
		}
		return due, record
	}
	for range 10 {
		round()
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, change, delivered_at)
SELECT $1, g, 'sub_' || g, 'sub_' || g, 'delivered', 1, '{}', now() FROM generate_series($2::bigint, $2::bigint + 49999) g`,
		AppWebhookConsumer, next); err != nil {
		t.Fatal(err)
	}
	next += 50000
	due, record := round()
	t.Logf("with 51,100 deliveries, %d of them open: the due query read %d rows, the record %d", batch, due, record)
	// A batch's rows, each seen a few times over in the table and its
	// indexes, and the open index's entries of the deliveries finished
	// since the last vacuum (the ten rounds' 1,000, which a plan that walks
	// that index reads); the history is 500 times the batch.
	const bound = 20 * batch
	if due > bound || record > bound {
		t.Errorf("with 51,100 deliveries, %d of them open: the due query read %d rows and the record %d; want at most %d each", batch, due, record, bound)
	}
}

// pendingSQL records changes as pending and due now, as a change that
// waits for an older one of its order key is (and as the previous release
// recorded every change it took).
const pendingSQL = `
INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, next_attempt_at, change)
SELECT $1, t.id, t.subject, t.key, 'pending', 0, now(), t.change
FROM unnest($2::bigint[], $3::text[], $4::text[], $5::jsonb[]) AS t(id, subject, key, change)`

// readIn runs fn in a transaction and returns the rows it read from
// relay_deliveries and its indexes (a row read through an index counts
// there, and again in the table if fetched from it): the difference of the
// backend's counts before and after it, which it reports only between
// transactions.
func readIn(t *testing.T, pool *pgxpool.Pool, fn func(pgx.Tx)) int64 {
	t.Helper()
	ctx := context.Background()
	const readSQL = `
SELECT sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid))::bigint
FROM pg_class c
WHERE c.oid = 'relay_deliveries'::regclass
   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'relay_deliveries'::regclass)`
	var before, after int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, readSQL).Scan(&before); err != nil {
			return err
		}
		fn(tx)
		return tx.QueryRow(ctx, readSQL).Scan(&after)
	})
	if err != nil {
		t.Fatal(err)
	}
	return after - before
}
