package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// runCmd runs the program in-process with env and returns its streams.
func runCmd(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(t.Context(), append([]string{"munchable-webhooks"}, args...), environ(env), &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestEventsAndChangesCommandLine(t *testing.T) {
	t.Parallel()
	env := nowhere(t)
	for _, args := range [][]string{
		{"events", "-h"}, {"events", "help"}, {"events", "show", "-h"}, {"events", "list", "--help"},
		{"events", "retry", "stripe", "evt_1", "-h"}, {"changes", "-h"}, {"changes", "tail", "-h"},
	} {
		if err := wantUsage(t, env, args, "stdout"); err != nil {
			t.Errorf("%q: err = %v, want nil (help acted?)", args, err)
		}
	}
	for _, args := range [][]string{
		{"events"}, {"events", "purge"}, {"events", "show", "stripe"}, {"events", "show", "paypal", "evt_1"},
		{"events", "list", "--outcome", "maybe"}, {"events", "list", "--since", "-1h"}, {"events", "retry"},
		{"changes"}, {"changes", "head"}, {"changes", "tail", "--after", "nonsense"}, {"changes", "tail", "extra"},
	} {
		if err := wantUsage(t, env, args, "stderr"); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
	// A mistake is answered with the form wanted, not just refused.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"events", "list", "--outcome", "ignored"}, "an ignored event has no ledger row"},
		{[]string{"events", "list", "--since", "yesterday"}, "a positive duration such as 90m, 24h or 168h"},
		{[]string{"changes", "tail", "--after", "42"}, "not a change id"},
	} {
		if err := wantUsage(t, env, c.args, "stderr"); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
}

// ledgerEnv is the service's environment, as an operator's shell in its
// pod has it.
func ledgerEnv(s *service, extra map[string]string) map[string]string {
	env := validEnv()
	env["DATABASE_URL"] = s.databaseURL
	env["REDIS_URL"] = os.Getenv("TEST_REDIS_URL")
	env["REDIS_KEY_PREFIX"] = s.prefix
	env["LOG_LEVEL"] = "warn"
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// TestRetryFailedMail: a mail whose fetch failed is failed in the ledger
// with its body kept; once the API answers, events retry queues it, the
// ledger says applied, show tells the whole story and tail prints its
// change.
func TestRetryFailedMail(t *testing.T) {
	t.Parallel()
	fixture, err := os.ReadFile("../../internal/resendhook/testdata/received_email.json")
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, `{"message":"unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(fixture)
	}))
	t.Cleanup(api.Close)
	s := startService(t, map[string]string{"RESEND_API_URL": api.URL})
	env := ledgerEnv(s, map[string]string{"RESEND_API_URL": api.URL})

	wh, err := svix.NewWebhook(validEnv()["RESEND_WEBHOOK_SECRET"])
	if err != nil {
		t.Fatal(err)
	}
	event := []byte(`{"type":"email.received","created_at":"2026-12-01T10:00:00.000Z","data":{"email_id":"4ef9a417-02e9-4d39-ad75-9611e0fcc33c","created_at":"2026-12-01T10:00:00.000Z","from":"Ada <ada@example.com>","to":["support@munchable.app"],"message_id":"<m1@example.com>","subject":"Help","attachments":[]}}`)
	resp := postResend(t, s.url, wh, "msg_retry_1", event)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("delivery with the API down: %d, want 500", resp.StatusCode)
	}

	out, _, err := runCmd(t, env, "events", "list", "--outcome", "failed")
	if err != nil || !strings.Contains(out, `"event_id":"msg_retry_1"`) || !strings.Contains(out, `"body_bytes":`+strconv.Itoa(len(event))) {
		t.Fatalf("events list --outcome failed = %q, %v; want the mail with its body kept", out, err)
	}
	down.Store(false)
	out, stderr, err := runCmd(t, env, "events", "retry", "resend", "msg_retry_1")
	if err != nil || !strings.Contains(out, "processed (applied)") {
		t.Fatalf("events retry = %q, %v\n%s", out, err, stderr)
	}
	out, _, err = runCmd(t, env, "events", "show", "resend", "msg_retry_1")
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Event struct {
			Outcome   string
			Attempts  int
			BodyBytes int     `json:"body_bytes"`
			LastError *string `json:"last_error"`
		}
		Claim   string
		Changes []struct{ Kind string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("events show: %v\n%s", err, out)
	}
	if e := report.Event; e.Outcome != "applied" || e.Attempts != 2 || e.BodyBytes != 0 || e.LastError == nil {
		t.Errorf("after the retry: %+v, want applied, 2 attempts, body dropped, the last error kept", e)
	}
	if !strings.Contains(report.Claim, " done ") || len(report.Changes) != 1 || report.Changes[0].Kind != "support_message" {
		t.Errorf("claim %q, changes %+v; want done and one support_message change", report.Claim, report.Changes)
	}
	if _, _, err := runCmd(t, env, "events", "retry", "resend", "msg_retry_1"); err == nil {
		t.Error("retrying an applied event: want an error")
	}
	// Nothing failed any more: stdout stays empty (JSON lines only), and
	// stderr says the list was read.
	if out, stderr, err := runCmd(t, env, "events", "list", "--outcome", "failed"); err != nil || out != "" || stderr != "0 events\n" {
		t.Errorf("events list --outcome failed after the retry = %q, stderr %q, %v; want nothing and 0 events", out, stderr, err)
	}

	// The feed shows a change once no open transaction on the server can
	// precede it: another package's test holding one open delays it, so
	// tail is read until it shows the change, as a consumer would poll.
	var lines int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, stderr, err = runCmd(t, env, "changes", "tail")
		if err != nil {
			t.Fatal(err)
		}
		lines = 0
		for sc := bufio.NewScanner(strings.NewReader(out)); sc.Scan(); {
			lines++
		}
		if lines > 0 || time.Now().After(deadline) {
			break
		}
	}
	if lines != 1 || !strings.Contains(out, `"kind":"support_message"`) || !strings.HasPrefix(stderr, "cursor c2.") {
		t.Errorf("changes tail = %q, stderr %q; want one change and the cursor", out, stderr)
	}
	// A Message-ID prints as the mail has it, not HTML-escaped.
	if !strings.Contains(out, `"message_id":"<CAF=4x2eJ7Q@mail.example.com>"`) {
		t.Errorf("changes tail = %q; want the fetched mail's message_id as <CAF=4x2eJ7Q@mail.example.com>", out)
	}
	cursor := strings.TrimSpace(strings.TrimPrefix(stderr, "cursor "))
	if out, _, err := runCmd(t, env, "changes", "tail", "--after", cursor); err != nil || out != "" {
		t.Errorf("tail --after the cursor = %q, %v; want nothing", out, err)
	}
}

// TestRetryDeadStripeEvent: a subscription event whose cut item list
// cannot be completed (the API fails) fails until it is dead; events retry
// without an API key runs it from the kept body, storing what it carried.
func TestRetryDeadStripeEvent(t *testing.T) {
	t.Parallel()
	api := stripetest.New(t)
	api.FailNext(1000, http.StatusInternalServerError)
	s := startService(t, map[string]string{
		"STRIPE_API_KEY": stripetest.Key, "STRIPE_API_URL": api.URL().String(), "POISON_AFTER": "2",
	})
	var ev map[string]any
	if err := json.Unmarshal(fixture(t), &ev); err != nil {
		t.Fatal(err)
	}
	ev["data"].(map[string]any)["object"].(map[string]any)["items"].(map[string]any)["has_more"] = true
	body, _ := json.Marshal(ev)
	id := ev["id"].(string)
	for i := range 2 {
		if r := s.postStripe(t, body); r.StatusCode != http.StatusInternalServerError {
			t.Fatalf("delivery %d with the API failing: %d, want 500", i+1, r.StatusCode)
		}
	}
	env := ledgerEnv(s, nil)
	out, _, err := runCmd(t, env, "events", "list", "--outcome", "dead")
	if err != nil || !strings.Contains(out, `"event_id":"`+id+`"`) || !strings.Contains(out, `"attempts":2`) {
		t.Fatalf("events list --outcome dead = %q, %v", out, err)
	}
	out, stderr, err := runCmd(t, env, "events", "retry", "stripe", id)
	if err != nil || !strings.Contains(out, "from the kept body: processed (applied)") {
		t.Fatalf("events retry = %q, %v\n%s", out, err, stderr)
	}
	out, _, err = runCmd(t, env, "events", "show", "stripe", id)
	if err != nil || !strings.Contains(out, `"outcome": "applied"`) || !strings.Contains(out, `"kind": "subscription"`) {
		t.Errorf("events show after the retry = %q, %v", out, err)
	}
}

// A command run in a terminal logs only what needs a person, unless
// LOG_LEVEL asks for more.
func TestOperatorLogLevel(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		environ []string
		level   slog.Level
		want    slog.Level
	}{
		{nil, slog.LevelInfo, slog.LevelWarn},
		{[]string{"DATABASE_URL=x"}, slog.LevelInfo, slog.LevelWarn},
		{[]string{"LOG_LEVEL=info"}, slog.LevelInfo, slog.LevelInfo},
		{[]string{"LOG_LEVEL=debug"}, slog.LevelDebug, slog.LevelDebug},
		{nil, slog.LevelError, slog.LevelError},
	} {
		if got := operatorLogLevel(tt.environ, tt.level); got != tt.want {
			t.Errorf("operatorLogLevel(%q, %s) = %s, want %s", tt.environ, tt.level, got, tt.want)
		}
	}
}
