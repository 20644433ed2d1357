package stripehook

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// corpusVersions are the API versions the corpus has an event of, each
// built from Stripe's fixtures of that version (testdata/stripe/README.md
// names the commit of each): the versions docs/STRIPE.md says are read.
var corpusVersions = []struct{ version, tag string }{
	{"2024-06-20", "2406"},
	{"2024-09-30.acacia", "2409"},
	{"2025-03-31.basil", "2503"},
	{"2025-09-30.clover", "2509"},
	{"2026-03-25.dahlia", "2603"},
	{"2026-07-29.dahlia", "2607"},
}

// TestCorpusVersions delivers the same change (a monthly subscription set
// to cancel at period end) as Stripe renders it in each version: every
// version stores the same row and item, the period on the item whether
// the version put it there or on the subscription, and each delivery is
// counted by its version.
func TestCorpusVersions(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	for _, v := range corpusVersions {
		t.Run(v.version, func(t *testing.T) {
			assertAnswer(t, h.post(t, corpus(t, "customer.subscription.updated.api_"+v.version+".json"), time.Now()), 200, "first")
			got, items := h.subscription(t, "sub_1QmunchableApi"+v.tag)
			want := storedSubscription{Customer: "cus_QmunchableCust03", Status: "active", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(31)), CancelAtPeriodEnd: true, AccessEndsAt: at(day(31)), Livemode: ptr(false),
				Metadata: map[string]string{}, LastEventID: "evt_1QmunchableApi" + v.tag}
			wantItems := []storedItem{{ID: "si_QmunchableApi" + v.tag, PriceID: "price_1QmunchableMonthly", ProductID: ptr("prod_QmunchablePlan"),
				LookupKey: ptr("base_monthly"), Quantity: ptr[int64](1), Start: at(corpusStart), End: at(day(31))}}
			if d := cmp.Diff(want, got, timeUTC); d != "" {
				t.Errorf("entitlements row (-want +got):\n%s", d)
			}
			if d := cmp.Diff(wantItems, items, timeUTC); d != "" {
				t.Errorf("entitlement_items (-want +got):\n%s", d)
			}
			if n := h.metric(t, "webhook_stripe_api_version_total", "api_version", v.version); n != 1 {
				t.Errorf("webhook_stripe_api_version_total{api_version=%q} = %v, want 1", v.version, n)
			}
		})
	}
}

func TestVersionLabel(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"2024-06-20", "2024-06-20"},
		{"2025-03-31.basil", "2025-03-31.basil"},
		{"2027-01-27.elderberry", "2027-01-27.elderberry"},
		{"", "other"},
		{"2024-06-2", "other"},
		{"2024/06/20", "other"},
		{"2025-03-31.", "other"},
		{"2025-03-31.Basil", "other"},
		{"2025-03-31.basil; drop", "other"},
		{"2025-03-31.basilbasilbasilbasilbasil", "other"},
		{"x025-03-31", "other"},
	}
	for _, tt := range tests {
		if got := versionLabel(tt.in); got != tt.want {
			t.Errorf("versionLabel(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
