package stripesync

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// TestVerifyAtOnceAfterRepair: verify run straight after --repair, within
// the same second of Stripe's clock (the Date header counts whole
// seconds), finds the rows the repair wrote in sync. It used to skip them
// as written after its listing began ("2 newer than the listing"). The
// API's clock is frozen so that both runs are in the same second.
func TestVerifyAtOnceAfterRepair(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	date := time.Now().UTC().Format(http.TimeFormat)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(r.api.URL()) },
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set("Date", date)
			return nil
		},
	}
	frozen := httptest.NewServer(proxy)
	t.Cleanup(frozen.Close)
	u := *r.api.URL()
	u.Host = frozen.Listener.Addr().String()
	r.useAPI(&u)

	base := time.Now().Add(-24 * time.Hour).Unix()
	r.api.PutSubscription(r.fx.Subscription(stripetest.Subscription{ID: "sub_at_once", Customer: "cus_at_once",
		Status: "active", PriceID: "price_basic", Created: base, PeriodEnd: base + 30*86400}))
	r.api.SetActiveEntitlements("cus_at_once", r.fx.ActiveEntitlement("ent_1", "feat_recipes", "recipes"))

	// Nothing stored: the subscription and the customer's features drift.
	n, got := r.verify(t, true)
	if n.Repaired != 2 || n.Drifted() != 2 {
		t.Fatalf("verify --repair: %s, %v; want 2 rows drifted and repaired", n, got)
	}
	n, got = r.verify(t, false)
	if len(got) != 0 || n.Newer != 0 || n.Subscriptions != 1 || n.Customers != 1 {
		t.Errorf("verify at once after --repair: %s, %v; want 1 subscription and 1 customer compared, none newer, no drift", n, got)
	}
}
