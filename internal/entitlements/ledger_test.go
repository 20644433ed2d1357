package entitlements

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// ledgerRow is an event's webhook_events row, as a string per field that
// matters here.
type ledgerRow struct {
	Outcome  string
	Attempts int
	Subject  string
}

func ledgerOf(t *testing.T, pool *pgxpool.Pool, eventID string) ledgerRow {
	t.Helper()
	var r ledgerRow
	err := pool.QueryRow(context.Background(), `SELECT outcome, attempts, coalesce(subject, '') FROM webhook_events WHERE provider = 'stripe' AND event_id = $1`, eventID).
		Scan(&r.Outcome, &r.Attempts, &r.Subject)
	if err != nil {
		return ledgerRow{Outcome: "none"}
	}
	return r
}

// feedRow is a change as the feed holds it.
type feedRow struct {
	Kind, Subject, Event, Before, After string
}

func feed(t *testing.T, pool *pgxpool.Pool) []feedRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT kind, subject, coalesce(event_id, ''), coalesce(before::text, ''), coalesce(after::text, '')
FROM changes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []feedRow
	for rows.Next() {
		var r feedRow
		if err := rows.Scan(&r.Kind, &r.Subject, &r.Event, &r.Before, &r.After); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// TestLedgerOutcomesAndFeed runs a subscription through every verdict and
// checks each event's ledger row and the feed: one change per write that
// moved a field the app reads, with only those fields; none for a replay,
// a stale, unordered or unchanged event.
func TestLedgerOutcomesAndFeed(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	a := base("sub_l")
	apply := func(sub Subscription, ev Event, fetch Fetch) Verdict {
		t.Helper()
		ev.Type = "customer.subscription.updated"
		res, err := s.ApplySubscription(ctx, sub, ev, fetch)
		if err != nil {
			t.Fatal(err)
		}
		return res.Verdict
	}
	pastDue := change(a, func(s *Subscription) { s.Status = "past_due" })
	oneItem := change(pastDue, func(s *Subscription) { s.Items = s.Items[:1] })
	fetched := change(oneItem, func(s *Subscription) { s.Status = "active" })
	steps := []struct {
		name  string
		sub   Subscription
		ev    Event
		fetch Fetch
		want  Verdict
	}{
		{"new", a, Event{ID: "evt_1", Created: t0}, nil, Applied},
		{"replay", a, Event{ID: "evt_1", Created: t0}, nil, Unchanged},
		{"newer", pastDue, Event{ID: "evt_2", Created: t0.Add(time.Minute)}, nil, Applied},
		{"older", a, Event{ID: "evt_0", Created: t0.Add(-time.Minute)}, nil, Stale},
		{"same second, same state", pastDue, Event{ID: "evt_3", Created: t0.Add(time.Minute)}, nil, Unchanged},
		{"same second, unordered", a, Event{ID: "evt_4", Created: t0.Add(time.Minute)}, nil, Unordered},
		{"items", oneItem, Event{ID: "evt_5", Created: t0.Add(2 * time.Minute)}, nil, Applied},
		{"revalidated", a, Event{ID: "evt_6", Created: t0.Add(2 * time.Minute)},
			func(context.Context, string) (Subscription, error) { return fetched, nil }, Revalidated},
		{"newer, nothing the app reads", fetched, Event{ID: "evt_7", Created: t0.Add(3 * time.Minute)}, nil, Applied},
	}
	for _, st := range steps {
		if got := apply(st.sub, st.ev, st.fetch); got != st.want {
			t.Errorf("%s: verdict %s, want %s", st.name, got, st.want)
		}
	}
	got := map[string]ledgerRow{}
	for _, id := range []string{"evt_0", "evt_1", "evt_2", "evt_3", "evt_4", "evt_5", "evt_6", "evt_7"} {
		got[id] = ledgerOf(t, pool, id)
	}
	want := map[string]ledgerRow{
		"evt_0": {"stale", 1, "sub_l"},
		"evt_1": {"applied", 2, "sub_l"}, // the replay keeps applied
		"evt_2": {"applied", 1, "sub_l"},
		"evt_3": {"unchanged", 1, "sub_l"},
		"evt_4": {"unordered", 1, "sub_l"},
		"evt_5": {"applied", 1, "sub_l"},
		"evt_6": {"applied", 1, "sub_l"}, // revalidated: Stripe's state written
		"evt_7": {"applied", 1, "sub_l"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ledger (-want +got):\n%s", d)
	}

	changes := feed(t, pool)
	var events []string
	for _, c := range changes {
		events = append(events, c.Event)
		if c.Kind != "subscription" || c.Subject != "sub_l" {
			t.Errorf("change %+v: want a subscription change of sub_l", c)
		}
	}
	if d := cmp.Diff([]string{"evt_1", "evt_2", "evt_5", "evt_6"}, events); d != "" {
		t.Fatalf("changes by event (-want +got):\n%s", d)
	}
	if changes[0].Before != "" {
		t.Errorf("a new row's before = %s, want null", changes[0].Before)
	}
	if changes[1].Before != `{"status": "active"}` || changes[1].After != `{"status": "past_due"}` {
		t.Errorf("status change = %s -> %s", changes[1].Before, changes[1].After)
	}
	if c := changes[2]; len(c.Before) <= len(c.After) || c.After[:9] != `{"items":` {
		t.Errorf("items change = %s -> %s, want only items, one fewer", c.Before, c.After)
	}
}

// TestSnapshotsAppendChanges: stripe sync's writes append a change when
// they move a row, with the snapshot as its event, and no ledger row.
func TestSnapshotsAppendChanges(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	at := t0.Add(time.Hour)
	if _, err := s.SnapshotSubscription(ctx, base("sub_s"), at); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SnapshotSubscription(ctx, base("sub_s"), at); err != nil { // the same again
		t.Fatal(err)
	}
	f := Features{CustomerID: "cus_s", LookupKeys: []string{"sso"}, Complete: true}
	if _, err := s.SnapshotFeatures(ctx, f, at); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, c := range feed(t, pool) {
		kinds = append(kinds, c.Kind+" "+c.Event)
	}
	snap := snapshotID(at)
	if d := cmp.Diff([]string{"subscription " + snap, "customer_features " + snap}, kinds); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_events`).Scan(&n); err != nil || n != 0 {
		t.Errorf("ledger rows = %d, %v; want none for snapshots", n, err)
	}
}

// TestFeaturesAndCheckoutFeed: the other two kinds append their changes
// and ledger rows the same way.
func TestFeaturesAndCheckoutFeed(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s := NewStore(pool, prometheus.NewRegistry())
	ctx := t.Context()
	f := func(keys ...string) Features { return Features{CustomerID: "cus_f", LookupKeys: keys, Complete: true} }
	for i, st := range []struct {
		f    Features
		at   time.Time
		want Verdict
	}{{f("sso"), t0, Applied}, {f("sso", "api"), t0.Add(time.Minute), Applied}, {f("x"), t0.Add(-time.Minute), Stale}} {
		res, err := s.ApplyFeatures(ctx, st.f, FeatureEvent{ID: "evt_f" + string(rune('0'+i)), Type: "entitlements.active_entitlement_summary.updated", Created: st.at}, nil)
		if err != nil || res.Verdict != st.want {
			t.Errorf("features step %d: %v, %v; want %s", i, res.Verdict, err, st.want)
		}
	}
	cs := CheckoutSession{ID: "cs_1", CustomerID: "cus_f", Mode: "subscription", Status: "complete", PaymentStatus: "unpaid"}
	if _, err := s.ApplyCheckout(ctx, cs, Event{ID: "evt_c0", Type: "checkout.session.completed", Created: t0}); err != nil {
		t.Fatal(err)
	}
	cs.PaymentStatus = "paid"
	if _, err := s.ApplyCheckout(ctx, cs, Event{ID: "evt_c1", Type: "checkout.session.async_payment_succeeded", Created: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range feed(t, pool) {
		got = append(got, c.Kind+" "+c.Event+" "+c.After)
	}
	want := []string{
		`customer_features evt_f0 {"complete": true, "lookup_keys": ["sso"], "stripe_customer_id": "cus_f"}`,
		`customer_features evt_f1 {"lookup_keys": ["api", "sso"]}`,
		`checkout_session evt_c0 {"mode": "subscription", "status": "complete", "metadata": {}, "customer_email": null, "payment_status": "unpaid", "stripe_customer_id": "cus_f", "client_reference_id": null, "stripe_subscription_id": null, "stripe_checkout_session_id": "cs_1"}`,
		`checkout_session evt_c1 {"payment_status": "paid"}`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	for id, want := range map[string]string{"evt_f0": "applied", "evt_f1": "applied", "evt_f2": "stale", "evt_c0": "applied", "evt_c1": "applied"} {
		if got := ledgerOf(t, pool, id); got.Outcome != want {
			t.Errorf("%s: %+v, want %s", id, got, want)
		}
	}
}

// rowJSONSQL is a subscription as the feed describes it: the row without
// its bookkeeping, and its items in order, in the shape the feed's change
// was first computed from (to_jsonb of the row).
const rowJSONSQL = `
SELECT to_jsonb(s) - '{updated_at,last_event_id,last_event_created,gap_from,gap_to,creation}'::text[]
    || jsonb_build_object('items', coalesce((
        SELECT jsonb_agg(jsonb_build_object('id', i.stripe_item_id,
            'price_id', i.price_id, 'product_id', i.product_id,
            'price_lookup_key', i.price_lookup_key, 'quantity', i.quantity,
            'current_period_start', i.current_period_start,
            'current_period_end', i.current_period_end) ORDER BY i.position)
        FROM entitlement_items i
        WHERE i.stripe_subscription_id = s.stripe_subscription_id), '[]'))
FROM entitlements s WHERE s.stripe_subscription_id = $1`

// jsonDiffSQL is the generic diff of two such rows (AppendCTE's): the keys
// whose values differ, before and after; before null for a new row; no
// row when nothing differs.
const jsonDiffSQL = `
SELECT coalesce(jsonb_object_agg(k.key, $1::jsonb -> k.key) FILTER (WHERE $1::jsonb IS NOT NULL)::text, ''),
       coalesce(jsonb_object_agg(k.key, k.value)::text, '')
FROM jsonb_each($2::jsonb) k
WHERE k.value IS DISTINCT FROM $1::jsonb -> k.key`

// TestSubscriptionChangeIsTheRowsDiff: applySQL compares the state it
// builds in Go with the stored row's (subscription_state) rather than the
// rows' own JSON; for every field, items moved, added, dropped, reordered or
// emptied, fields set to and from null, a replay and a new row, its change
// is exactly the JSON diff of the row before and after.
//
// The store writes through sessions in a time zone far from UTC: the
// change's timestamps are UTC whatever the session's (the service builds
// the new state in UTC, and subscription_state reads the old one so).
func TestSubscriptionChangeIsTheRowsDiff(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := t.Context()
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["timezone"] = "Pacific/Chatham"
	far, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(far.Close)
	s := NewStore(far, prometheus.NewRegistry())
	rowJSON := func(id string) (j *string, err error) {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL timezone = 'UTC'`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, rowJSONSQL, id).Scan(&j)
		})
		return j, err
	}
	type step struct {
		name string
		f    func(*Subscription)
	}
	steps := []step{
		{"new", func(*Subscription) {}},
		{"replay", func(*Subscription) {}},
		{"items reordered", func(s *Subscription) { s.Items[0], s.Items[1] = s.Items[1], s.Items[0] }},
		{"item dropped", func(s *Subscription) { s.Items = s.Items[:1] }},
		{"item added", func(s *Subscription) {
			s.Items = append(s.Items, Item{ID: "si_new", PriceID: "price_new", Quantity: nil})
		}},
		{"item's product and key to null", func(s *Subscription) { s.Items[0].ProductID, s.Items[0].PriceLookupKey = "", "" }},
		{"item's period to null", func(s *Subscription) { s.Items[0].CurrentPeriodEnd = time.Time{} }},
		{"items emptied", func(s *Subscription) { s.Items = nil }},
		{"still no items, status moved", func(s *Subscription) { s.Status = "past_due" }},
		{"items back, status too", func(s *Subscription) { s.Items = base("").Items; s.Status = "trialing" }},
		{"price to null, pause set", func(s *Subscription) { s.PriceID = ""; s.PauseCollection = "keep_as_draft" }},
		{"metadata emptied", func(s *Subscription) { s.Metadata = map[string]string{} }},
	}
	for _, fc := range fieldChanges {
		steps = append(steps, step{"field " + string(fc.field), fc.change})
	}
	sub := base("sub_diff")
	appended := 0
	for i, st := range steps {
		if i > 0 {
			sub = change(sub, st.f)
		}
		before, err := rowJSON(sub.ID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("%s: %v", st.name, err)
		}
		eventID := fmt.Sprintf("evt_diff_%d", i)
		if st.name == "replay" {
			eventID = "evt_diff_0" // the same event again
		}
		created := t0.Add(time.Duration(i) * time.Minute)
		if st.name == "replay" {
			created = t0
		}
		if _, err := s.ApplySubscription(ctx, sub, Event{ID: eventID, Created: created}, nil); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		after, err := rowJSON(sub.ID)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		var want feedRow
		if err := pool.QueryRow(ctx, jsonDiffSQL, before, after).Scan(&want.Before, &want.After); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		// What this step appended: nothing, or the feed's newest row.
		var got feedRow
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM changes`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > appended {
			err := pool.QueryRow(ctx, `
SELECT coalesce(before::text, ''), coalesce(after::text, '') FROM changes ORDER BY id DESC LIMIT 1`).
				Scan(&got.Before, &got.After)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		if n > appended+1 {
			t.Errorf("%s: %d changes appended, want at most one", st.name, n-appended)
		}
		if n == appended && st.name != "replay" {
			t.Errorf("%s: no change appended", st.name)
		}
		appended = n
		if i == 0 && want.After == "" {
			t.Fatalf("new row: no diff at all")
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: change (-the rows' JSON diff +the feed's):\n%s", st.name, d)
		}
	}
}
