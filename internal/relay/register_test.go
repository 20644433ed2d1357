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
// transaction id. A change committed before Register is before it. A
// transaction that had written before the registration is before it
// too, and Register returns only once it has ended, so that nothing
// committed after Register returns is before the start. A transaction
// that began before Register but writes only after it is after the
// start, as is a change made once Register has returned.
func TestRegisterBoundary(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	committed := addChange(t, pool, ledger.KindSupportMessage, "committed-before")
	wrote, inFlight := openChange(t, pool, "in-flight") // had written when Register ran
	began, err := pool.Begin(ctx)                       // begun, nothing written yet
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = began.Rollback(ctx) })
	if _, err := began.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}

	r := newRig(t, pool, fast)
	registered := make(chan error, 1)
	go func() { registered <- r.relay.Register(ctx) }()
	select {
	case err := <-registered:
		t.Fatalf("Register returned (%v) while a transaction older than the start ran", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := wrote.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-registered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Register did not return once the older transaction had ended")
	}

	late := addChangeIn(t, began, "began-before-wrote-after")
	if err := began.Commit(ctx); err != nil {
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

// TestRegisterWaitIsBounded: a transaction older than the start held open
// delays Register by its bound (Config.RegisterWait) only; what it
// commits later is before the start, and what comes after Register is
// delivered.
func TestRegisterWaitIsBounded(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	// The held transaction delays every Register on the server (each
	// test's database is on one): it is held for the bound and no more.
	const bound = 100 * time.Millisecond
	held, heldID := openChange(t, pool, "held-open")
	r := newRig(t, pool, fast)
	r.relay = relay.New(relay.Config{
		Pool:         pool,
		Consumers:    []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: r.dest}},
		Poll:         10 * time.Millisecond,
		RegisterWait: bound,
	})
	began := time.Now()
	err := r.relay.Register(ctx)
	took := time.Since(began)
	if cerr := held.Commit(ctx); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if took < bound {
		t.Errorf("Register returned after %v, before its bound, with an older transaction running", took)
	}
	if took > bound+2*time.Second {
		t.Errorf("Register returned after %v, want about its bound (%v)", took, bound)
	}
	if c, ok := testConsumer(t, pool); !ok || !c.enabled {
		t.Fatalf("the consumer's row is %+v (found %v), want it enabled", c, ok)
	}
	after := addChange(t, pool, ledger.KindSupportMessage, "after")
	r.start(t, nil)
	waitState(t, pool, after, relay.Delivered)
	if d, ok := deliveries(t, pool)[heldID]; ok {
		t.Errorf("the change of the transaction older than the start was taken: %+v", d)
	}
}

// openChange begins a transaction and appends a change in it, left
// uncommitted.
func openChange(t *testing.T, pool *pgxpool.Pool, subject string) (pgx.Tx, int64) {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx, addChangeIn(t, tx, subject)
}

// addChangeIn appends a support message change in tx.
func addChangeIn(t *testing.T, tx pgx.Tx, subject string) int64 {
	t.Helper()
	var id int64
	err := tx.QueryRow(context.Background(),
		`INSERT INTO changes (at, kind, subject, after) VALUES (now(), 'support_message', $1, '{"n":1}') RETURNING id`,
		subject).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
