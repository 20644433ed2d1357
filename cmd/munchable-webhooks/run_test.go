package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// syncBuffer collects the service's log output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type service struct {
	url         string
	databaseURL string
	logs        *syncBuffer
	stop        context.CancelFunc
	done        chan error
	prefix      string
}

// startService runs the whole program in-process, as main does, and waits
// until it is ready.
func startService(t *testing.T, extra map[string]string) *service {
	t.Helper()
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The key prefix comes with the cleanup that deletes its keys.
	_, prefix := dbtest.Redis(t)
	env := validEnv()
	env["DATABASE_URL"] = dbtest.NewDatabase(t)
	env["REDIS_URL"] = dbtest.RedisURL(t)
	env["REDIS_KEY_PREFIX"] = prefix
	env["LISTEN_ADDR"] = "127.0.0.1:" + strconv.Itoa(port)
	for k, v := range extra {
		env[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &service{url: "http://" + env["LISTEN_ADDR"], databaseURL: env["DATABASE_URL"], logs: &syncBuffer{}, stop: cancel, done: make(chan error, 1), prefix: prefix}
	go func() { s.done <- run(ctx, []string{"munchable-webhooks"}, environ(env), s.logs, s.logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Error("service did not stop")
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		select {
		case err := <-s.done:
			t.Fatalf("service exited before ready: %v\n%s", err, s.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("service not ready after 20s\n%s", s.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *service) postStripe(t *testing.T, body []byte) *http.Response {
	t.Helper()
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: validEnv()["STRIPE_WEBHOOK_SECRET"]})
	req, _ := http.NewRequest(http.MethodPost, s.url+"/webhooks/stripe", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", signed.Header)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func fixture(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../testdata/events/customer.subscription.updated.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestServeEndToEnd(t *testing.T) {
	t.Parallel()
	s := startService(t, nil)

	resp := s.postStripe(t, fixture(t))
	if resp.StatusCode != 200 || resp.Header.Get("Webhook-Idempotency") != "first" {
		t.Fatalf("first delivery: %d %s", resp.StatusCode, resp.Header.Get("Webhook-Idempotency"))
	}
	resp = s.postStripe(t, fixture(t))
	if resp.StatusCode != 200 || resp.Header.Get("Webhook-Idempotency") != "duplicate" {
		t.Fatalf("redelivery: %d %s", resp.StatusCode, resp.Header.Get("Webhook-Idempotency"))
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		r, err := http.Get(s.url + path)
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", path, r, err)
		}
		r.Body.Close()
	}

	r, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`webhook_deliveries_total{outcome="processed",provider="stripe"} 1`,
		`webhook_deliveries_total{outcome="duplicate",provider="stripe"} 1`,
		`webhook_claim_degraded_total{provider="stripe",reason="no_redis"} 0`,
		`webhook_handler_duration_seconds_count{provider="stripe"} 1`,
		`entitlements_stale_events_total 0`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// Every log line is one JSON object, and none carries a secret.
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON: %s", line)
		}
	}
	for _, secret := range []string{"whsec_stripe_secret_value", "re_api_key_value"} {
		if strings.Contains(s.logs.String(), secret) {
			t.Errorf("logs reveal %s", secret)
		}
	}
	if !strings.Contains(s.logs.String(), `"msg":"webhook delivery"`) || !strings.Contains(s.logs.String(), `"event_id":"evt_1QmunchableUpdated0001"`) {
		t.Errorf("no delivery log line with the event id:\n%s", s.logs)
	}
}

func TestServeWithoutRedis(t *testing.T) {
	t.Parallel()
	s := startService(t, map[string]string{"REDIS_URL": ""})
	resp := s.postStripe(t, fixture(t))
	if resp.StatusCode != 200 || resp.Header.Get("Webhook-Idempotency") != "degraded" {
		t.Fatalf("delivery without redis: %d %q", resp.StatusCode, resp.Header.Get("Webhook-Idempotency"))
	}
	r, err := http.Get(s.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || !strings.Contains(string(body), "not configured") {
		t.Errorf("readyz without redis = %d %s, want 200 saying redis is not configured", r.StatusCode, body)
	}
	// The degraded flag is read into the delivery's log line, not just set.
	if logs := s.logs.String(); !strings.Contains(logs, `"degraded":true`) || !strings.Contains(logs, `"degraded_reason":"no_redis"`) {
		t.Errorf("no delivery log line marked degraded (no_redis):\n%s", logs)
	}
	if !strings.Contains(s.logs.String(), "REDIS_URL is empty") {
		t.Error("no startup warning about the missing REDIS_URL")
	}
}

// get answers GET url with its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(body)
}

// With METRICS_ADDR set, /metrics is served only on that listener (with
// /healthz and /readyz): the public one, which the load balancer exposes,
// answers 404 for it. The
// build is labelled, and the delivery log line carries its duration in ms.
func TestMetricsOnTheirOwnListener(t *testing.T) {
	t.Parallel()
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics"
	s := startService(t, map[string]string{"METRICS_ADDR": "127.0.0.1:" + strconv.Itoa(port)})
	if resp := s.postStripe(t, fixture(t)); resp.StatusCode != 200 {
		t.Fatalf("delivery: %d", resp.StatusCode)
	}

	if status, _ := get(t, s.url+"/metrics"); status != http.StatusNotFound {
		t.Errorf("public GET /metrics = %d, want 404", status)
	}
	status, metrics := get(t, metricsURL)
	if status != http.StatusOK {
		t.Fatalf("GET /metrics on METRICS_ADDR = %d, want 200", status)
	}
	for _, want := range []string{
		`webhook_deliveries_total{outcome="processed",provider="stripe"} 1`,
		`webhook_build_info{goversion="` + runtime.Version() + `",version="` + version + `"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics on METRICS_ADDR lacks %q", want)
		}
	}
	// The probes there too, so that the kubelet need not queue behind the
	// public listener's connections; the webhooks stay on the public one.
	base := strings.TrimSuffix(metricsURL, "/metrics")
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, _ := get(t, base+path); status != http.StatusOK {
			t.Errorf("GET %s on METRICS_ADDR = %d, want 200", path, status)
		}
	}
	if status, _ := get(t, base+"/support"); status != http.StatusNotFound {
		t.Errorf("GET /support on METRICS_ADDR = %d, want 404", status)
	}

	var delivery map[string]any
	for line := range strings.Lines(s.logs.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "webhook delivery" {
			delivery = m
		}
	}
	if ms, ok := delivery["duration_ms"].(float64); !ok || ms <= 0 {
		t.Errorf("delivery log line duration_ms = %v (%T), want a positive number of milliseconds: %v", delivery["duration_ms"], delivery["duration_ms"], delivery)
	}
}

// On shutdown readiness fails at once, before the listener closes, and
// run returns nil.
func TestShutdownFailsReadinessFirst(t *testing.T) {
	t.Parallel()
	s := startService(t, map[string]string{"SHUTDOWN_DELAY": "1s"})
	s.stop()
	deadline := time.Now().Add(900 * time.Millisecond)
	sawNotReady := false
	for time.Now().Before(deadline) {
		r, err := http.Get(s.url + "/readyz")
		if err != nil {
			break
		}
		r.Body.Close()
		if r.StatusCode == http.StatusServiceUnavailable {
			sawNotReady = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawNotReady {
		t.Error("readyz never answered 503 during the shutdown delay")
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("run returned %v after shutdown, want nil", err)
		}
		s.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("service did not stop")
	}
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	env := environ(map[string]string{"DATABASE_URL": dbtest.NewDatabase(t)})
	for i := range 2 {
		var out bytes.Buffer
		if err := run(t.Context(), []string{"munchable-webhooks", "migrate"}, env, &out, &out); err != nil {
			t.Fatalf("migrate #%d: %v\n%s", i+1, err, &out)
		}
		if i == 1 && !strings.Contains(out.String(), `"count":0`) {
			t.Errorf("second migrate applied something:\n%s", &out)
		}
	}
}

func TestBadConfigRefusedBeforeListening(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := run(t.Context(), []string{"munchable-webhooks", "serve"}, []string{"HANDLER_TIMEOUT=90s"}, &out, &out)
	if err == nil {
		t.Fatal("serve started without configuration")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) < 6 || !strings.Contains(err.Error(), "CLAIM_PROCESSING_TTL") || !strings.Contains(err.Error(), "DATABASE_URL is required") {
		t.Errorf("error = %q, want one line per problem", err)
	}
}

func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(t.Context(), []string{"munchable-webhooks", "frobnicate"}, nil, &out, &out); err == nil {
		t.Error("unknown command accepted")
	}
}

// The Resend path and the support form, through the whole program: one
// inbound email and one form post land in the one support queue.
func TestServeResendAndForm(t *testing.T) {
	t.Parallel()
	fixture, err := os.ReadFile("../../internal/resendhook/testdata/received_email.json")
	if err != nil {
		t.Fatal(err)
	}
	var fetches atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/emails/receiving/") || r.Header.Get("Authorization") != "Bearer re_api_key_value" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(fixture)
	}))
	t.Cleanup(api.Close)
	s := startService(t, map[string]string{"RESEND_API_URL": api.URL, "SUPPORT_FORM_RATE": "2"})

	wh, err := svix.NewWebhook(validEnv()["RESEND_WEBHOOK_SECRET"])
	if err != nil {
		t.Fatal(err)
	}
	event := []byte(`{"type":"email.received","created_at":"2026-12-01T10:00:00.000Z","data":{"email_id":"4ef9a417-02e9-4d39-ad75-9611e0fcc33c","created_at":"2026-12-01T10:00:00.000Z","from":"Ada <ada@example.com>","to":["support@munchable.app"],"cc":[],"bcc":[],"message_id":"<m1@example.com>","subject":"Help","attachments":[]}}`)
	deliver := func() *http.Response { return postResend(t, s.url, wh, "msg_e2e_1", event) }
	if r := deliver(); r.StatusCode != 200 || r.Header.Get("Webhook-Idempotency") != "first" {
		t.Fatalf("first resend delivery: %d %q", r.StatusCode, r.Header.Get("Webhook-Idempotency"))
	}
	if r := deliver(); r.StatusCode != 200 || r.Header.Get("Webhook-Idempotency") != "duplicate" {
		t.Fatalf("resend redelivery: %d %q", r.StatusCode, r.Header.Get("Webhook-Idempotency"))
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("Resend API fetched %d times, want 1", n)
	}

	form := func(key string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/support/messages",
			strings.NewReader(`{"email":"bob@example.com","name":"Bob","subject":"Hi","message":"It broke"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	first, again := form("k1"), form("k1")
	if first.StatusCode != http.StatusAccepted || again.StatusCode != http.StatusAccepted {
		t.Fatalf("form posts: %d, %d; want 202 twice", first.StatusCode, again.StatusCode)
	}
	var a, b struct{ ID int64 }
	_ = json.NewDecoder(first.Body).Decode(&a)
	_ = json.NewDecoder(again.Body).Decode(&b)
	if a.ID == 0 || a.ID != b.ID {
		t.Errorf("ids %d and %d: want the same, non-zero", a.ID, b.ID)
	}
	if r := form("k2"); r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
		t.Errorf("third post in a minute (SUPPORT_FORM_RATE=2): %d, Retry-After %q; want 429 with Retry-After", r.StatusCode, r.Header.Get("Retry-After"))
	}

	pool, err := pgxpool.New(t.Context(), s.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var email, web int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE source = 'email'), count(*) FILTER (WHERE source = 'web') FROM support_messages`).Scan(&email, &web); err != nil {
		t.Fatal(err)
	}
	if email != 1 || web != 1 {
		t.Errorf("support queue holds %d email and %d web messages, want 1 and 1", email, web)
	}
}

// A client that trickles its headers is cut off by ReadHeaderTimeout
// instead of holding a connection (and a goroutine) for as long as it likes.
func TestSlowHeadersCutOff(t *testing.T) {
	t.Parallel()
	s := startService(t, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	start := time.Now()
	if _, err := io.WriteString(conn, "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		buf := make([]byte, 512)
		for {
			if _, err := conn.Read(buf); err != nil {
				return
			}
		}
	}()
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-closed:
			if elapsed := time.Since(start); elapsed > 10*time.Second {
				t.Errorf("slow client cut off after %s, want about the 5s ReadHeaderTimeout", elapsed)
			}
			return
		case <-ticker.C:
			// One more header byte, never the end of the headers.
			_, _ = io.WriteString(conn, "X")
			if time.Since(start) > 15*time.Second {
				t.Fatal("a client trickling headers was still connected after 15s")
			}
		}
	}
}

// postResend signs event as Svix would, under svix-id id, posts it to the
// service at url and returns the answer (its body closed).
func postResend(t *testing.T, url string, wh *svix.Webhook, id string, event []byte) *http.Response {
	t.Helper()
	now := time.Now()
	sig, err := wh.Sign(id, now, event)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/webhooks/resend", bytes.NewReader(event))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("svix-id", id)
	req.Header.Set("svix-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("svix-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}
