package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// TestFenceBeforeSend: a relay that leads, then loses the lead, sends
// nothing of the changes that come after, and stops.
func TestFenceBeforeSend(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	lost := errors.New("lease lost")
	var mu sync.Mutex
	leads := true
	fence := func(context.Context, pgx.Tx) error {
		mu.Lock()
		defer mu.Unlock()
		if !leads {
			return lost
		}
		return nil
	}
	r := newRig(t, pool, fast)
	done := make(chan error, 1)
	go func() { done <- r.relay.Run(context.Background(), fence) }()
	waitConsumer(t, pool)
	mu.Lock()
	leads = false
	mu.Unlock()
	addChange(t, pool, ledger.KindSupportMessage, "x")
	select {
	case err := <-done:
		if !errors.Is(err, relay.ErrFenced) || !errors.Is(err, lost) {
			t.Fatalf("Run after the lead was lost = %v, want ErrFenced wrapping the fence's error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not stop after it lost the lead")
	}
	if n := len(r.dest.log()); n != 0 {
		t.Errorf("a relay that lost the lead sent %d times", n)
	}
	if got := deliveries(t, pool); len(got) != 0 {
		t.Errorf("a relay that lost the lead recorded %v", got)
	}
}

// TestCutMidPage: a relay stopped while one change of a page is still at
// the far side, after another's outcome was recorded (a flush) and before
// the cursor moved past the page, is followed by one that sends again only
// the change whose outcome was not recorded, with the same change, and
// records each change once.
func TestCutMidPage(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, fast)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.dest.set("slow", func(int) error {
		once.Do(func() { close(held) })
		<-release // answers only once the run has been told to end
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.relay.Run(ctx, nil) }()
	t.Cleanup(cancel)
	waitConsumer(t, pool)
	// One transaction: both changes are in one page.
	var slow, quick int64
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		for _, p := range []struct {
			subject string
			id      *int64
		}{{"slow", &slow}, {"quick", &quick}} {
			if err := tx.QueryRow(context.Background(),
				`INSERT INTO changes (at, kind, subject, after) VALUES (now(), $1, $2, '{"n":1}') RETURNING id`,
				ledger.KindSupportMessage, p.subject).Scan(p.id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-held
	waitState(t, pool, quick, relay.Delivered) // a flush, the page not done
	cancel()
	close(release)
	<-done
	// The cursor has not passed slow: its (txid, id) is not behind it.
	var s string
	var txid uint64
	if err := pool.QueryRow(context.Background(), `SELECT cursor FROM feed_consumers`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(context.Background(), `SELECT txid::text::bigint FROM changes WHERE id = $1`, slow).Scan(&txid); err != nil {
		t.Fatal(err)
	}
	cur, err := ledger.ParseCursor(s)
	if err != nil {
		t.Fatal(err)
	}
	passed := cur.Lo > txid || cur.Lo == txid && cur.Last >= slow
	if _, ok := deliveries(t, pool)[slow]; ok || passed {
		t.Fatalf("cut mid-page: slow recorded %v, cursor %s past it (txid %d) %v; want neither", ok, s, txid, passed)
	}

	next := newRig(t, pool, fast)
	next.start(t, nil)
	waitState(t, pool, slow, relay.Delivered)
	if got, want := next.dest.log(), []string{fmt.Sprintf("slow/%d", slow)}; !slices.Equal(got, want) {
		t.Errorf("the next run sent %v, want only %v", got, want)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM relay_deliveries`).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d deliveries (%v), want 2", n, err)
	}
}

// TestPageTakesAndSkips: a change of the consumer's kinds that its Takes
// refuses only moves the cursor (no row); one its destination skips is
// recorded skipped without a copy of the change (it is never sent
// again); one that failed keeps its copy for the retry.
func TestPageTakesAndSkips(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	dest := newScript()
	dest.set("skip", func(int) error { return fmt.Errorf("%w: not for this destination", relay.ErrSkip) })
	dest.set("fail", func(int) error { return relay.ErrPermanent })
	r := relay.New(relay.Config{
		Pool: pool,
		Consumers: []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: dest,
			Takes: func(ch ledger.Change) bool { return ch.Subject != "passed" }}},
		Poll: 10 * time.Millisecond,
	})
	if err := r.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	passed := addChange(t, pool, ledger.KindSupportMessage, "passed")
	skip := addChange(t, pool, ledger.KindSupportMessage, "skip")
	fail := addChange(t, pool, ledger.KindSupportMessage, "fail")
	ok := addChange(t, pool, ledger.KindSupportMessage, "ok")
	runFor(t, r, "every change recorded", func() bool { return deliveries(t, pool)[ok].State == relay.Delivered })

	got := deliveries(t, pool)
	if d, found := got[passed]; found {
		t.Errorf("a change Takes refused has a delivery: %+v", d)
	}
	if got[skip].State != relay.Skipped || got[fail].State != relay.Dead {
		t.Fatalf("skip %s, fail %s: want skipped, dead", got[skip].State, got[fail].State)
	}
	for id, want := range map[int64]bool{skip: false, fail: true, ok: false} {
		var kept bool
		if err := pool.QueryRow(context.Background(),
			`SELECT change <> '{}'::jsonb FROM relay_deliveries WHERE consumer = 'test' AND change_id = $1`, id).Scan(&kept); err != nil {
			t.Fatal(err)
		}
		if kept != want {
			t.Errorf("change %d (%s): copy kept %v, want %v", id, got[id].State, kept, want)
		}
	}
	if log := dest.log(); slices.Contains(log, fmt.Sprintf("passed/%d", passed)) {
		t.Errorf("attempts %v: the refused change was sent", log)
	}
}
