package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// These tests run the real relay with the app's webhook as its consumer
// (as serve wires it when APP_WEBHOOK_URL is set) against a stand-in app
// that verifies every request with the Standard Webhooks library, as
// docs/APP.md tells an app to.

// svixMsg is one request the stand-in app received and verified.
type svixMsg struct {
	ID      string // webhook-id
	Subject string // data.subject
	Body    []byte
	Status  int // what the app answered
}

// svixApp is the stand-in app. answer gives the status for the n-th
// request (from 1) about a subject; nil answers 200.
type svixApp struct {
	t      *testing.T
	wh     *svix.Webhook
	answer func(subject string, attempt int) int

	mu   sync.Mutex
	msgs []svixMsg
	seen map[string]int // requests per subject
}

func newSvixApp(t *testing.T, answer func(subject string, attempt int) int) (*svixApp, *httptest.Server) {
	t.Helper()
	wh, err := svix.NewWebhook(appSecret)
	if err != nil {
		t.Fatal(err)
	}
	app := &svixApp{t: t, wh: wh, answer: answer, seen: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(app.serve))
	t.Cleanup(srv.Close)
	return app, srv
}

func (a *svixApp) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := a.wh.Verify(body, r.Header); err != nil {
		a.t.Errorf("svix refuses a webhook: %v (headers %v)", err, r.Header)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var msg struct{ Data struct{ Subject string } }
	if err := json.Unmarshal(body, &msg); err != nil {
		a.t.Errorf("webhook body %s: %v", body, err)
	}
	id := r.Header.Get("webhook-id")
	a.mu.Lock()
	a.seen[msg.Data.Subject]++
	attempt := a.seen[msg.Data.Subject]
	a.mu.Unlock()
	status := http.StatusOK
	if a.answer != nil {
		status = a.answer(msg.Data.Subject, attempt)
	}
	a.mu.Lock()
	a.msgs = append(a.msgs, svixMsg{ID: id, Subject: msg.Data.Subject, Body: body, Status: status})
	a.mu.Unlock()
	w.WriteHeader(status)
}

// trace is the app's log in short: webhook-id and answer per request.
func trace(msgs []svixMsg) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, " %s:%d", m.ID, m.Status)
	}
	return b.String()
}

func (a *svixApp) got() []svixMsg {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.msgs)
}

// appRelay runs a relay whose one consumer is the app's webhook at url,
// built as serve builds it, until the test ends.
func appRelay(t *testing.T, pool *pgxpool.Pool, url string, schedule []time.Duration) *relay.Relay {
	t.Helper()
	r := relay.New(appRelayConfig(t, pool, url, schedule))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	waitFor(t, "the app_webhook consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers WHERE name = $1 AND enabled`, relay.AppWebhookConsumer).Scan(&n)
		return n == 1
	})
	return r
}

func appRelayConfig(t *testing.T, pool *pgxpool.Pool, url string, schedule []time.Duration) relay.Config {
	t.Helper()
	a := newAppWebhook(t, url, ledger.KindSubscription)
	return relay.Config{
		Pool:      pool,
		Consumers: []relay.Consumer{{Name: relay.AppWebhookConsumer, Kinds: a.Kinds(), Destination: a}},
		Schedule:  schedule,
		Poll:      10 * time.Millisecond,
	}
}

// addSubscriptionChanges appends a subscription change per subject, in
// one transaction, in the order given, and returns their ids.
func addSubscriptionChanges(t *testing.T, pool *pgxpool.Pool, subjects ...string) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		for _, s := range subjects {
			var id int64
			if err := tx.QueryRow(context.Background(),
				`INSERT INTO changes (at, kind, subject, after) VALUES (now(), 'subscription', $1, '{"status":"active"}') RETURNING id`,
				s).Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("add changes: %v", err)
	}
	return ids
}

// appDelivery reads the app_webhook consumer's delivery of a change.
func appDelivery(t *testing.T, pool *pgxpool.Pool, id int64) relay.Delivery {
	t.Helper()
	var got relay.Delivery
	err := relay.List(context.Background(), pool, relay.AppWebhookConsumer, "", func(d relay.Delivery) error {
		if d.ChangeID == id {
			got = d
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func waitAppState(t *testing.T, pool *pgxpool.Pool, id int64, want relay.State) relay.Delivery {
	t.Helper()
	var got relay.Delivery
	waitFor(t, "change "+relay.AppWebhookID(id)+" "+string(want), func() bool {
		got = appDelivery(t, pool, id)
		return got.State == want
	})
	return got
}

// TestAppWebhookRelayRetries: the app answers 500, then 503, then 200: one
// message, three attempts under one webhook-id (the same body each time),
// delivered, with 200 on record.
func TestAppWebhookRelayRetries(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	answers := []int{500, 503, 200}
	app, srv := newSvixApp(t, func(_ string, attempt int) int { return answers[min(attempt, len(answers))-1] })
	appRelay(t, pool, srv.URL, []time.Duration{10 * time.Millisecond, 10 * time.Millisecond, time.Hour})
	id := addSubscriptionChanges(t, pool, "sub_retried")[0]

	d := waitAppState(t, pool, id, relay.Delivered)
	if d.Attempts != 3 || deref(d.Result) != "200" || d.LastError != nil {
		t.Errorf("delivery = %d attempts, result %q, last error %v; want 3, \"200\", none", d.Attempts, deref(d.Result), d.LastError)
	}
	msgs := app.got()
	var statuses []int
	for _, m := range msgs {
		statuses = append(statuses, m.Status)
		if m.ID != relay.AppWebhookID(id) {
			t.Errorf("webhook-id %q, want %q on every attempt", m.ID, relay.AppWebhookID(id))
		}
		if !bytes.Equal(m.Body, msgs[0].Body) {
			t.Errorf("a retry's body differs from the first attempt's:\n%s\n%s", m.Body, msgs[0].Body)
		}
	}
	if !slices.Equal(statuses, answers) {
		t.Errorf("the app answered %v, want %v: three attempts", statuses, answers)
	}
}

// TestAppWebhookRelayOrder: a subject whose first change the app refuses
// for a while holds back only its own later change, which goes once the
// first is delivered; another subject's changes are delivered meanwhile,
// in their order.
func TestAppWebhookRelayOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	const failures = 4
	// The app refuses sub_a's first requests: a1's first attempts, as
	// long as a2 waits for a1.
	app, srv := newSvixApp(t, func(subject string, n int) int {
		if subject == "sub_a" && n <= failures {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	schedule := slices.Repeat([]time.Duration{10 * time.Millisecond}, failures)
	appRelay(t, pool, srv.URL, append(schedule, time.Hour))
	got := addSubscriptionChanges(t, pool, "sub_a", "sub_b", "sub_a", "sub_b")
	a1, b1, a2, b2 := got[0], got[1], got[2], got[3]
	for _, id := range got {
		waitAppState(t, pool, id, relay.Delivered)
	}
	if d := appDelivery(t, pool, a1); d.Attempts != failures+1 {
		t.Errorf("a1 took %d attempts, want %d", d.Attempts, failures+1)
	}
	// The app's log: where each webhook-id was first and last seen.
	first, last := map[int64]int{}, map[int64]int{}
	msgs := app.got()
	for i, m := range msgs {
		for _, id := range got {
			if m.ID == relay.AppWebhookID(id) {
				if _, ok := first[id]; !ok {
					first[id] = i
				}
				last[id] = i
			}
		}
	}
	if first[a2] < last[a1] {
		t.Errorf("a2 was sent before a1 was delivered:%s", trace(msgs))
	}
	if first[b2] < last[b1] {
		t.Errorf("b2 was sent before b1 was delivered:%s", trace(msgs))
	}
	if last[b2] > last[a1] {
		t.Errorf("sub_b waited for sub_a: b2 delivered after a1's last attempt:%s", trace(msgs))
	}
	if n := len(msgs); n != failures+4 {
		t.Errorf("the app got %d requests, want %d (a1's %d failures and one each)", n, failures+4, failures)
	}
}

// TestAppWebhookRelayDeadThenRetried: a 400 is dead at once, never retried
// on the schedule; relay retry, as the command runs it (a relay of its own
// beside the running one), sends the same webhook-id again and it is
// delivered.
func TestAppWebhookRelayDeadThenRetried(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	app, srv := newSvixApp(t, func(subject string, n int) int {
		if subject == "sub_refused" && n == 1 {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	fastSchedule := []time.Duration{time.Millisecond, time.Millisecond}
	appRelay(t, pool, srv.URL, fastSchedule)
	id := addSubscriptionChanges(t, pool, "sub_refused")[0]

	d := waitAppState(t, pool, id, relay.Dead)
	if d.Attempts != 1 || d.LastError == nil {
		t.Errorf("dead after %d attempts, last error %v; want 1 and the app's 400", d.Attempts, d.LastError)
	}
	// A later change of another subject goes through: the relay has
	// passed the dead one by, and has not tried it again.
	other := addSubscriptionChanges(t, pool, "sub_other")[0]
	waitAppState(t, pool, other, relay.Delivered)
	if n := len(app.got()); n != 2 {
		t.Fatalf("the app got %d requests before the retry by hand, want 2 (the 400 and the other change)", n)
	}

	cmd := relay.New(appRelayConfig(t, pool, srv.URL, fastSchedule))
	d, err := cmd.Retry(context.Background(), relay.AppWebhookConsumer, id)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != relay.Delivered || d.Attempts != 2 || deref(d.Result) != "200" {
		t.Errorf("after relay retry: %s, %d attempts, result %q; want delivered, 2, \"200\"", d.State, d.Attempts, deref(d.Result))
	}
	var sent []string
	for _, m := range app.got() {
		if m.Subject == "sub_refused" {
			sent = append(sent, m.ID)
		}
	}
	if want := []string{relay.AppWebhookID(id), relay.AppWebhookID(id)}; !slices.Equal(sent, want) {
		t.Errorf("sub_refused's webhooks: %v, want %v", sent, want)
	}
}

// TestAppWebhookRelayStripeOnce: a Stripe event delivered twice, then an
// older event of the same subscription, through the Stripe webhook's
// handler, make one change and so one webhook to the app; with Redis's
// claims and, Redis gone, with the store alone.
func TestAppWebhookRelayStripeOnce(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		noRedis bool
	}{{"claims in Redis", false}, {"no Redis: the store alone", true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			handler := stripeHandler(t, pool, tt.noRedis)
			app, srv := newSvixApp(t, nil)
			appRelay(t, pool, srv.URL, []time.Duration{10 * time.Millisecond})

			// The bundled customer.subscription.updated (testdata/events,
			// a real event at API version 2025-03-31), as evt_new and an
			// older evt_old of the same subscription.
			newer := stripeEvent(t, "evt_new", "sub_once", "past_due", "active", 1764600000)
			older := stripeEvent(t, "evt_old", "sub_once", "active", "incomplete", 1764590000)
			for i, body := range [][]byte{newer, newer, older} {
				if code := postStripe(t, handler, body); code != http.StatusOK {
					t.Fatalf("Stripe delivery %d answered %d, want 200", i+1, code)
				}
			}
			// A later change, delivered, says the relay has passed every
			// change before it.
			sentinel := addSubscriptionChanges(t, pool, "sub_sentinel")[0]
			waitAppState(t, pool, sentinel, relay.Delivered)

			var changes int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM changes WHERE subject = 'sub_once'`).Scan(&changes); err != nil {
				t.Fatal(err)
			}
			if changes != 1 {
				t.Errorf("the feed has %d changes of sub_once, want 1", changes)
			}
			var once []svixMsg
			for _, m := range app.got() {
				if m.Subject == "sub_once" {
					once = append(once, m)
				}
			}
			if len(once) != 1 {
				t.Fatalf("the app got %d webhooks of sub_once, want 1", len(once))
			}
			var body struct {
				Data struct {
					EventID *string `json:"event_id"`
					After   map[string]any
				}
			}
			if err := json.Unmarshal(once[0].Body, &body); err != nil {
				t.Fatal(err)
			}
			if deref(body.Data.EventID) != "evt_new" || body.Data.After["status"] != "past_due" {
				t.Errorf("the webhook says event %q, after %v; want evt_new's past_due", deref(body.Data.EventID), body.Data.After)
			}
		})
	}
}

const stripeTestSecret = "whsec_test_appwire"

// stripeHandler is POST /webhooks/stripe as serve builds it, on pool and
// the test Redis (or none).
func stripeHandler(t *testing.T, pool *pgxpool.Pool, noRedis bool) http.Handler {
	t.Helper()
	reg := prometheus.NewRegistry()
	prefix := "webhook"
	var claims *claim.Store
	if noRedis {
		claims = claim.NewStore(nil, claim.StoreConfig{Prefix: prefix, Timeout: 250 * time.Millisecond, ProcessingTTL: 2 * time.Minute})
	} else {
		rdb, p := dbtest.Redis(t)
		claims = claim.NewStore(rdb, claim.StoreConfig{Prefix: p, Timeout: 250 * time.Millisecond, ProcessingTTL: 2 * time.Minute})
	}
	flow := claim.NewFlow(claims, claim.FlowConfig{HandlerTimeout: 5 * time.Second, Registerer: reg})
	ep := flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: 72 * time.Hour})
	rcv := stripehook.New(stripehook.Config{Store: entitlements.NewStore(pool, reg), Secret: stripeTestSecret, Registerer: reg})
	return rcv.Handler(ep)
}

// stripeEvent is the bundled customer.subscription.updated with its id,
// subscription, status, previous status and created set.
func stripeEvent(t *testing.T, id, sub, status, prevStatus string, created int64) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../testdata/events/customer.subscription.updated.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["id"], m["created"] = id, created
	data := m["data"].(map[string]any)
	obj := data["object"].(map[string]any)
	obj["id"], obj["status"] = sub, status
	data["previous_attributes"] = map[string]any{"status": prevStatus}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// postStripe delivers body signed as Stripe signs, and returns the status.
func postStripe(t *testing.T, h http.Handler, body []byte) int {
	t.Helper()
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: stripeTestSecret, Timestamp: time.Now()})
	r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(signed.Payload))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Stripe-Signature", signed.Header)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}
