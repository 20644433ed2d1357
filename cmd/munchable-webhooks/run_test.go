package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"

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
	url    string
	logs   *syncBuffer
	stop   context.CancelFunc
	done   chan error
	prefix string
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
	s := &service{url: "http://" + env["LISTEN_ADDR"], logs: &syncBuffer{}, stop: cancel, done: make(chan error, 1), prefix: prefix}
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
	if !strings.Contains(s.logs.String(), "REDIS_URL is empty") {
		t.Error("no startup warning about the missing REDIS_URL")
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
