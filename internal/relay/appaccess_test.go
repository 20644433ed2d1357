package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// TestAppConsumers: access.changed is a consumer of its own, app_access,
// ordered per customer; app_webhook is what it was without access (the
// kinds asked for, in order per subject), whether or not access is asked
// for, so turning access on or off never changes its order keys.
func TestAppConsumers(t *testing.T) {
	t.Parallel()
	type summary struct {
		Name    string
		Kinds   []string
		Ordered bool // by an OrderBy of its own, not by subject
	}
	for _, tc := range []struct {
		kinds []string
		want  []summary
	}{
		{[]string{ledger.KindSubscription}, []summary{{relay.AppWebhookConsumer, []string{ledger.KindSubscription}, false}}},
		{[]string{ledger.KindSubscription, relay.KindAccess}, []summary{
			{relay.AppWebhookConsumer, []string{ledger.KindSubscription}, false},
			{relay.AppAccessConsumer, []string{ledger.KindSubscription, ledger.KindCustomerFeatures, ledger.KindCheckoutSession}, true},
		}},
		{[]string{relay.KindAccess}, []summary{
			{relay.AppAccessConsumer, []string{ledger.KindSubscription, ledger.KindCustomerFeatures, ledger.KindCheckoutSession}, true},
		}},
	} {
		var got []summary
		for _, c := range relay.AppConsumers(newAppWebhook(t, "http://127.0.0.1:1", tc.kinds...), nil) {
			got = append(got, summary{c.Name, c.Kinds, c.OrderBy != nil})
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("AppConsumers of %v (-want +got):\n%s", tc.kinds, diff)
		}
	}
}

// TestAccessMidRollout: a replica with access starts (Register), then a
// relay leader without it (the previous configuration, mid-rollout)
// delivers app_webhook past a change and an access_ends_at passes before
// any leader with access has run. Once a leader with access runs, the
// change's access.changed goes (app_access has its own cursor, which the
// other leader did not move), and so does the end of access (its mark
// dates from the registration, not from the first pass).
func TestAccessMidRollout(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	f := stripetest.LoadFixtures(t)
	stripe := stripeHandler(t, pool, false)
	app, _ := newAccessApp(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct{ Type string }
		_ = json.Unmarshal(body, &msg)
		if msg.Type != "access.changed" {
			return // a change's webhook: taken
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		app.serve(w, r)
	}))
	t.Cleanup(srv.Close)
	answers := access.NewStore(pool)
	withAccess := newAppWebhook(t, srv.URL, ledger.KindSubscription, relay.KindAccess)
	newer := relay.New(relay.Config{Pool: pool, Consumers: relay.AppConsumers(withAccess, answers), Poll: 10 * time.Millisecond})
	if err := newer.Register(ctx); err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	soon := now.Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	created := now.Unix() - 600
	if code := postStripe(t, stripe, stripeSub(t, f, "evt_m1", "customer.subscription.created", created,
		stripetest.Subscription{ID: "sub_m1", Customer: "cus_m", Status: "active", PriceID: "price_pro", Created: created,
			PeriodEnd: soon.Unix(), CancelAtPeriodEnd: true}, "pro")); code != http.StatusOK {
		t.Fatalf("stripe answered %d", code)
	}

	// The leader without access delivers app_webhook past the change.
	without := newAppWebhook(t, srv.URL, ledger.KindSubscription)
	older := relay.New(relay.Config{Pool: pool, Consumers: relay.AppConsumers(without, answers), Poll: 10 * time.Millisecond})
	runFor(t, older, "app_webhook past the change", func() bool {
		n := 0
		_ = relay.List(ctx, pool, relay.AppWebhookConsumer, relay.Delivered, func(relay.Delivery) error { n++; return nil })
		return n == 1
	})
	time.Sleep(time.Until(soon.Add(500 * time.Millisecond))) // the access ends, no leader with access running

	reg := prometheus.NewRegistry()
	ex := relay.NewExpiry(relay.ExpiryConfig{Pool: pool, App: withAccess, Answers: answers, Every: 50 * time.Millisecond, Registerer: reg})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- newer.Run(runCtx, nil) }()
	go func() { done <- ex.Run(runCtx, nil) }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	waitFor(t, "app_access to deliver the change", func() bool {
		n := 0
		_ = relay.List(ctx, pool, relay.AppAccessConsumer, relay.Delivered, func(relay.Delivery) error { n++; return nil })
		return n == 1
	})
	waitFor(t, "the end of access to be sent", func() bool {
		return counterValue(t, reg, "relay_access_expiries_total", "delivered") >= 1
	})
	if got := app.copy()["cus_m"]; len(got) != 1 || got[0].HasAccess {
		t.Errorf("the app holds %+v for cus_m, want sub_m1 without access", got)
	}
}
