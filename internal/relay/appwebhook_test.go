package relay_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// appSecretKey is the test's signing key: 24 bytes, the Standard Webhooks
// minimum. appSecret is how the operator writes it.
var (
	appSecretKey = []byte("app-webhook-test-secret!")
	appSecret    = "whsec_" + base64.StdEncoding.EncodeToString(appSecretKey)
)

// appRequest is one request as the app received it.
type appRequest struct {
	Method string
	Header http.Header
	Body   []byte
}

// appReceiver stands in for the app: it records every request and answers
// each with the next of its answers (the last one repeating).
type appReceiver struct {
	mu       sync.Mutex
	requests []appRequest
	answers  []func(w http.ResponseWriter, r *http.Request)
}

func newAppReceiver(t *testing.T, answers ...func(w http.ResponseWriter, r *http.Request)) (*appReceiver, *httptest.Server) {
	t.Helper()
	rec := &appReceiver{answers: answers}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		n := len(rec.requests)
		rec.requests = append(rec.requests, appRequest{r.Method, r.Header.Clone(), body})
		answer := rec.answers[min(n, len(rec.answers)-1)]
		rec.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return rec, srv
}

func (rec *appReceiver) got() []appRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]appRequest(nil), rec.requests...)
}

func appStatus(code int, header ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
	}
}

func newAppWebhook(t *testing.T, url string, kinds ...string) *relay.AppWebhook {
	t.Helper()
	if len(kinds) == 0 {
		kinds = []string{ledger.KindSubscription, ledger.KindCustomerFeatures, ledger.KindCheckoutSession, ledger.KindSupportMessage}
	}
	a, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: url + "/hooks", Secret: appSecret, Kinds: kinds, AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func appStrp(s string) *string { return &s }

// appChange is a subscription's change as the feed holds it: sub_2 going
// from trialing to active.
func appChange(id int64) ledger.Change {
	at := time.Date(2026, 2, 22, 10, 0, 0, 123456000, time.UTC)
	return ledger.Change{
		ID: id, At: at, Kind: ledger.KindSubscription, Subject: "sub_2",
		StripeCustomerID: appStrp("cus_2"), EventID: appStrp("evt_1"),
		Before: json.RawMessage(`{"status":"trialing"}`), After: json.RawMessage(`{"status":"active"}`),
		Cursor: ledger.Cursor{Lo: 741, Hi: 743, Last: id},
	}
}

// appVerifyByHand checks a Standard Webhooks signature from the spec alone
// (HMAC-SHA256 over "{webhook-id}.{webhook-timestamp}.{body}", base64,
// "v1," and space-separated), not through the library that signed.
func appVerifyByHand(key []byte, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	if _, err := strconv.ParseInt(ts, 10, 64); err != nil {
		return fmt.Errorf("webhook-timestamp %q is not unix seconds", ts)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(sigs) {
		if v, sig, ok := strings.Cut(s, ","); ok && v == "v1" && hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return errors.New("no v1 signature matches")
}

// TestStandardWebhooksVector holds the hand verifier, and svix's Sign, to
// the test vector the Standard Webhooks reference libraries share
// (standard-webhooks/standard-webhooks, libraries/go/webhook_test.go,
// TestWebhookSign).
func TestStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts     = 1614265330
		body   = `{"test": 2432232314}`
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.Itoa(ts))
	h.Set("webhook-signature", "v1,bm90IGl0 "+want)
	if err := appVerifyByHand(key, h, []byte(body)); err != nil {
		t.Errorf("hand verifier refuses the spec's vector: %v", err)
	}
	h.Set("webhook-signature", "v1,bm90IGl0")
	if err := appVerifyByHand(key, h, []byte(body)); err == nil {
		t.Error("hand verifier accepts a wrong signature")
	}
	wh, err := svix.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wh.Sign(id, time.Unix(ts, 0), []byte(body))
	if err != nil || got != want {
		t.Errorf("svix Sign = %q, %v; want %q", got, err, want)
	}
}

// TestAppWebhookSigned: what the app receives verifies by the spec, by
// hand, with the secret the operator configured.
func TestAppWebhookSigned(t *testing.T) {
	t.Parallel()
	rec, srv := newAppReceiver(t, appStatus(http.StatusNoContent))
	a := newAppWebhook(t, srv.URL)
	result, err := a.Deliver(context.Background(), appChange(12))
	if err != nil || result != "204" {
		t.Fatalf("Deliver = %q, %v; want 204, nil", result, err)
	}
	reqs := rec.got()
	if len(reqs) != 1 {
		t.Fatalf("app got %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if err := appVerifyByHand(appSecretKey, r.Header, r.Body); err != nil {
		t.Errorf("signature does not verify by hand: %v", err)
	}
	if err := appVerifyByHand([]byte("another-secret-of-24byte"), r.Header, r.Body); err == nil {
		t.Error("signature verifies with another secret")
	}
	ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
	if d := time.Since(time.Unix(ts, 0)); d < -time.Minute || d > time.Minute {
		t.Errorf("webhook-timestamp %d is %s from now, want the attempt's time", ts, d)
	}
	for h, want := range map[string]string{"webhook-id": "chg_12", "Content-Type": "application/json"} {
		if got := r.Header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	if r.Method != http.MethodPost {
		t.Errorf("method %s, want POST", r.Method)
	}
}

// TestAppWebhookBody holds the body to the contract: type, timestamp and
// the change as changes tail prints it, without its cursor.
func TestAppWebhookBody(t *testing.T) {
	t.Parallel()
	created := ledger.Change{
		ID: 7, At: time.Date(2026, 2, 22, 9, 0, 0, 0, time.UTC), Kind: ledger.KindSupportMessage, Subject: "41",
		After: json.RawMessage(`{"id":41,"source":"web"}`), Cursor: ledger.Cursor{Lo: 9},
	}
	tests := []struct {
		name string
		ch   ledger.Change
		want string
	}{
		{"a changed row", appChange(12), `{"type":"subscription.changed","timestamp":"2026-02-22T10:00:00.123456Z",` +
			`"data":{"id":12,"kind":"subscription","subject":"sub_2","stripe_customer_id":"cus_2","event_id":"evt_1",` +
			`"at":"2026-02-22T10:00:00.123456Z","before":{"status":"trialing"},"after":{"status":"active"}}}`},
		{"a new row, no customer, no event", created, `{"type":"support_message.changed","timestamp":"2026-02-22T09:00:00Z",` +
			`"data":{"id":7,"kind":"support_message","subject":"41","stripe_customer_id":null,"event_id":null,` +
			`"at":"2026-02-22T09:00:00Z","before":null,"after":{"id":41,"source":"web"}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec, srv := newAppReceiver(t, appStatus(http.StatusOK))
			if _, err := newAppWebhook(t, srv.URL).Deliver(context.Background(), tt.ch); err != nil {
				t.Fatal(err)
			}
			got := string(rec.got()[0].Body)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			// The data is what changes tail prints, less the cursor.
			var tail, data map[string]any
			line, _ := json.Marshal(tt.ch)
			_ = json.Unmarshal(line, &tail)
			delete(tail, "cursor")
			var body struct{ Data json.RawMessage }
			_ = json.Unmarshal([]byte(got), &body)
			_ = json.Unmarshal(body.Data, &data)
			if diff := cmp.Diff(tail, data); diff != "" {
				t.Errorf("data differs from changes tail's line without cursor (-tail +data):\n%s", diff)
			}
		})
	}
}

// TestAppWebhookAnswers: what each answer of the app means to the relay.
func TestAppWebhookAnswers(t *testing.T) {
	t.Parallel()
	const long = "<html>" + "an error page that goes on and on " // repeated below
	tests := []struct {
		name       string
		answer     func(w http.ResponseWriter, r *http.Request)
		wantResult string
		wantErr    bool
		permanent  bool
		retryAfter time.Duration // 0: none
		errHas     string
	}{
		{"200", appStatus(200), "200", false, false, 0, ""},
		{"202", appStatus(202), "202", false, false, 0, ""},
		{"500", appStatus(500), "", true, false, 0, "500 Internal Server Error"},
		{"502", appStatus(502), "", true, false, 0, "502 Bad Gateway"},
		{"503 without Retry-After", appStatus(503), "", true, false, 0, "503 Service Unavailable"},
		{"503 with Retry-After", appStatus(503, "Retry-After", "120"), "", true, false, 2 * time.Minute, "503"},
		{"408", appStatus(408), "", true, false, 0, "408 Request Timeout"},
		{"429 with Retry-After seconds", appStatus(429, "Retry-After", "30"), "", true, false, 30 * time.Second, "429 Too Many Requests"},
		{"429 with Retry-After beyond the schedule", appStatus(429, "Retry-After", "999999"), "", true, false, 10 * time.Hour, "429"},
		{"429 with a bad Retry-After", appStatus(429, "Retry-After", "soon"), "", true, false, 0, "429"},
		{"400 with a reason", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(400)
			_, _ = io.WriteString(w, "{\"error\":\"unknown type\"}\n")
		}, "", true, true, 0, `400 Bad Request: {"error":"unknown type"}`},
		{"401", appStatus(401), "", true, true, 0, "401 Unauthorized"},
		{"410", appStatus(410), "", true, true, 0, "410 Gone"},
		{"404 with a long page", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(404)
			_, _ = io.WriteString(w, strings.Repeat(long, 500))
		}, "", true, true, 0, "404 Not Found: <html>an error page"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, srv := newAppReceiver(t, tt.answer)
			result, err := newAppWebhook(t, srv.URL).Deliver(context.Background(), appChange(3))
			if result != tt.wantResult || (err != nil) != tt.wantErr {
				t.Fatalf("Deliver = %q, %v; want %q, error %v", result, err, tt.wantResult, tt.wantErr)
			}
			if err == nil {
				return
			}
			if got := errors.Is(err, relay.ErrPermanent); got != tt.permanent {
				t.Errorf("permanent = %v, want %v (%v)", got, tt.permanent, err)
			}
			var ra *relay.RetryAfterError
			gotAfter := time.Duration(0)
			if errors.As(err, &ra) {
				gotAfter = ra.After
			}
			if gotAfter != tt.retryAfter {
				t.Errorf("retry after %s, want %s (%v)", gotAfter, tt.retryAfter, err)
			}
			if !strings.Contains(err.Error(), tt.errHas) || !strings.Contains(err.Error(), "chg_3") {
				t.Errorf("error %q does not name chg_3 and %q", err, tt.errHas)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes, want the answer bounded: %q", len(err.Error()), err)
			}
		})
	}
}

// TestAppWebhookRetryAfterDate: Retry-After may be an HTTP date.
func TestAppWebhookRetryAfterDate(t *testing.T) {
	t.Parallel()
	_, srv := newAppReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
		w.WriteHeader(429)
	})
	_, err := newAppWebhook(t, srv.URL).Deliver(context.Background(), appChange(3))
	var ra *relay.RetryAfterError
	if !errors.As(err, &ra) || ra.After < 58*time.Minute || ra.After > time.Hour {
		t.Fatalf("Deliver error %v, want a RetryAfterError of about an hour", err)
	}
}

// TestAppWebhookOneIDEveryAttempt: 500, then 503, then 200 is three
// attempts of one message: the same webhook-id and body each time, so an
// app that dedupes by webhook-id handles it once.
func TestAppWebhookOneIDEveryAttempt(t *testing.T) {
	t.Parallel()
	rec, srv := newAppReceiver(t, appStatus(500), appStatus(503), appStatus(200))
	a := newAppWebhook(t, srv.URL)
	var results []string
	for range 3 {
		result, err := a.Deliver(context.Background(), appChange(44))
		results = append(results, fmt.Sprintf("%q %v", result, err != nil))
	}
	want := []string{`"" true`, `"" true`, `"200" false`}
	if diff := cmp.Diff(want, results); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	reqs := rec.got()
	if len(reqs) != 3 {
		t.Fatalf("app got %d requests, want 3", len(reqs))
	}
	for i, r := range reqs {
		if id := r.Header.Get("webhook-id"); id != "chg_44" {
			t.Errorf("attempt %d: webhook-id %q, want chg_44", i+1, id)
		}
		if !bytes.Equal(r.Body, reqs[0].Body) {
			t.Errorf("attempt %d: body differs from the first attempt's", i+1)
		}
		if err := appVerifyByHand(appSecretKey, r.Header, r.Body); err != nil {
			t.Errorf("attempt %d: %v", i+1, err)
		}
	}
}

// TestAppWebhookNoRedirect: a 3xx is a failure, retried, and its Location
// is never visited: the signed message goes only to APP_WEBHOOK_URL.
func TestAppWebhookNoRedirect(t *testing.T) {
	t.Parallel()
	elsewhere, other := newAppReceiver(t, appStatus(200))
	for _, code := range []int{301, 302, 307, 308} {
		_, srv := newAppReceiver(t, appStatus(code, "Location", other.URL+"/hooks"))
		result, err := newAppWebhook(t, srv.URL).Deliver(context.Background(), appChange(5))
		if err == nil || result != "" {
			t.Fatalf("%d: Deliver = %q, %v; want a failure", code, result, err)
		}
		if errors.Is(err, relay.ErrPermanent) {
			t.Errorf("%d: permanent, want retried (%v)", code, err)
		}
		if !strings.Contains(err.Error(), strconv.Itoa(code)) || !strings.Contains(err.Error(), other.URL) {
			t.Errorf("%d: error %q does not name the status and where it points", code, err)
		}
	}
	if n := len(elsewhere.got()); n != 0 {
		t.Errorf("the redirect's target got %d requests, want 0", n)
	}
}

// TestAppWebhookTimeout: an app that does not answer in time is retried.
func TestAppWebhookTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	_, srv := newAppReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers
	a, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: srv.URL, Secret: appSecret, Kinds: []string{"subscription"}, AllowHTTP: true, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	result, err := a.Deliver(context.Background(), appChange(6))
	if err == nil || result != "" || errors.Is(err, relay.ErrPermanent) {
		t.Fatalf("Deliver = %q, %v; want a retried failure", result, err)
	}
	if !strings.Contains(err.Error(), "no answer within 100ms") {
		t.Errorf("error %q does not say the app did not answer in time", err)
	}
}

// TestAppWebhookUnreachable: a refused connection is retried.
func TestAppWebhookUnreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := newAppWebhook(t, url).Deliver(context.Background(), appChange(8))
	if err == nil || errors.Is(err, relay.ErrPermanent) {
		t.Fatalf("Deliver error %v, want a retried failure", err)
	}
	if strings.Contains(err.Error(), "/hooks") {
		t.Errorf("error %q repeats the URL (its query may hold the app's token)", err)
	}
}

// TestAppWebhookKinds: only the kinds asked for are this consumer's, and
// one that reaches it anyway is skipped, never sent.
func TestAppWebhookKinds(t *testing.T) {
	t.Parallel()
	rec, srv := newAppReceiver(t, appStatus(200))
	a := newAppWebhook(t, srv.URL, ledger.KindSubscription, ledger.KindCustomerFeatures, ledger.KindSubscription)
	if diff := cmp.Diff([]string{"subscription", "customer_features"}, a.Kinds()); diff != "" {
		t.Errorf("Kinds (-want +got):\n%s", diff)
	}
	ch := appChange(9)
	ch.Kind = ledger.KindSupportMessage
	_, err := a.Deliver(context.Background(), ch)
	if !errors.Is(err, relay.ErrSkip) {
		t.Errorf("Deliver of a support_message = %v, want ErrSkip", err)
	}
	if n := len(rec.got()); n != 0 {
		t.Errorf("app got %d requests, want 0", n)
	}
}

// TestNewAppWebhookRefuses: the constructor's checks, none of which
// repeats the secret.
func TestNewAppWebhookRefuses(t *testing.T) {
	t.Parallel()
	ok := relay.AppWebhookConfig{URL: "https://app.example/hooks", Secret: appSecret, Kinds: []string{"subscription"}}
	tests := []struct {
		name   string
		change func(c *relay.AppWebhookConfig)
	}{
		{"http without AllowHTTP", func(c *relay.AppWebhookConfig) { c.URL = "http://127.0.0.1:9/hooks" }},
		{"not http", func(c *relay.AppWebhookConfig) { c.URL = "ftp://app.example/hooks" }},
		{"no host", func(c *relay.AppWebhookConfig) { c.URL = "https:///hooks" }},
		{"secret without whsec_", func(c *relay.AppWebhookConfig) { c.Secret = strings.TrimPrefix(appSecret, "whsec_") }},
		{"secret not base64", func(c *relay.AppWebhookConfig) { c.Secret = "whsec_" + string(appSecretKey) }},
		{"secret too short", func(c *relay.AppWebhookConfig) {
			c.Secret = "whsec_" + base64.StdEncoding.EncodeToString(appSecretKey[:23])
		}},
		{"unknown kind", func(c *relay.AppWebhookConfig) { c.Kinds = []string{"invoice"} }},
		{"no kinds", func(c *relay.AppWebhookConfig) { c.Kinds = nil }},
	}
	if _, err := relay.NewAppWebhook(ok); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for _, tt := range tests {
		cfg := ok
		tt.change(&cfg)
		_, err := relay.NewAppWebhook(cfg)
		if err == nil {
			t.Errorf("%s: accepted", tt.name)
			continue
		}
		appNoSecret(t, err.Error())
	}
}

// appNoSecret fails the test when s holds the secret, in any form.
func appNoSecret(t *testing.T, s string) {
	t.Helper()
	for _, secret := range []string{appSecret, strings.TrimPrefix(appSecret, "whsec_"), string(appSecretKey), "test-secret"} {
		if strings.Contains(s, secret) {
			t.Errorf("%q holds the secret", s)
		}
	}
}

// TestAppWebhookSecretNeverShown: no error, log line or print of the
// destination holds its secret.
func TestAppWebhookSecretNeverShown(t *testing.T) {
	t.Parallel()
	_, srv := newAppReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		// An app that echoes what it got in its refusal.
		w.WriteHeader(400)
		_, _ = fmt.Fprintf(w, "%v", r.Header)
	})
	a := newAppWebhook(t, srv.URL)
	var shown []string
	for _, url := range []string{srv.URL, "http://127.0.0.1:1"} {
		_, err := newAppWebhook(t, url).Deliver(context.Background(), appChange(1))
		if err == nil {
			t.Fatalf("%s: delivered, want a failure", url)
		}
		shown = append(shown, err.Error())
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("relay", "destination", a)
	shown = append(shown, logs.String(), fmt.Sprintf("%v %+v %#v", a, a, *a))
	for _, s := range shown {
		appNoSecret(t, s)
	}
}
