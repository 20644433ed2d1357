package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// consumerRow is the test consumer's row in feed_consumers.
type consumerRow struct {
	cursor  string
	enabled bool
}

func testConsumer(t *testing.T, pool *pgxpool.Pool) (consumerRow, bool) {
	t.Helper()
	var c consumerRow
	err := pool.QueryRow(context.Background(), `SELECT cursor, enabled FROM feed_consumers WHERE name = 'test'`).
		Scan(&c.cursor, &c.enabled)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return c, false
		}
		t.Fatal(err)
	}
	return c, true
}

// runFor runs rel until cond holds, then stops it.
func runFor(t *testing.T, rel *relay.Relay, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rel.Run(ctx, nil) }()
	waitFor(t, what, cond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run ended by its context: %v, want nil", err)
	}
}

// TestRegisterLeavesTheCursor: a restart, or another replica starting,
// finds the consumer's row and leaves its cursor where the relay moved
// it: nothing is delivered again, nothing skipped.
func TestRegisterLeavesTheCursor(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, fast)
	if err := r.relay.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	first, _ := testConsumer(t, pool)
	a := addChange(t, pool, ledger.KindSupportMessage, "a")
	runFor(t, r.relay, "change a delivered", func() bool { return deliveries(t, pool)[a].State == relay.Delivered })
	moved, _ := testConsumer(t, pool)
	if moved.cursor == first.cursor {
		t.Fatalf("the relay did not move the cursor from %s", first.cursor)
	}
	b := addChange(t, pool, ledger.KindSupportMessage, "b")
	for range 2 { // a restart, then another replica
		again := newRig(t, pool, fast)
		if err := again.relay.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
		if c, _ := testConsumer(t, pool); c.cursor != moved.cursor {
			t.Fatalf("Register moved the cursor from %s to %s", moved.cursor, c.cursor)
		}
	}
	last := newRig(t, pool, fast)
	last.start(t, nil)
	waitState(t, pool, b, relay.Delivered)
	if n := len(last.dest.log()); n != 1 {
		t.Errorf("after the restarts the relay made %d attempts (%v), want 1: change b", n, last.dest.log())
	}
}

// TestRegisterMidRollout: a replica without the destination (the
// previous release) leads the relay while a configured one has started:
// its relay marks the consumer not enabled. The changes of that window
// are neither lost nor trimmed (they are younger than the retention), a
// configured replica starting marks the consumer enabled again without
// moving its cursor, and once a configured relay leads it delivers every
// change since the first registration, once, and none from before.
func TestRegisterMidRollout(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	before := addChange(t, pool, ledger.KindSupportMessage, "before")
	newer := newRig(t, pool, fast)
	if err := newer.relay.Register(ctx); err != nil {
		t.Fatal(err)
	}
	registered, _ := testConsumer(t, pool)
	took := addChange(t, pool, ledger.KindSupportMessage, "taken-by-the-new-replica")

	// The previous release's relay takes the lead: it knows no consumer.
	old := relay.New(relay.Config{Pool: pool, Poll: 10 * time.Millisecond})
	var window []int64
	runFor(t, old, "the consumer marked not enabled", func() bool {
		c, _ := testConsumer(t, pool)
		return !c.enabled
	})
	window = append(window, addChange(t, pool, ledger.KindSupportMessage, "taken-by-the-old-replica"))
	if _, n, err := ledger.New(pool, 0).Trim(ctx, 720*time.Hour); err != nil || n != 0 {
		t.Fatalf("retention in the window deleted %d changes (err %v), want none", n, err)
	}
	if c, _ := testConsumer(t, pool); c.cursor != registered.cursor || c.enabled {
		t.Fatalf("while the old relay leads the consumer is %+v, want its registered cursor %s, not enabled", c, registered.cursor)
	}

	// A second configured replica starts: enabled again, same cursor.
	second := newRig(t, pool, fast)
	if err := second.relay.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := testConsumer(t, pool); c.cursor != registered.cursor || !c.enabled {
		t.Fatalf("after a configured replica started the consumer is %+v, want cursor %s, enabled", c, registered.cursor)
	}
	window = append(window, addChange(t, pool, ledger.KindSupportMessage, "taken-after-the-second-started"))

	second.start(t, nil)
	for _, id := range append([]int64{took}, window...) {
		waitState(t, pool, id, relay.Delivered)
	}
	if d, ok := deliveries(t, pool)[before]; ok {
		t.Errorf("the change from before the first registration was taken: %+v", d)
	}
	if n := len(second.dest.log()); n != 3 {
		t.Errorf("attempts %v, want 3, one per change since the start", second.dest.log())
	}
}

// TestRegisterBoundary: the start is the registering transaction's own
// transaction id. A change committed before Register is before it, and
// so is what the relay, running later, finds there. A transaction that
// began before Register but wrote
// only after it is after the start; one that had written before it is
// before the start, even if it commits after Register has returned
// (whatever else has finished meanwhile: the snapshot's xmax, the start
// before, put it on either side); a change made once Register has
// returned is after it.
func TestRegisterBoundary(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	insert := `INSERT INTO changes (at, kind, subject, after) VALUES (now(), 'support_message', $1, '{"n":1}') RETURNING id`
	committed := addChange(t, pool, ledger.KindSupportMessage, "committed-before")

	wrote, err := pool.Begin(ctx) // had written when Register ran
	if err != nil {
		t.Fatal(err)
	}
	defer wrote.Rollback(ctx)
	var inFlight int64
	if err := wrote.QueryRow(ctx, insert, "in-flight").Scan(&inFlight); err != nil {
		t.Fatal(err)
	}
	began, err := pool.Begin(ctx) // begun, nothing written yet
	if err != nil {
		t.Fatal(err)
	}
	defer began.Rollback(ctx)
	if _, err := began.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}

	r := newRig(t, pool, fast)
	if err := r.relay.Register(ctx); err != nil {
		t.Fatal(err)
	}

	var late int64
	if err := began.QueryRow(ctx, insert, "began-before-wrote-after").Scan(&late); err != nil {
		t.Fatal(err)
	}
	if err := began.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wrote.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := addChange(t, pool, ledger.KindSupportMessage, "after")

	r.start(t, nil)
	waitState(t, pool, late, relay.Delivered)
	waitState(t, pool, after, relay.Delivered)
	got := deliveries(t, pool)
	if d, ok := got[committed]; ok {
		t.Errorf("the change committed before the registration was taken: %+v", d)
	}
	if d, ok := got[inFlight]; ok {
		t.Errorf("the change written before the registration was taken: %+v", d)
	}
}
