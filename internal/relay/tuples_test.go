package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// TestTuplesPerDeliveredChange delivers 300 changes, arriving over about
// a second as a busy feed's do, to a destination that takes each at once,
// and counts the tuples the relay wrote to its tables (relay_deliveries
// and feed_consumers: inserted, updated, deleted), as Postgres counts
// them. A delivered change costs at most one row, written in a batch, and
// the cursor moves once a page: at most 1.1 tuples a change. Inserting
// each change as pending and updating it once delivered cost 2.05.
func TestTuplesPerDeliveredChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The changes are written over a pool of their own, so that the
	// relay's pool holds only the relay's backends.
	pool, feed := twoPools(t)

	dest := newScript()
	r := relay.New(relay.Config{
		Pool: pool,
		Consumers: []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage},
			Destination: dest, Parallel: relay.AppWebhookParallel}},
		Poll: 100 * time.Millisecond,
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx, nil) }()
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = feed.QueryRow(ctx, `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	const changes = 300
	for i := range changes {
		addChange(t, feed, ledger.KindSupportMessage, fmt.Sprintf("subject-%d", i%50))
		time.Sleep(3 * time.Millisecond)
	}
	waitFor(t, "every change delivered", func() bool {
		var n int
		_ = feed.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries WHERE state = 'delivered'`).Scan(&n)
		return n == changes
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A backend reports its counts when it has been idle a while, and at
	// the latest when it exits: closing the relay's pool ends its backends.
	pool.Close()
	ins, upd, del := relayTuples(t, feed, changes)
	per := float64(ins+upd+del) / changes
	t.Logf("%d changes delivered: %d tuples inserted, %d updated, %d deleted: %.3f a change", changes, ins, upd, del, per)
	if per > 1.1 {
		t.Errorf("%.3f tuples of the relay's tables a delivered change, want at most 1.1", per)
	}
	if sends := len(dest.log()); sends != changes {
		t.Errorf("%d sends for %d changes, want one each", sends, changes)
	}
}

// relayTuples returns the tuples written to the relay's tables (inserted,
// updated, deleted), as Postgres counts them, once the backends that
// wrote them have ended and at least minInserted inserts are counted.
func relayTuples(t *testing.T, q *pgxpool.Pool, minInserted int64) (ins, upd, del int64) {
	t.Helper()
	ctx := context.Background()
	const countsSQL = `
SELECT sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_del)::bigint
FROM pg_stat_user_tables WHERE relname IN ('relay_deliveries', 'feed_consumers')`
	waitFor(t, "the relay's backends to report", func() bool {
		err := q.QueryRow(ctx, countsSQL).Scan(&ins, &upd, &del)
		return err == nil && ins >= minInserted
	})
	// The counts may still be settling: once they read at least the rows
	// there are, give the last backends a moment and read again.
	time.Sleep(time.Second)
	if err := q.QueryRow(ctx, countsSQL).Scan(&ins, &upd, &del); err != nil {
		t.Fatal(err)
	}
	return ins, upd, del
}

// TestIdleFeedStoresCursorRarely: on an idle feed whose read horizon
// moves at every poll (other transactions on the server, as on a shared
// one), the relay's cursor follows the horizon in memory and is stored
// at most every few seconds, not at every poll: once here, over a second
// and a half of 10 ms polls.
func TestIdleFeedStoresCursorRarely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, other := twoPools(t)

	r := relay.New(relay.Config{
		Pool:      pool,
		Consumers: []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: newScript()}},
		Poll:      10 * time.Millisecond,
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx, nil) }()
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = other.QueryRow(ctx, `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	// Each statement takes a transaction id of its own and ends: the
	// horizon moves on, with nothing in the feed.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		if _, err := other.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pool.Close()
	ins, upd, del := relayTuples(t, other, 1)
	t.Logf("idle feed: %d tuples inserted, %d updated, %d deleted", ins, upd, del)
	if upd > 1 {
		t.Errorf("%d updates of the relay's tables on an idle feed over 1.5 s, want at most 1", upd)
	}
}

// twoPools opens two pools on one new database: the relay's, and another
// for the test's own writes, so that the relay's holds only its backends.
func twoPools(t *testing.T) (relays, other *pgxpool.Pool) {
	t.Helper()
	url := dbtest.NewDatabase(t)
	open := func() *pgxpool.Pool {
		p, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	return open(), open()
}
