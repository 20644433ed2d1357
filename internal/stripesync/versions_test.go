package stripesync

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// accountVersions are the API versions an account may be on that the
// tests below cover: stripe-go v79's pinned one, the first of each release
// since (basil moved the period to the items; clover made flexible billing
// the default; dahlia), and a later dahlia. docs/STRIPE.md lists them.
var accountVersions = []string{
	"2024-06-20",
	"2025-03-31.basil",
	"2025-09-30.clover",
	"2026-03-25.dahlia",
	"2026-07-29.dahlia",
}

// state is the stored subscription and its items as the change feed and
// stripe verify read them (subscription_state), without bookkeeping.
func (r *rig) state(t *testing.T, id string) map[string]any {
	t.Helper()
	var raw []byte
	if err := r.pool.QueryRow(t.Context(), `SELECT subscription_state($1)`, id).Scan(&raw); err != nil {
		t.Fatalf("subscription_state(%s): %v", id, err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestAccountOnEachVersion: for an account on each version, a
// subscription stored from its webhooks (rendered in that version) and
// unchanged at Stripe reads as in sync through stripe verify, --repair
// writes nothing, stripe sync over it and the sweep and sync into an empty
// database store the same row and items, and a same-second event that
// cannot be ordered, settled by reading Stripe, stores it too. The fake
// API renders its answers in the version each request names, as Stripe
// does; from basil on the add-on renders yearly, so an answer read in an
// older version than the account's loses its period.
func TestAccountOnEachVersion(t *testing.T) {
	t.Parallel()
	for _, version := range accountVersions {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			created := time.Now().Unix() - 600
			addonEnd := created + 30*86400
			if version >= stripetest.Basil {
				addonEnd = created + 365*86400 // mixed intervals: items on their own periods
			}
			s := stripetest.Subscription{ID: "sub_versioned", Customer: "cus_versioned", Status: "active", PriceID: "price_basic",
				Created: created, PeriodEnd: created + 30*86400, More: []stripetest.Item{{ID: "si_addon", PriceID: "price_addon", PeriodEnd: addonEnd}}}
			first := stripetest.Render(r.fx.Subscription(s), version)
			s.CancelAtPeriodEnd = true
			final := stripetest.Render(r.fx.Subscription(s), version)
			events := [][]byte{
				r.fx.EventIn(version, "evt_versioned1", "customer.subscription.created", created, first, nil),
				r.fx.EventIn(version, "evt_versioned2", "customer.subscription.updated", created+60, final,
					map[string]any{"cancel_at_period_end": false}),
			}
			for _, e := range events {
				r.deliver(t, e)
				r.api.AddEvent(e, true)
			}
			r.api.PutSubscription(final)
			want := r.state(t, s.ID)
			// The webhooks stored every item's period (before basil, the
			// subscription's shared one).
			for _, it := range want["items"].([]any) {
				if it := it.(map[string]any); it["current_period_start"] == nil || it["current_period_end"] == nil {
					t.Fatalf("webhooks stored item %v without its period", it["id"])
				}
			}
			same := func(step string, got map[string]any) {
				t.Helper()
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("%s: stored subscription differs from the webhooks' (-webhooks +%s):\n%s", step, step, d)
				}
			}

			n, drift := r.verify(t, false)
			if n.Drifted() != 0 || len(drift) != 0 || n.Subscriptions != 1 {
				t.Errorf("verify: %v; reported %q, want 1 subscription compared and no drift", n, drift)
			}
			n, drift = r.verify(t, true)
			if n.Repaired != 0 || len(drift) != 0 {
				t.Errorf("verify --repair: %v; reported %q, want nothing repaired", n, drift)
			}
			same("verify --repair", r.state(t, s.ID))

			// Same second as the stored event, from a state that is not the
			// stored one, to one that is not either: only Stripe can say.
			// (Before sync, whose snapshot is newer than any event.)
			var odd map[string]any
			if err := json.Unmarshal(final, &odd); err != nil {
				t.Fatal(err)
			}
			odd["metadata"] = map[string]any{"plan_note": "odd"}
			oddRaw, _ := json.Marshal(odd)
			unordered := r.fx.EventIn(version, "evt_versioned3", "customer.subscription.updated", created+60, oddRaw,
				map[string]any{"cancel_at_period_end": false, "metadata": map[string]any{"plan_note": nil}})
			reads := r.api.Calls(stripetest.RetrieveSubscription)
			ev, err := r.replayer.Event(unordered)
			if err != nil {
				t.Fatal(err)
			}
			if res, err := r.ep.Process(context.WithoutCancel(t.Context()), unordered, ev); err != nil || res.Outcome != claim.Processed {
				t.Fatalf("unordered event: %+v, %v", res, err)
			}
			if got := r.api.Calls(stripetest.RetrieveSubscription) - reads; got != 1 {
				t.Errorf("unordered event read the subscription %d times, want 1", got)
			}
			same("settled", r.state(t, s.ID))

			if _, err := r.sync(t); err != nil {
				t.Fatalf("sync: %v", err)
			}
			same("sync", r.state(t, s.ID))

			synced := rigOn(t, r.api)
			if _, err := synced.sync(t); err != nil {
				t.Fatalf("sync into an empty database: %v", err)
			}
			same("sync-into-empty", synced.state(t, s.ID))

			swept := rigOn(t, r.api)
			pass := SweepPass(ReplayConfig{API: swept.client, Receiver: swept.replayer, Endpoint: swept.ep, Logger: swept.logger})
			if c, err := pass(t.Context(), time.Unix(created-60, 0)); err != nil || c.Recovered != 2 {
				t.Fatalf("sweep into an empty database: %+v, %v; want both events recovered", c, err)
			}
			same("sweep", swept.state(t, s.ID))
		})
	}
}
