package entitlements

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func qty(n int64) *int64 { return &n }

// base is a full subscription: two items of different intervals, every
// optional field set, so that a test can change any one of them.
func base(id string) Subscription {
	return Subscription{
		ID:                id,
		CustomerID:        "cus_base",
		Status:            "active",
		PriceID:           "price_monthly",
		CurrentPeriodEnd:  t0.Add(30 * 24 * time.Hour),
		CancelAtPeriodEnd: false,
		CancelAt:          t0.Add(60 * 24 * time.Hour),
		CanceledAt:        t0.Add(-time.Hour),
		EndedAt:           time.Time{},
		TrialStart:        t0.Add(-14 * 24 * time.Hour),
		TrialEnd:          t0.Add(-24 * time.Hour),
		PauseCollection:   "",
		Livemode:          false,
		Metadata:          map[string]string{"plan": "base"},
		Items: []Item{
			{ID: "si_m", PriceID: "price_monthly", ProductID: "prod_base", PriceLookupKey: "base_monthly", Quantity: qty(1),
				CurrentPeriodStart: t0, CurrentPeriodEnd: t0.Add(30 * 24 * time.Hour)},
			{ID: "si_y", PriceID: "price_yearly_addon", ProductID: "prod_addon", Quantity: qty(2),
				CurrentPeriodStart: t0, CurrentPeriodEnd: t0.Add(365 * 24 * time.Hour)},
		},
	}
}

// read returns what is stored for a subscription, through the same reader
// the same-second rule uses.
func readStored(t *testing.T, pool *pgxpool.Pool, id string) row[Subscription] {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	st, found, err := read(t.Context(), tx, id)
	if err != nil || !found {
		t.Fatalf("read %s: found %v, %v", id, found, err)
	}
	return st
}

func TestApplyStoresEveryField(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	sub := base("sub_fields")
	sub.CancelAtPeriodEnd, sub.PauseCollection, sub.Livemode = true, "keep_as_draft", true
	res, err := s.ApplySubscription(t.Context(), sub, Event{ID: "evt_fields", Created: t0}, nil)
	if err != nil || res.Verdict != Applied {
		t.Fatalf("apply = %+v, %v", res, err)
	}
	st := readStored(t, pool, "sub_fields")
	if diff := cmp.Diff(sub, st.state); diff != "" {
		t.Errorf("stored (-want +got):\n%s", diff)
	}
	if st.eventID != "evt_fields" || !st.storedAt.Equal(t0) {
		t.Errorf("event = %s at %s, want evt_fields at %s", st.eventID, st.storedAt, t0)
	}
	var accessEnds, periodEnd time.Time
	if err := pool.QueryRow(t.Context(), `SELECT access_ends_at, current_period_end FROM entitlements`).Scan(&accessEnds, &periodEnd); err != nil {
		t.Fatal(err)
	}
	// cancel_at is set, so it decides, whatever cancel_at_period_end says.
	if !accessEnds.Equal(sub.CancelAt) {
		t.Errorf("access_ends_at = %s, want cancel_at %s", accessEnds, sub.CancelAt)
	}

	// Nothing optional: nulls, an empty item set, '{}' metadata.
	bare := Subscription{ID: "sub_bare", CustomerID: "cus_bare", Status: "incomplete"}
	if _, err := s.ApplySubscription(t.Context(), bare, Event{ID: "evt_bare", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	var nulls bool
	err = pool.QueryRow(t.Context(), `
		SELECT price_id IS NULL AND current_period_end IS NULL AND cancel_at IS NULL AND access_ends_at IS NULL
		   AND pause_collection IS NULL AND metadata = '{}'::jsonb
		   AND NOT EXISTS (SELECT FROM entitlement_items WHERE stripe_subscription_id = 'sub_bare')
		FROM entitlements WHERE stripe_subscription_id = 'sub_bare'`).Scan(&nulls)
	if err != nil || !nulls {
		t.Errorf("bare row all null = %v (%v), want true", nulls, err)
	}
}

func TestAccessEndsAt(t *testing.T) {
	t.Parallel()
	end, cancelAt, ended := t0.Add(time.Hour), t0.Add(2*time.Hour), t0.Add(3*time.Hour)
	tests := []struct {
		name string
		sub  Subscription
		want time.Time
	}{
		{"renews", Subscription{CurrentPeriodEnd: end}, time.Time{}},
		{"cancel at period end", Subscription{CurrentPeriodEnd: end, CancelAtPeriodEnd: true}, end},
		{"cancel_at wins over period end", Subscription{CurrentPeriodEnd: end, CancelAtPeriodEnd: true, CancelAt: cancelAt}, cancelAt},
		{"ended wins over everything", Subscription{CurrentPeriodEnd: end, CancelAt: cancelAt, EndedAt: ended}, ended},
	}
	for _, tt := range tests {
		if got := tt.sub.AccessEndsAt(); !got.Equal(tt.want) {
			t.Errorf("%s: AccessEndsAt = %s, want %s", tt.name, got, tt.want)
		}
	}
}

// The item set is replaced as a whole by an admitted event, and left alone
// by a refused one.
func TestItemsReplacedOnlyWhenAdmitted(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	first := base("sub_items")
	if _, err := s.ApplySubscription(ctx, first, Event{ID: "evt_1", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	// Newer: the yearly add-on is removed, a seat item added, the base
	// item's quantity changed.
	second := base("sub_items")
	second.Items = []Item{
		{ID: "si_seats", PriceID: "price_seats", Quantity: qty(5), CurrentPeriodStart: t0, CurrentPeriodEnd: t0.Add(24 * time.Hour)},
		{ID: "si_m", PriceID: "price_monthly", ProductID: "prod_base", Quantity: qty(3), CurrentPeriodStart: t0, CurrentPeriodEnd: t0.Add(30 * 24 * time.Hour)},
	}
	second.PriceID = "price_seats"
	if res, err := s.ApplySubscription(ctx, second, Event{ID: "evt_2", Created: t0.Add(time.Second)}, nil); err != nil || res.Verdict != Applied {
		t.Fatalf("newer = %+v, %v", res, err)
	}
	if diff := cmp.Diff(second.Items, readStored(t, pool, "sub_items").state.Items); diff != "" {
		t.Errorf("items after the newer event (-want +got):\n%s", diff)
	}
	// Older: refused, items untouched.
	if res, err := s.ApplySubscription(ctx, first, Event{ID: "evt_0", Created: t0.Add(-time.Second)}, nil); err != nil || res.Verdict != Stale {
		t.Fatalf("older = %+v, %v", res, err)
	}
	if diff := cmp.Diff(second.Items, readStored(t, pool, "sub_items").state.Items); diff != "" {
		t.Errorf("items after a stale event (-want +got):\n%s", diff)
	}
}

// TestGuard plays sequences of events through the store and checks what
// each did and what is left.
func TestGuard(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	type step struct {
		id, status string
		at         time.Duration
		creation   bool
		want       string // applied, stale, unordered
	}
	tests := []struct {
		name  string
		steps []step
		want  string // last_event_id
	}{
		{"newer replaces older", []step{{"evt_1", "incomplete", 0, true, "applied"}, {"evt_2", "active", time.Second, false, "applied"}}, "evt_2"},
		{"older after newer changes nothing", []step{{"evt_2", "active", 10 * time.Second, false, "applied"}, {"evt_1", "incomplete", 0, true, "stale"}}, "evt_2"},
		{"canceled absorbs a newer event", []step{{"evt_9", "canceled", 0, false, "applied"}, {"evt_10", "active", time.Hour, false, "stale"}}, "evt_9"},
		{"incomplete_expired absorbs", []step{{"evt_5", "incomplete_expired", 0, false, "applied"}, {"evt_6", "active", time.Minute, false, "stale"}}, "evt_5"},
		{"the same event again rewrites harmlessly", []step{{"evt_7", "canceled", 0, false, "applied"}, {"evt_7", "canceled", 0, false, "unchanged"}}, "evt_7"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore(pool, prometheus.NewRegistry())
			id := fmt.Sprintf("sub_guard_%d", i)
			for j, st := range tt.steps {
				sub := base(id)
				sub.Status = st.status
				res, err := s.ApplySubscription(t.Context(), sub, Event{ID: st.id, Created: t0.Add(st.at), Creation: st.creation}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := outcome(res); got != st.want {
					t.Errorf("step %d (%s): %s, want %s", j, st.id, got, st.want)
				}
			}
			if got := readStored(t, pool, id).eventID; got != tt.want {
				t.Errorf("stored event = %s, want %s", got, tt.want)
			}
		})
	}
}

func outcome(r Result) string {
	if r.Verdict == 0 {
		return "nothing"
	}
	return r.Verdict.String()
}

// fieldChanges changes one stored field each, named as its column: the
// same-second table runs every one of them.
var fieldChanges = []struct {
	field  Field
	change func(*Subscription)
}{
	{"stripe_customer_id", func(s *Subscription) { s.CustomerID = "acct_moved" }},
	{"status", func(s *Subscription) { s.Status = "past_due" }},
	{"price_id", func(s *Subscription) { s.PriceID = "price_upgraded"; s.Items[0].PriceID = "price_upgraded" }},
	{"current_period_end", func(s *Subscription) { s.CurrentPeriodEnd = s.CurrentPeriodEnd.Add(time.Hour) }},
	{"cancel_at_period_end", func(s *Subscription) { s.CancelAtPeriodEnd = true }},
	{"cancel_at", func(s *Subscription) { s.CancelAt = time.Time{} }},
	{"canceled_at", func(s *Subscription) { s.CanceledAt = t0 }},
	{"ended_at", func(s *Subscription) { s.EndedAt = t0 }},
	{"trial_start", func(s *Subscription) { s.TrialStart = time.Time{} }},
	{"trial_end", func(s *Subscription) { s.TrialEnd = t0.Add(time.Hour) }},
	{"pause_collection", func(s *Subscription) { s.PauseCollection = "void" }},
	{"livemode", func(s *Subscription) { s.Livemode = true }},
	{"metadata", func(s *Subscription) { s.Metadata = map[string]string{"plan": "pro"} }},
	{"items", func(s *Subscription) { s.Items[1].Quantity = qty(7) }},
}

func change(sub Subscription, f func(*Subscription)) Subscription {
	out := sub
	out.Metadata = map[string]string{}
	for k, v := range sub.Metadata {
		out.Metadata[k] = v
	}
	out.Items = append([]Item(nil), sub.Items...)
	f(&out)
	return out
}

// TestSameSecondSuccession is the same-second rule as a table, field by
// field: A is a subscription's state, B an event of the same second that
// changes one field and names it in previous_attributes. In order, B
// succeeds A and lands; out of order, A is not B's successor and B's state
// stays; a B that does not name its change, or names a wrong previous
// value, is unordered; a .created never succeeds.
func TestSameSecondSuccession(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	for i, fc := range fieldChanges {
		t.Run(string(fc.field), func(t *testing.T) {
			a := base(fmt.Sprintf("sub_tie_%d", i))
			b := change(a, fc.change)
			if d := diff(a, b); !slices.Contains(d, fc.field) {
				t.Fatalf("the change differs in %v, not in %s", d, fc.field)
			}
			beforeA := func() (Subscription, error) { return change(a, func(s *Subscription) { s.Status = "incomplete" }), nil }
			named := func() (Subscription, error) { return a, nil }   // previous_attributes names the field, with A's value
			unnamed := func() (Subscription, error) { return b, nil } // previous_attributes does not name it
			wrong := func() (Subscription, error) {                   // names it, with a value A never had
				return change(a, func(s *Subscription) { s.Status = "unpaid" }), nil
			}
			type step struct {
				sub  Subscription
				ev   Event
				want string
			}
			evA := Event{ID: "evt_a", Created: t0, Before: beforeA}
			cases := []struct {
				name      string
				steps     []step
				want      Subscription
				wantEvent string
			}{
				{"in order", []step{{a, evA, "applied"}, {b, Event{ID: "evt_b", Created: t0, Before: named}, "applied"}}, b, "evt_b"},
				{"out of order", []step{{b, Event{ID: "evt_b", Created: t0, Before: named}, "applied"}, {a, evA, "unordered"}}, b, "evt_b"},
				{"created arrives second", []step{{b, Event{ID: "evt_b", Created: t0, Before: named}, "applied"}, {a, Event{ID: "evt_a", Created: t0, Creation: true}, "stale"}}, b, "evt_b"},
				{"change not named", []step{{a, evA, "applied"}, {b, Event{ID: "evt_b", Created: t0, Before: unnamed}, "unordered"}}, a, "evt_a"},
				{"wrong previous value", []step{{a, evA, "applied"}, {b, Event{ID: "evt_b", Created: t0, Before: wrong}, "unordered"}}, a, "evt_a"},
				{"a created event never succeeds", []step{{a, evA, "applied"}, {b, Event{ID: "evt_b", Created: t0, Creation: true, Before: named}, "stale"}}, a, "evt_a"},
				{"unreadable previous_attributes", []step{{a, evA, "applied"}, {b, Event{ID: "evt_b", Created: t0, Before: func() (Subscription, error) {
					return Subscription{}, errors.New("previous_attributes: not an object")
				}}, "unordered"}}, a, "evt_a"},
				{"same state is not a change", []step{{a, evA, "applied"}, {a, Event{ID: "evt_b", Created: t0}, "unchanged"}}, a, "evt_a"},
			}
			for j, c := range cases {
				s := NewStore(pool, prometheus.NewRegistry())
				id := fmt.Sprintf("%s_%d", a.ID, j)
				unordered := 0
				for k, st := range c.steps {
					st.sub.ID = id
					res, err := s.ApplySubscription(t.Context(), st.sub, st.ev, nil)
					if err != nil {
						t.Fatal(err)
					}
					if got := outcome(res); got != st.want {
						t.Errorf("%s: step %d (%s): %s, want %s (differs %v)", c.name, k, st.ev.ID, got, st.want, res.Differs)
					}
					if res.Verdict == Unordered {
						unordered++
						if res.StoredEventID == "" || len(res.Differs) == 0 {
							t.Errorf("%s: unordered result lacks the stored event or the fields: %+v", c.name, res)
						}
					}
				}
				got := readStored(t, pool, id)
				want := c.want
				want.ID = id
				if d := cmp.Diff(want, got.state); d != "" || got.eventID != c.wantEvent {
					t.Errorf("%s: stored %s (want %s) (-want +got):\n%s", c.name, got.eventID, c.wantEvent, d)
				}
				if n := testutil.ToFloat64(s.unordered); n != float64(unordered) {
					t.Errorf("%s: entitlements_unordered_events_total = %v, want %d", c.name, n, unordered)
				}
			}
		})
	}
}

// An unordered event with an API lands the state read from Stripe, under
// a mark of the event's id.
func TestRevalidationStoresFetchedState(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	a := base("sub_reval")
	if _, err := s.ApplySubscription(ctx, a, Event{ID: "evt_a", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	fetched := change(a, func(s *Subscription) { s.Status = "past_due"; s.CancelAtPeriodEnd = true })
	b := change(a, func(s *Subscription) { s.CancelAtPeriodEnd = true })
	res, err := s.ApplySubscription(ctx, b, Event{ID: "evt_b", Created: t0}, func(_ context.Context, id string) (Subscription, error) {
		if id != "sub_reval" {
			return Subscription{}, fmt.Errorf("fetched %s", id)
		}
		return fetched, nil
	})
	if err != nil || res.Verdict != Revalidated || res.StoredEventID != "evt_a" {
		t.Fatalf("apply = %+v, %v; want revalidated over evt_a", res, err)
	}
	got := readStored(t, pool, "sub_reval")
	if d := cmp.Diff(fetched, got.state); d != "" || got.eventID != "api:evt_b" {
		t.Errorf("stored %s (-want +got):\n%s", got.eventID, d)
	}

	// The API failing fails the event, and nothing is written.
	c := change(a, func(s *Subscription) { s.TrialEnd = t0 })
	_, err = s.ApplySubscription(ctx, c, Event{ID: "evt_c", Created: t0}, func(context.Context, string) (Subscription, error) {
		return Subscription{}, errors.New("stripe: 500")
	})
	if err == nil {
		t.Fatal("an API failure was not an error")
	}
	if got := readStored(t, pool, "sub_reval"); got.eventID != "api:evt_b" {
		t.Errorf("after a failed revalidation the row is from %s, want api:evt_b", got.eventID)
	}
}

// No Postgres connection is held while Stripe answers: with a pool of one
// connection, the fetch itself can still use the pool.
func TestRevalidationHoldsNoConnection(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	a := base("sub_held")
	if _, err := s.ApplySubscription(ctx, a, Event{ID: "evt_a", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	b := change(a, func(s *Subscription) { s.CancelAtPeriodEnd = true })
	res, err := s.ApplySubscription(ctx, b, Event{ID: "evt_b", Created: t0}, func(ctx context.Context, _ string) (Subscription, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var one int
		if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			return Subscription{}, fmt.Errorf("the pool's one connection is held during the fetch: %w", err)
		}
		return b, nil
	})
	if err != nil || res.Verdict != Revalidated {
		t.Fatalf("apply = %+v, %v; want revalidated", res, err)
	}
}

// Two revalidations of one subscription may read from Stripe at once (no
// transaction is open while Stripe answers), but the later read is the one
// stored: a state read before another delivery wrote the row is judged
// again, never written over it.
func TestConcurrentRevalidationsKeepTheLastRead(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	a := base("sub_conc")
	if _, err := s.ApplySubscription(ctx, a, Event{ID: "evt_a", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int32
	fetch := func(context.Context, string) (Subscription, error) {
		time.Sleep(100 * time.Millisecond) // long enough for the other to arrive
		k := reads.Add(1)
		return change(a, func(s *Subscription) { s.Metadata = map[string]string{"read": fmt.Sprint(k)} }), nil
	}
	var wg sync.WaitGroup
	results := make([]Result, 2)
	for i := range 2 {
		wg.Go(func() {
			ev := change(a, func(s *Subscription) { s.Status = fmt.Sprintf("status_%d", i) })
			res, err := s.ApplySubscription(ctx, ev, Event{ID: fmt.Sprintf("evt_%d", i), Created: t0}, fetch)
			if err != nil {
				t.Error(err)
			}
			results[i] = res
		})
	}
	wg.Wait()
	got := readStored(t, pool, "sub_conc")
	if got.state.Metadata["read"] != fmt.Sprint(reads.Load()) {
		t.Errorf("stored read %q, want the last read %d", got.state.Metadata["read"], reads.Load())
	}
	for i, r := range results {
		if r.Verdict != Revalidated {
			t.Errorf("event %d: %+v, want revalidated", i, r)
		}
	}
}

// A snapshot replaces only what is older than the second its listing
// began; the next event of that second meets the same-second rule.
func TestSnapshotSubscription(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	taken := t0.Add(500 * time.Millisecond)

	older := base("sub_snap_older")
	if _, err := s.ApplySubscription(ctx, older, Event{ID: "evt_old", Created: t0.Add(-time.Second)}, nil); err != nil {
		t.Fatal(err)
	}
	snap := change(older, func(s *Subscription) { s.Status = "past_due" })
	if res, err := s.SnapshotSubscription(ctx, snap, taken); err != nil || res.Verdict != Applied {
		t.Fatalf("snapshot over an older event = %+v, %v", res, err)
	}
	got := readStored(t, pool, "sub_snap_older")
	if got.state.Status != "past_due" || got.eventID != "snapshot:2026-11-01T12:00:00Z" || !got.storedAt.Equal(t0) {
		t.Errorf("after snapshot: %s from %s at %s", got.state.Status, got.eventID, got.storedAt)
	}

	tied := base("sub_snap_tied")
	if _, err := s.ApplySubscription(ctx, tied, Event{ID: "evt_tied", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := s.SnapshotSubscription(ctx, change(tied, func(s *Subscription) { s.Status = "past_due" }), taken); err != nil || res.Verdict != Stale {
		t.Fatalf("snapshot over an event of its second = %+v, %v; want stale", res, err)
	}
	if got := readStored(t, pool, "sub_snap_tied"); got.eventID != "evt_tied" || got.state.Status != "active" {
		t.Errorf("the tied event was replaced: %s %s", got.eventID, got.state.Status)
	}

	// A new subscription the webhooks never saw is inserted.
	if res, err := s.SnapshotSubscription(ctx, base("sub_snap_new"), taken); err != nil || res.Verdict != Applied {
		t.Fatalf("snapshot of a new subscription = %+v, %v", res, err)
	}
}

// Two listings begun in the same second (stripe sync beside stripe verify
// --repair) share a snapshot id but not a state: the later write replaces
// the earlier one's, except that a canceled row stays canceled, whatever a
// listing that read the subscription before it was canceled says.
func TestSameSecondSnapshots(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	for _, tc := range []struct {
		name         string
		first, later func(*Subscription)
		want         string
		verdict      Verdict
	}{
		{"canceled, then an earlier read", func(s *Subscription) { s.Status = "canceled" }, func(*Subscription) {}, "canceled", Stale},
		{"an earlier read, then canceled", func(*Subscription) {}, func(s *Subscription) { s.Status = "canceled" }, "canceled", Applied},
		{"past_due, then active", func(s *Subscription) { s.Status = "past_due" }, func(*Subscription) {}, "active", Applied},
	} {
		id := "sub_two_snaps_" + strings.ReplaceAll(tc.name, " ", "_")
		a := base(id)
		if _, err := s.ApplySubscription(ctx, a, Event{ID: "evt_a", Created: t0.Add(-time.Hour)}, nil); err != nil {
			t.Fatal(err)
		}
		if res, err := s.SnapshotSubscription(ctx, change(a, tc.first), t0.Add(100*time.Millisecond)); err != nil || res.Verdict != Applied {
			t.Fatalf("%s: first snapshot = %+v, %v; want applied", tc.name, res, err)
		}
		res, err := s.SnapshotSubscription(ctx, change(a, tc.later), t0.Add(900*time.Millisecond))
		if err != nil || res.Verdict != tc.verdict {
			t.Errorf("%s: later snapshot = %+v, %v; want %s", tc.name, res, err, tc.verdict)
		}
		if got := readStored(t, pool, id); got.state.Status != tc.want {
			t.Errorf("%s: stored %s, want %s", tc.name, got.state.Status, tc.want)
		}
	}
}

// A redelivery of an event that was settled by asking Stripe (Redis down,
// a done key lost, a replay further back than the dedupe TTL) must not put
// the event's own state back over Stripe's: here Stripe said canceled.
func TestRedeliveryAfterRevalidation(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	a := base("sub_redeliver")
	if _, err := s.ApplySubscription(ctx, a, Event{ID: "evt_a", Created: t0}, nil); err != nil {
		t.Fatal(err)
	}
	canceled := change(a, func(s *Subscription) { s.Status = "canceled" })
	b := change(a, func(s *Subscription) { s.CancelAtPeriodEnd = true })
	fetch := func(context.Context, string) (Subscription, error) { return canceled, nil }
	if res, err := s.ApplySubscription(ctx, b, Event{ID: "evt_b", Created: t0}, fetch); err != nil || res.Verdict != Revalidated {
		t.Fatalf("first delivery = %+v, %v; want revalidated", res, err)
	}
	for _, fetch := range []Fetch{nil, fetch} {
		res, err := s.ApplySubscription(ctx, b, Event{ID: "evt_b", Created: t0}, fetch)
		if err != nil || res.Verdict == Applied || res.Verdict == Unchanged || res.Verdict == Revalidated {
			t.Errorf("redelivery (fetch %v) = %+v, %v; want neither applied, unchanged nor revalidated", fetch != nil, res, err)
		}
		got := readStored(t, pool, "sub_redeliver")
		if d := cmp.Diff(canceled, got.state); d != "" {
			t.Errorf("after a redelivery (fetch %v) stored %s (-want +got):\n%s", fetch != nil, got.eventID, d)
		}
	}
}

// Concurrent deliveries of newer events: whatever the interleaving, the
// newest wins, items included.
func TestApplyConcurrentNewestWins(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	const n = 30
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sub := base("sub_c")
			sub.Items = []Item{{ID: fmt.Sprintf("si_%02d", i), PriceID: "price_x"}}
			if _, err := s.ApplySubscription(t.Context(), sub, Event{ID: fmt.Sprintf("evt_%02d", i), Created: t0.Add(time.Duration(i) * time.Second)}, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got := readStored(t, pool, "sub_c")
	want := []Item{{ID: fmt.Sprintf("si_%02d", n-1), PriceID: "price_x"}}
	if got.eventID != fmt.Sprintf("evt_%02d", n-1) || !cmp.Equal(want, got.state.Items, cmpopts.EquateEmpty()) {
		t.Errorf("after %d concurrent events: %s with items %+v", n, got.eventID, got.state.Items)
	}
}
