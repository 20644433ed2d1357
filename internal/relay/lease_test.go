package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/leader"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// TestRelayUnderTakenLease runs the relay as serve does, under a lease and
// its fence, and has another replica take the lease over while a send is
// in flight: the send's result is not recorded, and the run ends with the
// lease lost. The next holder sends the change again (same identity) and
// records it.
func TestRelayUnderTakenLease(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	r := newRig(t, pool, fast)
	inFlight, resume := make(chan struct{}), make(chan struct{})
	r.dest.set("frozen", func(attempt int) error {
		if attempt == 1 {
			close(inFlight)
			<-resume
		}
		return nil
	})
	lease := leader.NewLease(pool, "relay", leader.LeaseConfig{TTL: 20 * time.Second, Holder: "first"})
	done := make(chan error, 1)
	go func() {
		_, err := lease.TryRun(ctx, func(ctx context.Context, f leader.Fence) error {
			return r.relay.Run(ctx, f.Check)
		})
		done <- err
	}()
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	id := addChange(t, pool, ledger.KindSupportMessage, "frozen")
	<-inFlight
	// What a takeover after the first holder's expiry leaves in the row:
	// the next token, another holder.
	if _, err := pool.Exec(ctx, `UPDATE leader_leases SET holder = 'second', token = token + 1,
		expires_at = statement_timestamp() + interval '20 seconds' WHERE name = 'relay'`); err != nil {
		t.Fatal(err)
	}
	close(resume)
	err := <-done
	if !errors.Is(err, relay.ErrFenced) || !errors.Is(err, leader.ErrLost) {
		t.Fatalf("the first holder's run = %v, want ErrFenced wrapping leader.ErrLost", err)
	}
	if d := deliveries(t, pool)[id]; d.State == relay.Delivered {
		t.Fatalf("the first holder recorded its send after losing the lease: %+v", d)
	}

	if _, err := pool.Exec(ctx, `UPDATE leader_leases SET expires_at = statement_timestamp() WHERE name = 'relay'`); err != nil {
		t.Fatal(err)
	}
	next := leader.NewLease(pool, "relay", leader.LeaseConfig{TTL: 20 * time.Second, Holder: "third"})
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() {
		_, _ = next.TryRun(runCtx, func(ctx context.Context, f leader.Fence) error {
			return r.relay.Run(ctx, f.Check)
		})
	}()
	waitState(t, pool, id, relay.Delivered)
	if got := r.dest.log(); len(got) != 2 {
		t.Errorf("attempts %v, want 2 (the one not recorded, then the next holder's)", got)
	}
}
