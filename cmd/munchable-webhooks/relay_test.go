package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/support"
)

func TestRelayCommandLine(t *testing.T) {
	t.Parallel()
	env := nowhere(t)
	for _, args := range [][]string{{"relay", "-h"}, {"relay", "help"}, {"relay", "list", "-h"}, {"relay", "retry", "forward", "1", "-h"}} {
		if err := wantUsage(t, env, args, "stdout"); err != nil {
			t.Errorf("%q: err = %v, want nil (help acted?)", args, err)
		}
	}
	for _, args := range [][]string{
		{"relay"}, {"relay", "purge"}, {"relay", "list", "--state", "lost"}, {"relay", "list", "extra"},
		{"relay", "retry", "forward"}, {"relay", "retry", "forward", "x"}, {"relay", "retry", "forward", "0"},
		{"relay", "retry", "--consumer", "forward"}, {"relay", "retry", "--state", "dead"},
		{"relay", "retry", "--consumer", "forward", "--state", "delivered"},
		{"relay", "retry", "--consumer", "forward", "--state", "dead", "--since", "yesterday"},
		{"relay", "retry", "--consumer", "forward", "--state", "dead", "--rate", "0"},
		{"relay", "retry", "--consumer", "forward", "--state", "dead", "forward", "7"},
	} {
		if err := wantUsage(t, env, args, "stderr"); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

// TestChangesTailExpiredCursor: a cursor older than what retention
// deleted is refused with ErrCursorExpired (main exits 4 on it), never
// read on with a silent gap.
func TestChangesTailExpiredCursor(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.NewDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL}
	_, stderr, err := runCmd(t, env, "changes", "tail")
	if err != nil {
		t.Fatal(err)
	}
	cursor := strings.TrimSpace(strings.TrimPrefix(stderr, "cursor "))
	c, err := ledger.ParseCursor(cursor)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, env, "changes", "tail", "--after", cursor); err != nil {
		t.Fatalf("tail --after a fresh cursor: %v", err)
	}
	// Retention deleted a change at the cursor's floor.
	pool := newPool(t, dbURL)
	if _, err := pool.Exec(context.Background(), `UPDATE changes_trimmed SET through_txid = $1::text::xid8`, fmt.Sprint(c.Floor())); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCmd(t, env, "changes", "tail", "--after", cursor)
	if !errors.Is(err, ledger.ErrCursorExpired) || !strings.Contains(err.Error(), "older than the oldest change kept") {
		t.Errorf("tail --after an expired cursor: %v, want ErrCursorExpired (exit 4)", err)
	}
	if _, _, err := runCmd(t, env, "changes", "tail"); err != nil {
		t.Errorf("tail from the start of what is kept: %v", err)
	}
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestRelayListAndRetry: a dead forward is listed, and relay retry sends
// it with its Idempotency-Key and records it delivered.
func TestRelayListAndRetry(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	resend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"email_retried"}`)
	}))
	t.Cleanup(resend.Close)
	dbURL := dbtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	ctx := context.Background()
	id := queueFormMessage(t, pool, "form:1")
	change := fmt.Sprintf(`{"id":7,"kind":"support_message","subject":"%d","after":{"id":%d}}`, id, id)
	if _, err := pool.Exec(ctx, `INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, last_error, change)
VALUES ('forward', 7, $1, $1, 'dead', 8, 'resend answered 503', $2)`, fmt.Sprint(id), change); err != nil {
		t.Fatal(err)
	}
	env := validEnv()
	env["DATABASE_URL"] = dbURL
	env["RESEND_API_URL"] = resend.URL
	env["SUPPORT_FORWARD_TO"] = "team@munchable.app"
	env["SUPPORT_FORWARD_FROM"] = "support-forward@munchable.app"

	out, _, err := runCmd(t, env, "relay", "list", "--consumer", "forward", "--state", "dead")
	var listed relay.Delivery
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || listed.ChangeID != 7 || listed.State != relay.Dead {
		t.Fatalf("relay list --state dead = %q, %v; want change 7 dead", out, err)
	}
	out, stderr, err := runCmd(t, env, "relay", "retry", "forward", "7")
	var got relay.Delivery
	if err != nil || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("relay retry = %q, %v\n%s", out, err, stderr)
	}
	if got.State != relay.Delivered || got.Result == nil || *got.Result != "email_retried" {
		t.Errorf("after relay retry: %+v, want delivered with Resend's email id", got)
	}
	mu.Lock()
	if want := fmt.Sprintf("support-message/%d", id); len(keys) != 1 || keys[0] != want {
		t.Errorf("Idempotency-Keys sent = %q, want [%s]", keys, want)
	}
	mu.Unlock()
	if _, _, err := runCmd(t, env, "relay", "retry", "forward", "7"); !errors.Is(err, relay.ErrNotRetryable) {
		t.Errorf("retry of a delivered forward: %v, want ErrNotRetryable", err)
	}
	// stdout holds JSON lines only; stderr says the list was read.
	if out, stderr, err := runCmd(t, env, "relay", "list", "--state", "dead"); err != nil || out != "" || stderr != "0 deliveries\n" {
		t.Errorf("relay list --state dead after the retry = %q, stderr %q, %v; want nothing and 0 deliveries", out, stderr, err)
	}
}

// TestRelayRetryByState: relay retry --consumer --state dead sends every
// dead forward again, older changes first, leaves the failed one and those
// taken before --since alone, and prints each and a summary.
func TestRelayRetryByState(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	var failing string // the support message whose forward Resend refuses
	resend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if strings.HasSuffix(r.Header.Get("Idempotency-Key"), "/"+failing) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"email_%d"}`, n)
	}))
	t.Cleanup(resend.Close)
	dbURL := dbtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	ctx := context.Background()
	var ids []int64
	failing = "none"
	for i := range 4 {
		ids = append(ids, queueFormMessage(t, pool, fmt.Sprintf("form:%d", i)))
	}
	// Changes 11 and 12 dead this weekend, 13 failed, 10 dead a month ago.
	for i, row := range []struct {
		change int64
		state  string
		age    string
	}{{10, "dead", "30 days"}, {11, "dead", "2 days"}, {12, "dead", "1 day"}, {13, "failed", "1 hour"}} {
		change := fmt.Sprintf(`{"id":%d,"kind":"support_message","subject":"%d","after":{"id":%d}}`, row.change, ids[i], ids[i])
		if _, err := pool.Exec(ctx, `INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, last_error, change, created_at, next_attempt_at)
VALUES ('forward', $1, $2, $2, $3, 8, 'resend answered 503', $4, now() - $5::interval, now() + interval '1 hour')`,
			row.change, fmt.Sprint(ids[i]), row.state, change, row.age); err != nil {
			t.Fatal(err)
		}
	}
	env := validEnv()
	env["DATABASE_URL"] = dbURL
	env["RESEND_API_URL"] = resend.URL
	env["SUPPORT_FORWARD_TO"] = "team@munchable.app"
	env["SUPPORT_FORWARD_FROM"] = "support-forward@munchable.app"

	out, stderr, err := runCmd(t, env, "relay", "retry", "--consumer", "forward", "--state", "dead", "--since", "72h", "--rate", "50")
	if err != nil {
		t.Fatalf("relay retry --state dead: %v\n%s", err, stderr)
	}
	var got []int64
	for line := range strings.Lines(out) {
		var d relay.Delivery
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if d.State != relay.Delivered {
			t.Errorf("change %d: %s, want delivered", d.ChangeID, d.State)
		}
		got = append(got, d.ChangeID)
	}
	if want := []int64{11, 12}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("retried %v, want %v", got, want)
	}
	if !strings.Contains(stderr, "2 matched, 2 attempted: 2 delivered") {
		t.Errorf("summary %q, want 2 matched, 2 attempted: 2 delivered", stderr)
	}
	mu.Lock()
	if want := []string{fmt.Sprintf("support-message/%d", ids[1]), fmt.Sprintf("support-message/%d", ids[2])}; fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("Idempotency-Keys sent = %q, want %q", keys, want)
	}
	mu.Unlock()
	var states []string
	rows, err := pool.Query(ctx, `SELECT state FROM relay_deliveries ORDER BY change_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		states = append(states, s)
	}
	if want := "[dead delivered delivered failed]"; fmt.Sprint(states) != want {
		t.Errorf("states %v, want %s", states, want)
	}
	var hand int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_hand_attempts WHERE consumer = 'forward' AND outcome = 'delivered'`).Scan(&hand); err != nil || hand != 2 {
		t.Errorf("%d hand attempts left for the leader to count (%v), want 2", hand, err)
	}

	// Resend still refuses the failed one: the retry says so on stderr,
	// as the service's log would, and exits 1.
	mu.Lock()
	failing = fmt.Sprint(ids[3])
	mu.Unlock()
	if _, err := pool.Exec(ctx, `UPDATE relay_deliveries SET attempts = 1 WHERE change_id = 13`); err != nil {
		t.Fatal(err)
	}
	_, stderr, err = runCmd(t, env, "relay", "retry", "--consumer", "forward", "--state", "failed")
	if !errors.Is(err, errNotDelivered) {
		t.Errorf("relay retry --state failed with Resend refusing: %v, want errNotDelivered", err)
	}
	if !strings.Contains(stderr, `"msg":"relay: delivery attempt failed"`) || !strings.Contains(stderr, `"change_id":13`) ||
		!strings.Contains(stderr, "1 matched, 1 attempted: 1 failed") {
		t.Errorf("stderr %q, want the failed attempt's warn line and the summary", stderr)
	}
}

// TestRelayRetryTraced: with OTEL_EXPORTER_OTLP_ENDPOINT set, relay retry
// traces its attempt as the service's relay does: a span "relay forward"
// for the change, in the trace of the delivery that made it.
func TestRelayRetryTraced(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	t.Cleanup(collector.Close)
	resend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"email_retried"}`)
	}))
	t.Cleanup(resend.Close)
	dbURL := dbtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	ctx := context.Background()
	id := queueFormMessage(t, pool, "form:1")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	change := fmt.Sprintf(`{"id":7,"kind":"support_message","subject":"%d","after":{"id":%d},"traceparent":"00-%s-00f067aa0ba902b7-01"}`, id, id, traceID)
	if _, err := pool.Exec(ctx, `INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, last_error, change)
VALUES ('forward', 7, $1, $1, 'dead', 8, 'resend answered 503', $2)`, fmt.Sprint(id), change); err != nil {
		t.Fatal(err)
	}
	env := validEnv()
	env["DATABASE_URL"] = dbURL
	env["RESEND_API_URL"] = resend.URL
	env["SUPPORT_FORWARD_TO"] = "team@munchable.app"
	env["SUPPORT_FORWARD_FROM"] = "support-forward@munchable.app"
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.URL
	if out, stderr, err := runCmd(t, env, "relay", "retry", "forward", "7"); err != nil {
		t.Fatalf("relay retry = %q, %v\n%s", out, err, stderr)
	}
	// relay retry flushes its spans before it returns.
	var names []string
	for _, s := range receiver.all() {
		names = append(names, s.name)
		if s.name == "relay forward" && s.attrs["relay.change_id"] == "7" && s.trace == traceID {
			return
		}
	}
	t.Errorf("spans exported %q, want relay forward for change 7 in trace %s", names, traceID)
}

// queueFormMessage queues one form post (the support message the relay
// tests forward) and returns its id.
func queueFormMessage(t *testing.T, pool *pgxpool.Pool, externalID string) int64 {
	t.Helper()
	id, _, err := support.NewQueue(pool).Enqueue(context.Background(), support.Message{Source: support.SourceWeb, ExternalID: externalID,
		FromAddress: "bob@example.org", Subject: "Billing", TextBody: "Charged twice"})
	if err != nil {
		t.Fatal(err)
	}
	return id
}
