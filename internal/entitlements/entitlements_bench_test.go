package entitlements

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// The guarded upsert against a real Postgres (TEST_DATABASE_URL, or a
// throwaway server started by TestMain, like the tests). One op is one statement, one round trip.

// benchSubscription is the bundled fixture's subscription: one monthly
// item, as most first deliveries carry.
func benchSubscription(sub string) Subscription {
	return Subscription{
		ID:               sub,
		CustomerID:       "cus_QmunchableCust01",
		Status:           "active",
		PriceID:          "price_1QmunchableMonthly",
		CurrentPeriodEnd: time.Unix(1767182400, 0).UTC(),
		Metadata:         map[string]string{},
		Items: []Item{{ID: "si_QmunchableItem01", PriceID: "price_1QmunchableMonthly", ProductID: "prod_QmunchablePlan",
			Quantity: qty(1), CurrentPeriodStart: time.Unix(1764590400, 0).UTC(), CurrentPeriodEnd: time.Unix(1767182400, 0).UTC()}},
	}
}

// BenchmarkApplyNew: every op inserts a new subscription, as a first
// delivery of a new subscription does.
func BenchmarkApplyNew(b *testing.B) {
	s := NewStore(dbtest.NewPool(b), prometheus.NewRegistry())
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		id := strconv.Itoa(i)
		res, err := s.ApplySubscription(ctx, benchSubscription("sub_new_"+id), Event{ID: "evt_new_" + id, Created: t0}, nil)
		if err != nil || res.Verdict != Applied {
			b.Fatalf("apply = %+v, %v", res, err)
		}
	}
}

// BenchmarkApplyNewer: every op is a newer event for the same
// subscription, so the guard passes and the row is updated.
func BenchmarkApplyNewer(b *testing.B) {
	s := NewStore(dbtest.NewPool(b), prometheus.NewRegistry())
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		res, err := s.ApplySubscription(ctx, benchSubscription("sub_newer"), Event{ID: "evt_newer_" + strconv.Itoa(i), Created: t0.Add(time.Duration(i) * time.Second)}, nil)
		if err != nil || res.Verdict != Applied {
			b.Fatalf("apply = %+v, %v", res, err)
		}
	}
}

// BenchmarkApplyStale: every op is an event older than the stored one, so
// the guard refuses it and nothing is written.
func BenchmarkApplyStale(b *testing.B) {
	s := NewStore(dbtest.NewPool(b), prometheus.NewRegistry())
	ctx := b.Context()
	if _, err := s.ApplySubscription(ctx, benchSubscription("sub_stale"), Event{ID: "evt_latest", Created: t0.Add(time.Hour)}, nil); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.ApplySubscription(ctx, benchSubscription("sub_stale"), Event{ID: "evt_old", Created: t0}, nil)
		if err != nil || res.Verdict != Stale {
			b.Fatalf("apply = %+v, %v", res, err)
		}
	}
}
