package stripesync

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// verify runs Verify and collects what it reported, as "kind id field,...".
func (r *rig) verify(t testing.TB, repair bool) (VerifyCounts, []string) {
	t.Helper()
	var got []string
	n, err := Verify(t.Context(), VerifyConfig{API: r.client, Store: r.store, Repair: repair, Logger: r.logger,
		Report: func(d Drift) {
			var fields []string
			for f := range d.Fields {
				fields = append(fields, f)
			}
			slices.Sort(fields)
			got = append(got, fmt.Sprintf("%s %s %s repaired=%t", d.Kind, d.ID, strings.Join(fields, ","), d.Repaired))
		}})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	slices.Sort(got)
	return n, got
}

func (r *rig) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := r.pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestVerifyFindsAndRepairsEachKind stores Stripe's state with a sync,
// then makes the tables drift in each way a lost webhook or a hand edit
// would: verify reports every drifted row, repair mends what Stripe can
// tell, and a second verify finds only the row Stripe has never heard of.
func TestVerifyFindsAndRepairsEachKind(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	base := time.Now().Add(-48 * time.Hour).Unix()
	for i := range 150 { // two pages
		s := stripetest.Subscription{ID: fmt.Sprintf("sub_v%03d", i), Customer: fmt.Sprintf("cus_v%03d", i), Status: "active",
			PriceID: "price_basic", Created: base + int64(i), PeriodEnd: base + 30*86400,
			More: []stripetest.Item{{ID: fmt.Sprintf("si_more%03d", i), PriceID: "price_addon", PeriodEnd: base + 30*86400}}}
		r.api.PutSubscription(r.fx.Subscription(s))
		if i%3 == 0 {
			r.api.SetActiveEntitlements(s.Customer, r.fx.ActiveEntitlement(fmt.Sprintf("ent_%d", i), "feat_recipes", "recipes"))
		}
	}
	if _, err := r.sync(t); err != nil {
		t.Fatalf("sync: %v", err)
	}
	// A second later than the sync's snapshot: rows edited "before" the
	// next listing, as a lost webhook leaves them.
	time.Sleep(time.Second)
	if n, got := r.verify(t, false); n.Drifted() != 0 || n.Subscriptions != 150 || n.Customers != 150 {
		t.Fatalf("verify after sync: %s, %v; want 150 compared and no drift", n, got)
	}

	old := time.Now().Add(-time.Hour)
	r.exec(t, `UPDATE entitlements SET status = 'past_due', last_event_created = $1 WHERE stripe_subscription_id = 'sub_v010'`, old)
	r.exec(t, `UPDATE entitlement_items SET quantity = 7 WHERE stripe_item_id = 'si_more020'`)
	r.exec(t, `DELETE FROM entitlement_items WHERE stripe_item_id = 'si_more030'`)
	r.exec(t, `DELETE FROM entitlements WHERE stripe_subscription_id = 'sub_v140'`)
	r.exec(t, `UPDATE customer_features SET lookup_keys = '{}', last_event_created = $1 WHERE stripe_customer_id = 'cus_v003'`, old)
	r.exec(t, `UPDATE customer_features SET lookup_keys = '{recipes,extra}', last_event_created = $1 WHERE stripe_customer_id = 'cus_v004'`, old)
	r.exec(t, `INSERT INTO entitlements (stripe_subscription_id, stripe_customer_id, status, cancel_at_period_end, last_event_id, last_event_created, updated_at)
		VALUES ('sub_gone', 'cus_gone', 'active', false, 'evt_gone', $1, now())`, old)
	// A customer no listed subscription names, with features Stripe says
	// it no longer has.
	r.exec(t, `INSERT INTO customer_features VALUES ('cus_orphan', '{recipes}', true, 'evt_orphan', $1, now())`, old)

	want := []string{
		"customer_features cus_orphan lookup_keys repaired=true",
		"customer_features cus_v003 lookup_keys repaired=true",
		"customer_features cus_v004 lookup_keys repaired=true",
		"subscription sub_gone exists repaired=false",
		"subscription sub_v010 status repaired=true",
		"subscription sub_v140 exists repaired=true",
		"subscription_items sub_v020 si_more020.quantity repaired=true",
		"subscription_items sub_v030 si_more030 repaired=true",
	}
	n, got := r.verify(t, false)
	report := func(s []string) []string {
		out := slices.Clone(s)
		for i := range out {
			out[i] = strings.Replace(out[i], "repaired=true", "repaired=false", 1)
		}
		return out
	}
	if diff := cmp.Diff(report(want), got); diff != "" {
		t.Errorf("verify (-want +got):\n%s", diff)
	}
	if n.Drifted() != 8 || n.Drift[KindSubscription] != 3 || n.Drift[KindSubscriptionItem] != 2 || n.Drift[KindCustomerFeatures] != 3 || n.Repaired != 0 {
		t.Errorf("counts = %s", n)
	}

	n, got = r.verify(t, true)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("verify --repair (-want +got):\n%s", diff)
	}
	if n.Repaired != 7 {
		t.Errorf("repaired = %d, want 7: %s", n.Repaired, n)
	}
	time.Sleep(time.Second) // the repair's snapshot second is past
	if _, got = r.verify(t, false); !slices.Equal(got, []string{"subscription sub_gone exists repaired=false"}) {
		t.Errorf("verify after repair = %v, want only the row Stripe does not list", got)
	}
}

// TestVerifyKeepsWebhookMidListing: a webhook that lands while verify is
// listing carries a state newer than the page verify already holds: it is
// no drift, and --repair keeps it.
func TestVerifyKeepsWebhookMidListing(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	base := time.Now().Add(-24 * time.Hour).Unix()
	sub := func(i int, price string) stripetest.Subscription {
		return stripetest.Subscription{ID: fmt.Sprintf("sub_mid%03d", i), Customer: fmt.Sprintf("cus_mid%03d", i), Status: "active",
			PriceID: price, Created: base + int64(i), PeriodEnd: base + 30*86400}
	}
	for i := range 150 {
		r.api.PutSubscription(r.fx.Subscription(sub(i, "price_basic")))
	}
	if _, err := r.sync(t); err != nil {
		t.Fatalf("sync: %v", err)
	}
	time.Sleep(time.Second)
	// Stripe lists newest first: sub_mid020 is on the second page. Just
	// before that page is served it is upgraded and its webhook lands,
	// while the page still carries the state from before (read a moment
	// before the change, as in TestStripeSync): verify holds an older
	// state than the stored one.
	upgraded := sub(20, "price_pro")
	before := r.api.Calls(stripetest.ListSubscriptions)
	r.api.OnCall(func(route string, n int) {
		if route == stripetest.ListSubscriptions && n == before+2 {
			r.deliver(t, r.fx.Event("evt_mid", "customer.subscription.updated", time.Now().Unix(), r.fx.Subscription(upgraded),
				map[string]any{"items": map[string]any{}}))
		}
	})
	n, got := r.verify(t, true)
	if len(got) != 0 {
		t.Errorf("verify --repair reported %v, want nothing", got)
	}
	if n.Newer == 0 {
		t.Errorf("counts = %s, want the webhook's row counted newer", n)
	}
	if row := r.rows(t)[upgraded.ID]; row.PriceID != "price_pro" || row.LastEventID != "evt_mid" {
		t.Errorf("%s = %+v, want the webhook's price_pro kept", upgraded.ID, row)
	}
}

// TestVerifyLarge verifies 10,000 subscriptions against the fake, and
// reports time and peak heap: memory is one page, not the account.
func TestVerifyLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 subscriptions: not in -short")
	}
	r := newRig(t)
	base := time.Now().Add(-24 * time.Hour).Unix()
	const total = 10_000
	for i := range total {
		r.api.PutSubscription(r.fx.Subscription(stripetest.Subscription{ID: fmt.Sprintf("sub_big%05d", i), Customer: fmt.Sprintf("cus_big%05d", i),
			Status: "active", PriceID: "price_basic", Created: base + int64(i), PeriodEnd: base + 30*86400}))
	}
	if _, err := r.sync(t); err != nil {
		t.Fatalf("sync: %v", err)
	}
	time.Sleep(time.Second)
	r.exec(t, `UPDATE entitlements SET status = 'past_due', last_event_created = now() - interval '1 hour' WHERE stripe_subscription_id LIKE 'sub_big000%'`)
	peak := watchHeap(t)
	heapBase := peak()
	start := time.Now()
	n, got := r.verify(t, false)
	elapsed := time.Since(start)
	if n.Subscriptions != total || len(got) != 100 {
		t.Fatalf("verify: %s, %d reported; want %d compared, 100 drifted", n, len(got), total)
	}
	// The heap holds the fake API's 10,000 subscriptions too: the base is
	// what was in use before verify began.
	t.Logf("verify of %d subscriptions: %s, peak live heap %.1f MiB (before verify %.1f MiB), %d API requests",
		total, elapsed.Round(time.Millisecond), float64(peak())/(1<<20), float64(heapBase)/(1<<20), n.Requests)
}

// watchHeap samples the live heap (runtime/metrics /gc/heap/live:bytes:
// what the last GC found reachable, without the garbage awaiting the next
// one, which GOGC lets grow to the live heap's size) every 10 ms until the
// test ends; the returned function reads the peak so far.
func watchHeap(t testing.TB) func() uint64 {
	t.Helper()
	runtime.GC()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	live := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	var mu sync.Mutex
	peak := live()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() { // ends when the test does
		defer close(stopped)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			v := live()
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return func() uint64 { mu.Lock(); defer mu.Unlock(); return peak }
}
