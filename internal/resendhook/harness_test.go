package resendhook_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/support"
)

const apiKey = "re_test_9c1f0b2e"

// fakeResend answers GET /emails/receiving/{id} as Resend's "Retrieve
// Received Email" does (https://resend.com/docs/api-reference/emails/retrieve-received-email):
// the email object of testdata/received_email.json, or Resend's JSON error
// bodies (https://resend.com/docs/api-reference/errors). It counts fetches
// per id and can be told to fail or to hang.
type fakeResend struct {
	srv     *httptest.Server
	fixture []byte

	mu      sync.Mutex
	emails  map[string][]byte
	fail    map[string]int // status to answer instead of the email
	hang    map[string]bool
	fetches map[string]int
}

func newFakeResend(t *testing.T) *fakeResend {
	t.Helper()
	fixture, err := os.ReadFile("testdata/received_email.json")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeResend{
		fixture: fixture,
		emails:  map[string][]byte{},
		fail:    map[string]int{},
		hang:    map[string]bool{},
		fetches: map[string]int{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /emails/receiving/{id}", f.get)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// addEmail makes the API know a received email: the fixture under id, with
// change applied to it.
func (f *fakeResend) addEmail(t *testing.T, id string, change func(email map[string]any)) {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal(f.fixture, &e); err != nil {
		t.Fatal(err)
	}
	e["id"] = id
	if change != nil {
		change(e)
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.emails[id] = b
}

// failWith makes fetches of id answer status (500, 429, ...); 0 stops it.
func (f *fakeResend) failWith(id string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[id] = status
}

// hangOn makes fetches of id wait until the client gives up.
func (f *fakeResend) hangOn(id string, hang bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang[id] = hang
}

func (f *fakeResend) fetchCount(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fetches[id]
}

func (f *fakeResend) totalFetches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.fetches {
		n += c
	}
	return n
}

func (f *fakeResend) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	f.mu.Lock()
	f.fetches[id]++
	status, hang := f.fail[id], f.hang[id]
	body, known := f.emails[id]
	f.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	apiError := func(status int, name, message string) {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"statusCode": status, "name": name, "message": message})
	}
	switch {
	case r.Header.Get("Authorization") != "Bearer "+apiKey:
		apiError(http.StatusUnauthorized, "missing_api_key", "Missing API key in the authorization header.")
	case hang:
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second): // never outlive a broken test
		}
	case status == http.StatusTooManyRequests:
		w.Header().Set("ratelimit-limit", "2")
		w.Header().Set("ratelimit-remaining", "0")
		w.Header().Set("ratelimit-reset", "1")
		w.Header().Set("retry-after", "1")
		apiError(status, "rate_limit_exceeded", "Too many requests. Please limit the number of requests per second.")
	case status != 0:
		apiError(status, "internal_server_error", "An unexpected error occurred.")
	case !known:
		apiError(http.StatusNotFound, "not_found", "Email not found")
	default:
		_, _ = w.Write(body)
	}
}

// harness is the resend handler on a real claim flow (Redis), a real queue
// (Postgres) and the fake API.
type harness struct {
	handler http.Handler
	pool    *pgxpool.Pool
	rdb     *redis.Client // nil: Redis down
	store   *claim.Store
	api     *fakeResend
	reg     *prometheus.Registry
	wh      *svix.Webhook
}

type options struct {
	noRedis        bool
	handlerTimeout time.Duration
}

const inboundDomain = "@Inbound.Munchable.app"

func newHarness(t *testing.T, o options) *harness {
	t.Helper()
	h := &harness{pool: dbtest.NewPool(t), api: newFakeResend(t), reg: prometheus.NewRegistry()}
	prefix := "test-no-redis"
	if !o.noRedis {
		h.rdb, prefix = dbtest.Redis(t)
	}
	h.store = claim.NewStore(h.rdb, claim.StoreConfig{Prefix: prefix, Timeout: 250 * time.Millisecond, ProcessingTTL: 2 * time.Minute})
	if o.handlerTimeout == 0 {
		o.handlerTimeout = 10 * time.Second
	}
	logger := slog.New(slog.NewJSONHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	flow := claim.NewFlow(h.store, claim.FlowConfig{HandlerTimeout: o.handlerTimeout, Logger: logger, Registerer: h.reg})
	ep := flow.Endpoint(claim.Provider{Name: "resend", DedupeTTL: 30 * time.Hour})

	key := make([]byte, 24)
	rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	var err error
	if h.wh, err = svix.NewWebhook(secret); err != nil {
		t.Fatal(err)
	}
	apiURL, err := url.Parse(h.api.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	inbound, bad := resendhook.ParseInbound([]string{"Support@Munchable.app", inboundDomain})
	if len(bad) != 0 {
		t.Fatalf("inbound addresses %q refused", bad)
	}
	h.handler = resendhook.NewHandler(ep, support.NewQueue(h.pool), resendhook.Config{
		Webhook:    h.wh,
		APIKey:     apiKey,
		APIURL:     apiURL,
		Inbound:    inbound,
		Logger:     logger,
		Registerer: h.reg,
	})
	return h
}

// deliver posts body as Svix would, signed now under msgID.
func (h *harness) deliver(t *testing.T, msgID string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	return h.deliverSigned(t, h.wh, msgID, time.Now(), body)
}

func (h *harness) deliverSigned(t *testing.T, wh *svix.Webhook, msgID string, ts time.Time, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	sig, err := wh.Sign(msgID, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	return h.serve(body, http.Header{
		"Svix-Id":        {msgID},
		"Svix-Timestamp": {strconv.FormatInt(ts.Unix(), 10)},
		"Svix-Signature": {sig},
	})
}

func (h *harness) serve(body []byte, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/resend", bytes.NewReader(body))
	for k, vs := range header {
		r.Header[k] = vs
	}
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.handler.ServeHTTP(w, r)
	return w
}

// claimKeys lists every claim key this test's flow has written.
func (h *harness) claimKeys(t *testing.T) []string {
	t.Helper()
	if h.rdb == nil {
		return nil
	}
	keys, err := h.rdb.Keys(context.Background(), h.store.Key("resend", "*")).Result()
	if err != nil {
		t.Fatalf("list claim keys: %v", err)
	}
	// A failed attempt leaves its count beside the claim (for poison
	// events); that key is not a claim.
	return slices.DeleteFunc(keys, func(k string) bool { return strings.HasSuffix(k, ":failures") })
}

// claimState is the state under msgID's claim key: "" when absent.
func (h *harness) claimState(t *testing.T, msgID string) claim.State {
	t.Helper()
	e, err := h.store.Inspect(context.Background(), "resend", msgID)
	if errors.Is(err, claim.ErrAbsent) {
		return ""
	}
	if err != nil {
		t.Fatalf("read claim: %v", err)
	}
	return e.State
}

// row is a support_messages row as these tests check it.
type row struct {
	Source, ExternalID, FromAddress, FromName, ToAddress string
	Subject, TextBody, HTMLBody, MessageID               string
	ReceivedAt                                           time.Time
}

func (h *harness) rows(t *testing.T) []row {
	t.Helper()
	rs, err := h.pool.Query(context.Background(), `
SELECT source, external_id, from_address, coalesce(from_name, ''), coalesce(to_address, ''),
       coalesce(subject, ''), coalesce(text_body, ''), coalesce(html_body, ''),
       coalesce(message_id, ''), received_at
FROM support_messages ORDER BY id`)
	if err != nil {
		t.Fatalf("query support_messages: %v", err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.Source, &r.ExternalID, &r.FromAddress, &r.FromName, &r.ToAddress,
			&r.Subject, &r.TextBody, &r.HTMLBody, &r.MessageID, &r.ReceivedAt); err != nil {
			t.Fatalf("scan: %v", err)
		}
		r.ReceivedAt = r.ReceivedAt.UTC()
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("read support_messages: %v", err)
	}
	return out
}

// counter reads a counter (without labels) from the registry.
func (h *harness) counter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// receivedEvent is an email.received event as Resend sends it
// (https://resend.com/docs/webhooks/emails/received), for emailID, with
// change applied to its data.
func receivedEvent(t *testing.T, emailID string, change func(data map[string]any)) []byte {
	t.Helper()
	data := map[string]any{
		"email_id":    emailID,
		"created_at":  "2026-02-22T23:41:11.894719+00:00",
		"from":        "Ada Lovelace <ada@example.com>",
		"to":          []string{"support@munchable.app"},
		"bcc":         []string{},
		"cc":          []string{},
		"message_id":  "<CAF=4x2eJ7Q@mail.example.com>",
		"subject":     "Where is my order?",
		"attachments": []any{},
	}
	if change != nil {
		change(data)
	}
	return event(t, "email.received", data)
}

func event(t *testing.T, typ string, data any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"type": typ, "created_at": "2026-02-22T23:41:12.126Z", "data": data})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answer is a webhook answer: status, idempotency header and JSON body.
type answer struct {
	Status      int
	Idempotency string
	Body        map[string]any
}

func answerOf(t *testing.T, w *httptest.ResponseRecorder) answer {
	t.Helper()
	a := answer{Status: w.Code, Idempotency: w.Header().Get(claim.HeaderIdempotency)}
	if err := json.Unmarshal(w.Body.Bytes(), &a.Body); err != nil {
		t.Fatalf("answer %q is not JSON: %v", w.Body.String(), err)
	}
	return a
}

var (
	processed  = answer{Status: 200, Idempotency: "first", Body: map[string]any{"received": true}}
	duplicate  = answer{Status: 200, Idempotency: "duplicate", Body: map[string]any{"received": true, "skipped": true}}
	ignored    = answer{Status: 200, Body: map[string]any{"received": true, "ignored": true}}
	failed     = answer{Status: 500, Idempotency: "first", Body: map[string]any{"error": "webhook processing failed"}}
	rejected   = answer{Status: 400, Body: map[string]any{"error": "invalid webhook"}}
	degradedOK = answer{Status: 200, Idempotency: "degraded", Body: map[string]any{"received": true}}
)
