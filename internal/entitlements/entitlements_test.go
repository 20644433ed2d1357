package entitlements

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

type step struct {
	status     string
	id         string
	at         time.Duration // after t0
	prevStatus string
	applied    bool
}

type stored struct {
	Status      string
	LastEventID string
}

func get(t *testing.T, pool *pgxpool.Pool, sub string) stored {
	t.Helper()
	var s stored
	err := pool.QueryRow(context.Background(),
		`SELECT status, last_event_id FROM entitlements WHERE stripe_subscription_id = $1`, sub).
		Scan(&s.Status, &s.LastEventID)
	if err != nil {
		t.Fatalf("read entitlement %s: %v", sub, err)
	}
	return s
}

// TestGuard plays sequences of events, in arrival order, through the one
// guarded statement and checks which it applied and what is left.
func TestGuard(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	tests := []struct {
		name  string
		steps []step
		want  stored
	}{
		{"newer replaces older", []step{
			{"incomplete", "evt_1", 0, "", true},
			{"active", "evt_2", time.Second, "incomplete", true},
		}, stored{"active", "evt_2"}},
		{"older after newer changes nothing", []step{
			{"active", "evt_2", 10 * time.Second, "incomplete", true},
			{"incomplete", "evt_1", 0, "", false},
		}, stored{"active", "evt_2"}},
		{"same second, successor second", []step{
			{"incomplete", "evt_1", 0, "", true},
			{"active", "evt_2", 0, "incomplete", true},
		}, stored{"active", "evt_2"}},
		{"same second, successor first", []step{
			{"active", "evt_2", 0, "incomplete", true},
			{"incomplete", "evt_1", 0, "", false},
		}, stored{"active", "evt_2"}},
		{"same second, three in a chain arriving backwards", []step{
			{"past_due", "evt_3", 0, "active", true},
			{"active", "evt_2", 0, "incomplete", false},
			{"incomplete", "evt_1", 0, "", false},
		}, stored{"past_due", "evt_3"}},
		{"same second, not a successor", []step{
			{"active", "evt_1", 0, "incomplete", true},
			{"trialing", "evt_2", 0, "", false},
		}, stored{"active", "evt_1"}},
		{"canceled is absorbing, even for a newer event", []step{
			{"canceled", "evt_9", 0, "active", true},
			{"active", "evt_10", time.Hour, "past_due", false},
		}, stored{"canceled", "evt_9"}},
		{"canceled is absorbing on a same-second successor", []step{
			{"canceled", "evt_9", 0, "active", true},
			{"active", "evt_10", 0, "canceled", false},
		}, stored{"canceled", "evt_9"}},
		{"incomplete_expired is absorbing", []step{
			{"incomplete_expired", "evt_5", 0, "incomplete", true},
			{"active", "evt_6", time.Minute, "incomplete", false},
		}, stored{"incomplete_expired", "evt_5"}},
		{"the same event again is a harmless rewrite", []step{
			{"canceled", "evt_7", 0, "active", true},
			{"canceled", "evt_7", 0, "active", true},
		}, stored{"canceled", "evt_7"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := NewStore(pool, reg)
			sub := fmt.Sprintf("sub_guard_%d", i)
			refused := 0
			for j, st := range tt.steps {
				applied, err := s.Apply(t.Context(),
					Entitlement{SubscriptionID: sub, CustomerID: "cus_1", Status: st.status},
					Event{ID: st.id, Created: t0.Add(st.at), PreviousStatus: st.prevStatus})
				if err != nil {
					t.Fatal(err)
				}
				if applied != st.applied {
					t.Errorf("step %d (%s %s): applied = %v, want %v", j, st.id, st.status, applied, st.applied)
				}
				if !applied {
					refused++
				}
			}
			if diff := cmp.Diff(tt.want, get(t, pool, sub)); diff != "" {
				t.Errorf("stored (-want +got):\n%s", diff)
			}
			if got := testutil.ToFloat64(s.stale); got != float64(refused) {
				t.Errorf("entitlements_stale_events_total = %v, want %d", got, refused)
			}
		})
	}
}

func TestApplyStoresFields(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ent := Entitlement{SubscriptionID: "sub_f", CustomerID: "cus_f", Status: "active", PriceID: "price_1", CurrentPeriodEnd: end, CancelAtPeriodEnd: true}
	if _, err := s.Apply(t.Context(), ent, Event{ID: "evt_f", Created: t0}); err != nil {
		t.Fatal(err)
	}
	var got Entitlement
	var created time.Time
	err := pool.QueryRow(t.Context(), `
		SELECT stripe_subscription_id, stripe_customer_id, status, price_id, current_period_end, cancel_at_period_end, last_event_created
		FROM entitlements`).Scan(&got.SubscriptionID, &got.CustomerID, &got.Status, &got.PriceID, &got.CurrentPeriodEnd, &got.CancelAtPeriodEnd, &created)
	if err != nil {
		t.Fatal(err)
	}
	got.CurrentPeriodEnd = got.CurrentPeriodEnd.UTC()
	if diff := cmp.Diff(ent, got); diff != "" {
		t.Errorf("stored entitlement (-want +got):\n%s", diff)
	}
	if !created.Equal(t0) {
		t.Errorf("last_event_created = %s, want %s", created, t0)
	}

	// Unknown price and period are stored as NULL, not as zero values.
	if _, err := s.Apply(t.Context(), Entitlement{SubscriptionID: "sub_n", CustomerID: "cus_n", Status: "incomplete"}, Event{ID: "evt_n", Created: t0}); err != nil {
		t.Fatal(err)
	}
	var nulls bool
	if err := pool.QueryRow(t.Context(), `SELECT price_id IS NULL AND current_period_end IS NULL FROM entitlements WHERE stripe_subscription_id = 'sub_n'`).Scan(&nulls); err != nil || !nulls {
		t.Errorf("price_id and current_period_end NULL = %v (%v), want true", nulls, err)
	}
}

// Like every constructor, NewStore takes a nil registerer as "no metrics":
// the stale counter still counts, nothing panics.
func TestNilRegisterer(t *testing.T) {
	t.Parallel()
	s := NewStore(dbtest.NewPool(t), nil)
	ent := Entitlement{SubscriptionID: "sub_r", CustomerID: "cus_r", Status: "active"}
	if _, err := s.Apply(t.Context(), ent, Event{ID: "evt_2", Created: t0.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if applied, err := s.Apply(t.Context(), ent, Event{ID: "evt_1", Created: t0}); err != nil || applied {
		t.Fatalf("older event = %v, %v; want refused", applied, err)
	}
	if got := testutil.ToFloat64(s.stale); got != 1 {
		t.Errorf("stale = %v, want 1", got)
	}
}

// The guard is one statement: however concurrent deliveries interleave,
// the newest event wins.
func TestApplyConcurrentNewestWins(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := s.Apply(t.Context(),
				Entitlement{SubscriptionID: "sub_c", CustomerID: "cus_c", Status: fmt.Sprintf("status_%02d", i)},
				Event{ID: fmt.Sprintf("evt_%02d", i), Created: t0.Add(time.Duration(i) * time.Second)})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := stored{Status: fmt.Sprintf("status_%02d", n-1), LastEventID: fmt.Sprintf("evt_%02d", n-1)}
	if diff := cmp.Diff(want, get(t, pool, "sub_c")); diff != "" {
		t.Errorf("after %d concurrent events (-want +got):\n%s", n, diff)
	}
}
