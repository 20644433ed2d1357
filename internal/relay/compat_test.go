package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// sent records every change a destination was given, in order.
type sent struct {
	mu  sync.Mutex
	ids []int64
}

func (s *sent) Deliver(_ context.Context, ch ledger.Change) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, ch.ID)
	return "200", nil
}

func (s *sent) log() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids)
}

// TestAfterThePreviousRelease: the previous release led the relay and
// took a page as it did (every change a pending row, the cursor past
// them, in one transaction), then tried one and failed; this release
// takes over. It sends each change once, the one the previous release
// had not tried and the failed one through their rows, and a newer change
// of a subject with an open row only after it.
func TestAfterThePreviousRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	dest := &sent{}
	r := New(Config{Pool: pool, Poll: 10 * time.Millisecond, Schedule: []time.Duration{time.Millisecond},
		Consumers: []Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: dest, Parallel: 4}}})
	cursors, err := r.enable(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	add := func(subject string) int64 {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO changes (at, kind, subject, after) VALUES (now(), 'support_message', $1, '{"n":1}') RETURNING id`,
			subject).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a1, b1 := add("a"), add("b")
	// The previous release's take, once both changes are below the read
	// horizon (another test's open transaction may hold it a moment).
	var page []ledger.Change
	var next ledger.Cursor
	for deadline := time.Now().Add(20 * time.Second); len(page) < 2; time.Sleep(10 * time.Millisecond) {
		if page, next, err = ledger.Read(ctx, pool, cursors["test"], 100); err != nil || time.Now().After(deadline) {
			t.Fatalf("read %d changes (%v), want 2", len(page), err)
		}
	}
	var ids []int64
	var subjects, bodies []string
	for _, ch := range page {
		body, err := marshalChange(ch)
		if err != nil {
			t.Fatal(err)
		}
		ids, subjects, bodies = append(ids, ch.ID), append(subjects, ch.Subject), append(bodies, string(body))
	}
	if _, err := pool.Exec(ctx, pendingSQL, "test", ids, subjects, subjects, bodies); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, moveSQL, "test", next.String(), fmt.Sprint(next.Floor())); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_deliveries SET state = 'failed', attempts = 1, last_error = '503', next_attempt_at = now() + interval '300 ms' WHERE change_id = $1`, b1); err != nil {
		t.Fatal(err)
	}
	a2, b2 := add("a"), add("b")

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries WHERE state = 'delivered'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 delivered; sent %v", n, dest.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := dest.log()
	if len(got) != 4 {
		t.Fatalf("sent %v, want each of %v once", got, []int64{a1, b1, a2, b2})
	}
	at := func(id int64) int { return slices.Index(got, id) }
	if at(a1) < 0 || at(b1) < 0 || at(a1) > at(a2) || at(b1) > at(b2) {
		t.Errorf("sent %v: want a1 %d before a2 %d, b1 %d before b2 %d", got, a1, a2, b1, b2)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries`).Scan(&rows); err != nil || rows != 4 {
		t.Errorf("%d rows (%v), want one a change", rows, err)
	}
}
