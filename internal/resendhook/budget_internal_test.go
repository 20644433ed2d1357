package resendhook

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

// TestHold: draws wait while others hold the budget, then give up with
// claim.ErrBusy; a draw the budget could never give is errOverBudget at
// once; shrink and release give back, so a later draw succeeds.
func TestHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newMailBudget(100)
	b.wait = 50 * time.Millisecond
	first := b.hold()
	if err := first.grow(ctx, 80); err != nil {
		t.Fatalf("first draw of 80 of 100: %v", err)
	}
	second := b.hold()
	if err := second.grow(ctx, 30); !errors.Is(err, claim.ErrBusy) {
		t.Fatalf("draw of 30 with 20 free = %v, want claim.ErrBusy", err)
	}
	if err := second.grow(ctx, 101); !errors.Is(err, errOverBudget) {
		t.Fatalf("draw of 101 of 100 = %v, want errOverBudget", err)
	}
	first.shrink(50)
	if got := b.inUse.Load(); got != 50 {
		t.Fatalf("in use after shrinking to 50: %d", got)
	}
	third := b.hold()
	if err := third.grow(ctx, 50); err != nil {
		t.Fatalf("draw of 50 with 50 free: %v", err)
	}
	done := make(chan error, 1)
	fourth := b.hold()
	fourth.b.wait = 10 * time.Second
	go func() { done <- fourth.grow(ctx, 40) }()
	first.release()
	if err := <-done; err != nil {
		t.Fatalf("a waiting draw after a release: %v", err)
	}
	third.release()
	fourth.release()
	if got := b.inUse.Load(); got != 0 {
		t.Errorf("in use after every release: %d, want 0", got)
	}
}
