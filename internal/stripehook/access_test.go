package stripehook

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCustomerAccessView delivers the corpus's real payloads (see
// testdata/stripe/README.md) and reads the app's one access query,
// customer_access, against what each payload says.
func TestCustomerAccessView(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	for _, f := range []string{
		"customer.subscription.updated.mixed_interval.json",
		"customer.subscription.created.trial.json",
		"customer.subscription.updated.cancel_at.json",
		"customer.subscription.updated.pause_collection.json",
		"customer.subscription.created.accounts_v2.json",
		"customer.subscription.updated.2024-06-20.json",
		"checkout.session.completed.json",
		"checkout.session.expired.json",
		"entitlements.active_entitlement_summary.updated.json",
	} {
		assertAnswer(t, h.post(t, corpus(t, f), time.Now()), 200, "first")
	}
	type access struct {
		Customer, Subscription, Status string
		ClientReferenceID              *string
		HasAccess                      bool
		AccessEndsAt                   *time.Time
		PriceLookupKeys, Features      []string
	}
	rows, err := h.pool.Query(t.Context(), `
SELECT stripe_customer_id, stripe_subscription_id, status, client_reference_id, has_access,
       access_ends_at, price_lookup_keys, features
FROM customer_access ORDER BY stripe_subscription_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []access
	for rows.Next() {
		var a access
		if err := rows.Scan(&a.Customer, &a.Subscription, &a.Status, &a.ClientReferenceID, &a.HasAccess,
			&a.AccessEndsAt, &a.PriceLookupKeys, &a.Features); err != nil {
			t.Fatal(err)
		}
		got = append(got, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// has_access is computed when the view is read: a subscription whose
	// access_ends_at has passed has none, without any event.
	hasAccess := func(status string, ends *time.Time) bool {
		return (status == "active" || status == "trialing") && (ends == nil || ends.After(time.Now()))
	}
	features := []string{"api_access", "exports", "sso"} // sorted, as stored
	base := []string{"base_monthly"}
	want := []access{
		{"acct_1QmunchableAcct01", "sub_1QmunchableAcctV201", "active", nil, true, nil, base, []string{}},
		{"cus_QmunchableCust01", "sub_1QmunchableCancelAt01", "active", nil, hasAccess("active", at(1765454400)), at(1765454400), base, features},
		// The add-on's price has no lookup key: only the base's is listed.
		// Canceling at period end: access ends at the earliest item end.
		{"cus_QmunchableCust01", "sub_1QmunchableMixed01", "active", ptr("user_42"), hasAccess("active", at(day(31))), at(day(31)), base, features},
		{"cus_QmunchableCust02", "sub_1QmunchableOldApi01", "active", nil, true, nil, base, []string{}},
		{"cus_QmunchableCust01", "sub_1QmunchablePause01", "active", nil, true, nil, base, features},
		{"cus_QmunchableCust01", "sub_1QmunchableTrial01", "trialing", nil, true, nil, base, features},
	}
	if d := cmp.Diff(want, got, timeUTC); d != "" {
		t.Errorf("customer_access (-want +got):\n%s", d)
	}
}
