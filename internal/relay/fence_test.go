package relay

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// TestDueChecksTheFence: a replica whose fence fails (it no longer leads)
// sends none of its consumer's due deliveries, and records nothing; one
// that leads sends them.
func TestDueChecksTheFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	dest := &sent{}
	c := Consumer{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: dest}
	r := New(Config{Pool: pool, Schedule: []time.Duration{time.Millisecond}, Consumers: []Consumer{c}})
	if _, err := r.enable(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var ch ledger.Change
	if err := pool.QueryRow(ctx, `INSERT INTO changes (at, kind, subject, after) VALUES (now(), 'support_message', 'due', '{"n":1}')
RETURNING id, at, kind, subject`).Scan(&ch.ID, &ch.At, &ch.Kind, &ch.Subject); err != nil {
		t.Fatal(err)
	}
	body, err := marshalChange(ch)
	if err != nil {
		t.Fatal(err)
	}
	// A failed delivery, due again.
	if _, err := pool.Exec(ctx, pendingSQL, "test", []int64{ch.ID}, []string{"due"}, []string{"due"}, []string{string(body)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relay_deliveries SET state = 'failed', attempts = 1, last_error = '503',
next_attempt_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}

	deposed := errors.New("the lease is another replica's")
	n, err := r.deliverDue(ctx, func(context.Context, pgx.Tx) error { return deposed }, c)
	if !errors.Is(err, ErrFenced) || !errors.Is(err, deposed) {
		t.Errorf("deliverDue with a failing fence: %v, want ErrFenced", err)
	}
	if got := dest.log(); n != 0 || len(got) != 0 {
		t.Fatalf("a deposed leader started %d and sent %v, want none", n, got)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT attempts FROM relay_deliveries`).Scan(&attempts); err != nil || attempts != 1 {
		t.Errorf("attempts %d (%v) after a fenced pass, want 1", attempts, err)
	}

	if n, err := r.deliverDue(ctx, nil, c); err != nil || n != 1 {
		t.Fatalf("deliverDue leading: %d started (%v), want 1", n, err)
	}
	if got, want := dest.log(), []int64{ch.ID}; !slices.Equal(got, want) {
		t.Errorf("leading, sent %v, want %v", got, want)
	}
}
