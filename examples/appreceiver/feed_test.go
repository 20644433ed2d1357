package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	stripewebhook "github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// readmeAnswer is the example's answer after the quick start's purchase
// by user_4711, as README.md shows it.
const readmeAnswer = `{"customers":["cus_QmunchableCust01"],"has_access":true,"key":"plus_monthly","may_use":true}`

// TestReceiverFollowsTheQuickStart runs the service's relay with
// APP_WEBHOOK_KINDS=access at the example, applies the quick start's
// Stripe events (testdata/events) through the service's own Stripe
// handler, and holds the example's answer to the one the README shows:
// the answers the example reads are the ones the service sends.
func TestReceiverFollowsTheQuickStart(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	wh, err := svix.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(newApp(wh))
	t.Cleanup(app.Close)
	sender, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: app.URL + "/hooks", Secret: testSecret,
		Kinds: []string{"access"}, AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Config{Pool: pool, Consumers: relay.AppConsumers(sender, access.NewStore(pool)),
		Poll: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := r.Run(ctx, nil); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM feed_consumers WHERE name = 'app_access'`).Scan(&n)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay did not start")
		}
	}

	rdb, prefix := dbtest.Redis(t)
	reg := prometheus.NewRegistry()
	flow := claim.NewFlow(claim.NewStore(rdb, claim.StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: time.Minute}),
		claim.FlowConfig{HandlerTimeout: 10 * time.Second, Registerer: reg})
	const stripeSecret = "whsec_dev_only_stripe"
	stripe := stripehook.New(stripehook.Config{Store: entitlements.NewStore(pool, reg), Secret: stripeSecret, Registerer: reg}).
		Handler(flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: time.Hour}))
	for _, f := range []string{"checkout.session.completed", "customer.subscription.created",
		"customer.subscription.updated", "entitlements.active_entitlement_summary.updated"} {
		body, err := os.ReadFile("../../testdata/events/" + f + ".json")
		if err != nil {
			t.Fatal(err)
		}
		signed := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{Payload: body, Secret: stripeSecret, Timestamp: time.Now()})
		req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Stripe-Signature", signed.Header)
		w := httptest.NewRecorder()
		stripe.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", f, w.Code, w.Body)
		}
	}

	got := ""
	for deadline := time.Now().Add(20 * time.Second); got != readmeAnswer && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(app.URL + "/access?user=user_4711&key=plus_monthly")
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		got = strings.TrimSpace(b.String())
	}
	if got != readmeAnswer {
		t.Errorf("answer after the quick start:\n got %s\nwant %s", got, readmeAnswer)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "# "+readmeAnswer+"\n") {
		t.Errorf("README.md does not show the example's answer:\n%s", readmeAnswer)
	}
}
