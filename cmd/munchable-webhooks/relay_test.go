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
	id, _, err := support.NewQueue(pool).Enqueue(ctx, support.Message{Source: support.SourceWeb, ExternalID: "form:1",
		FromAddress: "bob@example.org", Subject: "Billing", TextBody: "Charged twice"})
	if err != nil {
		t.Fatal(err)
	}
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
