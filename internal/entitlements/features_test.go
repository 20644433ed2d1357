package entitlements

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

type featureRow struct {
	Keys     []string
	Complete bool
	EventID  string
}

func readFeatures(t *testing.T, pool *pgxpool.Pool, customer string) featureRow {
	t.Helper()
	var r featureRow
	err := pool.QueryRow(t.Context(), `SELECT lookup_keys, complete, last_event_id FROM customer_features WHERE stripe_customer_id = $1`, customer).
		Scan(&r.Keys, &r.Complete, &r.EventID)
	if err != nil {
		t.Fatalf("read features of %s: %v", customer, err)
	}
	return r
}

func TestFeatures(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	apply := func(keys []string, ev FeatureEvent, list ListFeatures) Result {
		t.Helper()
		res, err := s.ApplyFeatures(ctx, Features{CustomerID: "cus_f", LookupKeys: keys, Complete: true}, ev, list)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Stored sorted and distinct.
	if r := apply([]string{"exports", "api", "exports"}, FeatureEvent{ID: "evt_1", Created: t0}, nil); r.Verdict != Applied {
		t.Fatalf("first = %+v", r)
	}
	if got, want := readFeatures(t, pool, "cus_f"), (featureRow{[]string{"api", "exports"}, true, "evt_1"}); !cmp.Equal(got, want) {
		t.Errorf("stored %+v, want %+v", got, want)
	}
	// Older: kept out.
	if r := apply([]string{"api"}, FeatureEvent{ID: "evt_0", Created: t0.Add(-time.Second)}, nil); r.Verdict != Stale {
		t.Errorf("older = %+v, want stale", r)
	}
	// Same second, successor: previous_attributes holds the stored list.
	if r := apply([]string{"api", "exports", "sso"}, FeatureEvent{ID: "evt_2", Created: t0, Previous: []string{"exports", "api"}, HasPrevious: true}, nil); r.Verdict != Applied {
		t.Errorf("successor = %+v, want applied", r)
	}
	// Same second, not a successor, offline: kept and counted.
	if r := apply([]string{"api"}, FeatureEvent{ID: "evt_3", Created: t0, Previous: []string{"api", "exports"}, HasPrevious: true}, nil); r.Verdict != Unordered || r.StoredEventID != "evt_2" {
		t.Errorf("unordered = %+v, want unordered over evt_2", r)
	}
	if n := testutil.ToFloat64(s.unordered); n != 1 {
		t.Errorf("entitlements_unordered_events_total = %v, want 1", n)
	}
	if got := readFeatures(t, pool, "cus_f"); got.EventID != "evt_2" || len(got.Keys) != 3 {
		t.Errorf("after an unordered event: %+v", got)
	}
	// The same, with the API: the customer's listed entitlements land.
	list := func(_ context.Context, customer string) ([]string, error) {
		return []string{"sso", "api"}, nil
	}
	if r := apply([]string{"api"}, FeatureEvent{ID: "evt_4", Created: t0}, list); r.Verdict != Revalidated {
		t.Errorf("with the API = %+v, want revalidated", r)
	}
	if got, want := readFeatures(t, pool, "cus_f"), (featureRow{[]string{"api", "sso"}, true, "api:evt_4"}); !cmp.Equal(got, want) {
		t.Errorf("after revalidation %+v, want %+v", got, want)
	}
	// Truncated and not fetched: stored incomplete.
	if _, err := s.ApplyFeatures(ctx, Features{CustomerID: "cus_t", LookupKeys: []string{"a"}}, FeatureEvent{ID: "evt_t", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	if got := readFeatures(t, pool, "cus_t"); got.Complete {
		t.Error("a truncated list was stored complete")
	}
	// A snapshot (stripe sync) replaces only what is older than its second.
	if r, err := s.SnapshotFeatures(ctx, Features{CustomerID: "cus_f", LookupKeys: []string{"api"}, Complete: true}, t0.Add(300*time.Millisecond)); err != nil || r.Verdict != Stale {
		t.Errorf("snapshot of the stored event's second = %+v, %v; want stale", r, err)
	}
	if r, err := s.SnapshotFeatures(ctx, Features{CustomerID: "cus_f", LookupKeys: []string{"api"}, Complete: true}, t0.Add(time.Second)); err != nil || r.Verdict != Applied {
		t.Errorf("later snapshot = %+v, %v; want applied", r, err)
	}
	if got, want := readFeatures(t, pool, "cus_f"), (featureRow{[]string{"api"}, true, snapshotID(t0.Add(time.Second))}); !cmp.Equal(got, want) {
		t.Errorf("after the snapshot %+v, want %+v", got, want)
	}
}

type checkoutRow struct {
	Status, PaymentStatus, ClientReferenceID, EventID string
}

func TestCheckout(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	read := func(id string) checkoutRow {
		t.Helper()
		var r checkoutRow
		err := pool.QueryRow(ctx, `SELECT status, payment_status, client_reference_id, last_event_id FROM checkout_sessions WHERE stripe_checkout_session_id = $1`, id).
			Scan(&r.Status, &r.PaymentStatus, &r.ClientReferenceID, &r.EventID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cs := CheckoutSession{ID: "cs_1", ClientReferenceID: "user_42", CustomerID: "cus_1", Mode: "subscription", Status: "complete", PaymentStatus: "unpaid"}
	steps := []struct {
		name         string
		status, paid string
		id           string
		at           time.Duration
		wantApplied  bool
		want         checkoutRow
	}{
		{"completed, payment pending", "complete", "unpaid", "evt_c", 0, true, checkoutRow{"complete", "unpaid", "user_42", "evt_c"}},
		{"async payment succeeded moves payment forward", "complete", "paid", "evt_p", time.Minute, true, checkoutRow{"complete", "paid", "user_42", "evt_p"}},
		{"an older event changes nothing", "complete", "unpaid", "evt_old", -time.Minute, false, checkoutRow{"complete", "paid", "user_42", "evt_p"}},
		{"complete is terminal for status", "expired", "unpaid", "evt_x", time.Hour, true, checkoutRow{"complete", "unpaid", "user_42", "evt_x"}},
	}
	for _, st := range steps {
		c := cs
		c.Status, c.PaymentStatus = st.status, st.paid
		res, err := s.ApplyCheckout(ctx, c, Event{ID: st.id, Created: t0.Add(st.at)})
		if err != nil {
			t.Fatal(err)
		}
		if (res.Verdict == Applied) != st.wantApplied {
			t.Errorf("%s: %+v, want applied %v", st.name, res, st.wantApplied)
		}
		if got := read("cs_1"); got != st.want {
			t.Errorf("%s: stored %+v, want %+v", st.name, got, st.want)
		}
	}
	// Same second: only a step forward is admitted.
	open := CheckoutSession{ID: "cs_2", Mode: "payment", Status: "open", PaymentStatus: "unpaid"}
	if _, err := s.ApplyCheckout(ctx, open, Event{ID: "evt_o", Created: t0}); err != nil {
		t.Fatal(err)
	}
	done := open
	done.Status, done.PaymentStatus, done.ClientReferenceID = "complete", "paid", "user_7"
	if res, err := s.ApplyCheckout(ctx, done, Event{ID: "evt_d", Created: t0}); err != nil || res.Verdict != Applied {
		t.Fatalf("same-second step forward = %+v, %v", res, err)
	}
	if res, err := s.ApplyCheckout(ctx, open, Event{ID: "evt_o2", Created: t0}); err != nil || res.Verdict != Stale {
		t.Fatalf("same-second step back = %+v, %v; want stale", res, err)
	}
	if got, want := read("cs_2"), (checkoutRow{"complete", "paid", "user_7", "evt_d"}); got != want {
		t.Errorf("stored %+v, want %+v", got, want)
	}
}
