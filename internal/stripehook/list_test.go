package stripehook

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// A rate-limited page is asked again after a back-off (stripe-go does not
// retry a 429), and the back-off ends with the caller's context: in the
// service that is the delivery's deadline.
func TestListerRateLimit(t *testing.T) {
	t.Parallel()
	fake, api := stripeAPI(t)
	fx := stripetest.LoadFixtures(t)
	fake.SetActiveEntitlements("cus_1", fx.ActiveEntitlement("ent_1", "feat_1", "sso"), fx.ActiveEntitlement("ent_2", "feat_2", "api"))

	fake.FailNext(1, http.StatusTooManyRequests)
	l := NewLister(api)
	keys, err := l.LookupKeys(t.Context(), "cus_1")
	if err != nil {
		t.Fatalf("one 429, then the list: %v", err)
	}
	if d := cmp.Diff([]string{"sso", "api"}, keys); d != "" {
		t.Errorf("lookup keys (-want +got):\n%s", d)
	}
	if got, want := l.Requests(), 2; got != want {
		t.Errorf("requests = %d, want %d (the 429 and the page)", got, want)
	}
	if l.TakenAt().IsZero() {
		t.Error("no clock read from the answer")
	}

	fake.FailNext(10, http.StatusTooManyRequests)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	l = NewLister(api)
	if _, err := l.LookupKeys(ctx, "cus_1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("rate limited past the caller's deadline: err = %v, want the deadline", err)
	}
	if got := l.Requests(); got != 1 {
		t.Errorf("requests = %d, want 1: the back-off outlasted the deadline", got)
	}
}
