package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	stripewebhook "github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// readmeAnswer is the example's answer after the quick start's purchase
// by user_4711 (the README's local block shows it after Stripe's repair).
const readmeAnswer = `{"customers":["cus_QmunchableCust01"],"subscriptions":[{"id":"sub_1QmunchableSub0001","status":"active","access_ends_at":null,"has_access":true,"price_lookup_keys":["plus_monthly"],"known":true}],"features":["api_access","exports","sso"],"has_access":true,"key":"plus_monthly","may_use":true}`

// TestReceiverFollowsTheQuickStart applies the quick start's Stripe events
// (testdata/events) through the service's own Stripe handler into a test
// database, sends every change the feed then holds to the example as the
// relay would (internal/relay's AppWebhook, in feed order), and holds its
// answer to the one the README shows: the payloads the example reads are
// the ones the service writes, not ones written for its test.
func TestReceiverFollowsTheQuickStart(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
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
		r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Stripe-Signature", signed.Header)
		w := httptest.NewRecorder()
		stripe.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", f, w.Code, w.Body)
		}
	}

	wh, err := svix.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	var handled strings.Builder
	app := httptest.NewServer(newApp(wh, time.Now, &handled).routes())
	t.Cleanup(app.Close)
	sender, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: app.URL + "/hooks", Secret: testSecret,
		Kinds: []string{"subscription", "customer_features", "checkout_session", "support_message"}, AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	// The feed is read only up to the horizon, which an open transaction
	// anywhere on the server (another test's) holds back: read until every
	// row is through, as a consumer polls.
	var rows int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM changes`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows < 4 {
		t.Fatalf("the quick start wrote %d changes, want one or more per event", rows)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	feed, cursor, sent := ledger.New(pool, 0), ledger.Cursor{}, 0
	for sent < rows {
		cursor, err = feed.Tail(ctx, cursor, false, time.Second, func(ch ledger.Change) error {
			sent++
			_, err := sender.Deliver(ctx, ch)
			return err
		})
		if err != nil {
			t.Fatalf("after %d of %d changes: %v", sent, rows, err)
		}
		if sent < rows {
			select {
			case <-ctx.Done():
				t.Fatalf("only %d of %d changes readable after 30 s", sent, rows)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	resp, err := http.Get(app.URL + "/access?user=user_4711&key=plus_monthly")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got bytes.Buffer
	_, _ = got.ReadFrom(resp.Body)
	if strings.TrimSpace(got.String()) != readmeAnswer {
		t.Errorf("answer after the quick start:\n got %s\nwant %s\n(handled:\n%s)", got.String(), readmeAnswer, handled.String())
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The README's block runs after its Stripe block, whose repair attaches
	// priority_support to her plan (a customer_features change): it shows
	// this answer with that feature. TestReadmeQuickStart runs the block.
	repaired := strings.Replace(readmeAnswer, `"exports","sso"`, `"exports","priority_support","sso"`, 1)
	if !strings.Contains(string(readme), "# "+repaired+"\n") {
		t.Errorf("README.md does not show the example's answer after Stripe's repair:\n%s", repaired)
	}
}
