package faulttest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	svix "github.com/svix/svix-webhooks/go"
)

// appSecret is the app's webhook secret in these tests: whsec_ and 32
// bytes in base64 (base64("faulttest-app-webhook-secret-32b")).
const appSecret = "whsec_ZmF1bHR0ZXN0LWFwcC13ZWJob29rLXNlY3JldC0zMmI="

// appPost is one POST the stand-in app received.
type appPost struct {
	Header http.Header
	Body   []byte
	Verify error // svix's verdict on it
}

// appReceiver stands in for the app (APP_WEBHOOK_URL): it verifies every
// POST with the Standard Webhooks library, as docs/APP.md tells an app
// to, keeps it, and holds the first one unanswered until released, so
// that the service can be killed while its delivery is in flight.
type appReceiver struct {
	wh      *svix.Webhook
	srv     *httptest.Server
	held    chan struct{} // closed once the first POST is being held
	release chan struct{}
	once    sync.Once

	mu    sync.Mutex
	posts []appPost
}

func newAppReceiver(t *testing.T) *appReceiver {
	t.Helper()
	wh, err := svix.NewWebhook(appSecret)
	if err != nil {
		t.Fatal(err)
	}
	a := &appReceiver{wh: wh, held: make(chan struct{}), release: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close) // after the release below: cleanups run in reverse
	t.Cleanup(a.unblock)
	return a
}

// unblock releases the held POST, if any.
func (a *appReceiver) unblock() { a.once.Do(func() { close(a.release) }) }

func (a *appReceiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.posts = append(a.posts, appPost{Header: r.Header.Clone(), Body: body, Verify: a.wh.Verify(body, r.Header)})
	first := len(a.posts) == 1
	a.mu.Unlock()
	if first {
		close(a.held)
		select {
		case <-a.release:
		case <-r.Context().Done(): // the service is gone
		}
	}
	w.WriteHeader(http.StatusOK)
}

// Posts returns what the app has received so far.
func (a *appReceiver) Posts() []appPost {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]appPost(nil), a.posts...)
}

// env turns the app's webhook on, for subscription changes, to a.
func (a *appReceiver) env() map[string]string {
	return map[string]string{
		"APP_WEBHOOK_URL":        a.srv.URL + "/hooks",
		"APP_WEBHOOK_SECRET":     appSecret,
		"APP_WEBHOOK_ALLOW_HTTP": "true",
		"APP_WEBHOOK_KINDS":      "subscription",
		"RELAY_RETRY_SCHEDULE":   "100ms,100ms,100ms,1h",
		// Short, so that the restarted service takes the killed one's
		// relay lease over within seconds.
		"LEADER_LEASE_TTL": leaseTTL.String(),
	}
}

// The service killed (SIGKILL) while the app holds its webhook, before
// any answer: the app's answer never reaches the relay, so nothing is
// recorded, and the restarted service sends the same webhook-id and body
// again, signed afresh. The app, which dedupes by webhook-id, handles it
// once; relay_deliveries ends with the change delivered, once.
func TestAppWebhookKilledMidDelivery(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	app := newAppReceiver(t)
	svc := r.service(app.env())
	r.waitCount("the app_webhook consumer", 1, `SELECT count(*) FROM feed_consumers WHERE name = 'app_webhook' AND enabled`)
	ev := subEvent(1, "active")
	if a := r.stripe(svc, ev); !a.OK() {
		t.Fatalf("delivery: %v", a)
	}
	select {
	case <-app.held:
	case <-time.After(60 * time.Second):
		t.Fatal("the app's webhook was never sent")
	}
	svc.Kill()
	if n := r.count(`SELECT count(*) FROM relay_deliveries WHERE consumer = 'app_webhook' AND state = 'delivered'`); n != 0 {
		t.Fatalf("%d deliveries recorded by a killed service", n)
	}
	app.unblock()
	r.start(svc)
	r.waitCount("the webhook delivered after the restart", 1,
		`SELECT count(*) FROM relay_deliveries WHERE consumer = 'app_webhook' AND state = 'delivered'`)

	var changeID int64
	if err := r.db.QueryRow(context.Background(), `SELECT id FROM changes WHERE kind = 'subscription' AND subject = $1`, ev.SubscriptionID).Scan(&changeID); err != nil {
		t.Fatalf("the subscription's change: %v", err)
	}
	if n := r.count(`SELECT count(*) FROM relay_deliveries WHERE consumer = 'app_webhook'`); n != 1 {
		t.Errorf("app_webhook deliveries = %d, want 1 (one change)", n)
	}
	if n := r.count(`SELECT count(*) FROM relay_deliveries WHERE consumer = 'app_webhook' AND change_id = $1 AND state = 'delivered'`, changeID); n != 1 {
		t.Errorf("change %d delivered %d times, want once", changeID, n)
	}
	posts := app.Posts()
	if len(posts) < 2 {
		t.Fatalf("the app got %d POSTs, want the held one and its resend", len(posts))
	}
	wantID := fmt.Sprintf("chg_%d", changeID)
	for i, p := range posts {
		if p.Verify != nil {
			t.Errorf("POST %d: svix refuses it: %v", i+1, p.Verify)
		}
		if id := p.Header.Get("webhook-id"); id != wantID {
			t.Errorf("POST %d: webhook-id %q, want %q", i+1, id, wantID)
		}
		if string(p.Body) != string(posts[0].Body) {
			t.Errorf("POST %d: body\n%s\nwant the first one's\n%s", i+1, p.Body, posts[0].Body)
		}
	}
	stamps := make([]string, len(posts))
	for i, p := range posts {
		stamps[i] = p.Header.Get("webhook-timestamp")
	}
	t.Logf("%d POSTs of %s, webhook-timestamp %s; the resent one, as the app got it:\n%s",
		len(posts), wantID, strings.Join(stamps, ", "), dumpPost(posts[len(posts)-1]))
}

// dumpPost renders a POST's headers (sorted) and body, for the log.
func dumpPost(p appPost) string {
	var b strings.Builder
	names := make([]string, 0, len(p.Header))
	for k := range p.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range p.Header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteString("\n")
	b.Write(p.Body)
	return b.String()
}
