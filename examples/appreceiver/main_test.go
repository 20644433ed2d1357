package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

const testSecret = "whsec_YXBwLXJlY2VpdmVyLXRlc3Qtc2VjcmV0IQ=="

// now is the test's clock: access_ends_at before it has passed.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func strp(s string) *string { return &s }

// change is a row of the service's feed. Its before and after have the
// shapes the service writes: a subscription's is subscription_state()
// (migration 00009), a session's and features' their table's row without
// bookkeeping.
func change(id int64, kind, subject, customer, before, after string) ledger.Change {
	var b json.RawMessage
	if before != "" {
		b = json.RawMessage(before)
	}
	return ledger.Change{ID: id, At: now.Add(time.Duration(id) * time.Second), Kind: kind, Subject: subject,
		StripeCustomerID: strp(customer), EventID: strp("evt_" + subject), Before: b, After: json.RawMessage(after)}
}

var (
	subCreated = change(1, ledger.KindSubscription, "sub_1", "cus_1", "", `{"stripe_subscription_id":"sub_1",`+
		`"stripe_customer_id":"cus_1","status":"trialing","price_id":"price_pro","current_period_end":"2026-03-15T00:00:00+00:00",`+
		`"cancel_at_period_end":false,"cancel_at":null,"canceled_at":null,"ended_at":null,"trial_start":"2026-03-01T00:00:00+00:00",`+
		`"trial_end":"2026-03-15T00:00:00+00:00","pause_collection":null,"access_ends_at":null,"livemode":false,"metadata":{},`+
		`"items":[{"id":"si_1","price_id":"price_pro","product_id":"prod_1","price_lookup_key":"pro","quantity":1,`+
		`"current_period_start":"2026-03-01T00:00:00+00:00","current_period_end":"2026-03-15T00:00:00+00:00"}]}`)
	sessionComplete = change(2, ledger.KindCheckoutSession, "cs_1", "cus_1", "", `{"stripe_checkout_session_id":"cs_1",`+
		`"client_reference_id":"42","stripe_customer_id":"cus_1","stripe_subscription_id":"sub_1","mode":"subscription",`+
		`"status":"complete","payment_status":"no_payment_required","customer_email":"ada@example.com","metadata":{}}`)
	featuresCreated = change(3, ledger.KindCustomerFeatures, "cus_1", "cus_1", "",
		`{"stripe_customer_id":"cus_1","lookup_keys":["export"],"complete":true}`)
	subActive   = change(4, ledger.KindSubscription, "sub_1", "cus_1", `{"status":"trialing"}`, `{"status":"active"}`)
	subCanceled = change(5, ledger.KindSubscription, "sub_1", "cus_1",
		`{"status":"active","canceled_at":null,"ended_at":null,"access_ends_at":null}`,
		`{"status":"canceled","canceled_at":"2026-03-01T11:00:00+00:00","ended_at":"2026-03-01T11:00:00+00:00","access_ends_at":"2026-03-01T11:00:00+00:00"}`)
	supportMessage = change(6, ledger.KindSupportMessage, "77", "", "", `{"id":77,"source":"web"}`)
	// A subscription whose creation the app never saw (it joined later).
	subMidLife = change(7, ledger.KindSubscription, "sub_9", "cus_9", `{"status":"past_due"}`, `{"status":"active"}`)
)

// access is the part of /access's answer the tests compare.
type access struct {
	Customers     []string
	HasAccess     bool `json:"has_access"`
	MayUse        bool `json:"may_use"`
	Features      []string
	Subscriptions []struct {
		ID        string
		Status    string
		HasAccess bool `json:"has_access"`
		Known     bool
	}
}

func ask(t *testing.T, base, query string) access {
	t.Helper()
	resp, err := http.Get(base + "/access?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a access
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestReceiverAnswersFromWebhooks sends the service's own webhooks (signed
// by internal/relay's AppWebhook, the code the service runs) to the
// example and asks it the access question as they arrive.
func TestReceiverAnswersFromWebhooks(t *testing.T) {
	t.Parallel()
	wh, err := svix.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	srv := httptest.NewServer(newApp(wh, func() time.Time { return now }, &out).routes())
	t.Cleanup(srv.Close)
	sender, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: srv.URL + "/hooks", Secret: testSecret,
		Kinds: []string{"subscription", "customer_features", "checkout_session", "support_message"}, AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	send := func(ch ledger.Change) {
		t.Helper()
		if result, err := sender.Deliver(context.Background(), ch); err != nil || result != "204" {
			t.Fatalf("change %d: Deliver = %q, %v; want 204", ch.ID, result, err)
		}
	}
	type sub = struct {
		ID        string
		Status    string
		HasAccess bool `json:"has_access"`
		Known     bool
	}
	steps := []struct {
		name  string
		send  []ledger.Change
		query string
		want  access
	}{
		{"nothing yet", nil, "user=42&key=pro", access{Customers: []string{}, Features: []string{}, Subscriptions: []sub{}}},
		{"trialing, paid through checkout by user 42", []ledger.Change{subCreated, sessionComplete, featuresCreated}, "user=42&key=pro",
			access{Customers: []string{"cus_1"}, HasAccess: true, MayUse: true, Features: []string{"export"},
				Subscriptions: []sub{{"sub_1", "trialing", true, true}}}},
		{"a feature grants its key", nil, "customer=cus_1&key=export",
			access{Customers: []string{"cus_1"}, HasAccess: true, MayUse: true, Features: []string{"export"},
				Subscriptions: []sub{{"sub_1", "trialing", true, true}}}},
		// subActive was refused (dead) and is retried by hand after
		// subCanceled went through: it must not bring the subscription back.
		{"canceled, then an older change late", []ledger.Change{subCanceled, subActive, supportMessage}, "user=42&key=pro",
			access{Customers: []string{"cus_1"}, Features: []string{"export"},
				Subscriptions: []sub{{"sub_1", "canceled", false, true}}}},
		// The service sends a change again until it hears a 2xx (a lost
		// answer, a crash): the same webhook-id, handled once. Applied
		// again, the creation would bring the trial back.
		{"a late redelivery of the creation", []ledger.Change{subCreated}, "user=42&key=pro",
			access{Customers: []string{"cus_1"}, Features: []string{"export"},
				Subscriptions: []sub{{"sub_1", "canceled", false, true}}}},
		{"a subscription begun before the app listened", []ledger.Change{subMidLife}, "customer=cus_9",
			access{Customers: []string{"cus_9"}, HasAccess: true, Features: []string{},
				Subscriptions: []sub{{"sub_9", "active", true, false}}}},
	}
	for _, step := range steps {
		for _, ch := range step.send {
			send(ch)
		}
		if diff := cmp.Diff(step.want, ask(t, srv.URL, step.query)); diff != "" {
			t.Errorf("%s: /access?%s (-want +got):\n%s", step.name, step.query, diff)
		}
	}
	// Each webhook-id once, in order; the redelivery is not among them.
	want := "appreceiver: chg_1 subscription.changed sub_1\nappreceiver: chg_2 checkout_session.changed cs_1\n" +
		"appreceiver: chg_3 customer_features.changed cus_1\nappreceiver: chg_5 subscription.changed sub_1\n" +
		"appreceiver: chg_4 subscription.changed sub_1\nappreceiver: chg_6 support_message.changed 77\n" +
		"appreceiver: chg_7 subscription.changed sub_9\n"
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
}

// TestReceiverRefusesForgeries: a webhook signed with another secret, or
// not signed, changes nothing and is refused with a 4xx.
func TestReceiverRefusesForgeries(t *testing.T) {
	t.Parallel()
	wh, _ := svix.NewWebhook(testSecret)
	srv := httptest.NewServer(newApp(wh, func() time.Time { return now }, io.Discard).routes())
	t.Cleanup(srv.Close)
	forger, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: srv.URL + "/hooks",
		Secret: "whsec_bm90LXRoZS1hcHAtcmVjZWl2ZXItc2VjcmV0", Kinds: []string{"subscription"}, AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := forger.Deliver(context.Background(), subCreated); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forged webhook: %v, want a 401", err)
	}
	resp, err := http.Post(srv.URL+"/hooks", "application/json", strings.NewReader(`{"type":"subscription.changed"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned webhook: %d, want 401", resp.StatusCode)
	}
	if got := ask(t, srv.URL, "customer=cus_1"); got.HasAccess || len(got.Subscriptions) != 0 {
		t.Errorf("after forgeries: %+v, want nothing known", got)
	}
}

// TestRunNeedsSecret: the example refuses to start without a secret.
func TestRunNeedsSecret(t *testing.T) {
	t.Parallel()
	for _, secret := range []string{"", "whsec_***"} {
		err := run(context.Background(), nil, func(string) string { return secret }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "APP_WEBHOOK_SECRET") {
			t.Errorf("secret %q: run = %v, want APP_WEBHOOK_SECRET refused", secret, err)
		}
	}
}
