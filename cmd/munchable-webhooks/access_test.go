package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// TestAPITokenConfig: a short or blank token is refused, without the
// tokens in the message.
func TestAPITokenConfig(t *testing.T) {
	t.Parallel()
	for _, tokens := range []string{"short-tok-1", " , ", "0123456789abcdefXYZ,short-tok-1"} {
		env := validEnv()
		env["APP_API_TOKEN"] = tokens
		_, err := loadConfig(environ(env))
		if err == nil || !strings.Contains(err.Error(), "APP_API_TOKEN") {
			t.Errorf("APP_API_TOKEN=%q: %v, want refused", tokens, err)
			continue
		}
		for tok := range strings.SplitSeq(tokens, ",") {
			if tok = strings.TrimSpace(tok); tok != "" && strings.Contains(err.Error(), tok) {
				t.Errorf("the error quotes a token: %v", err)
			}
		}
	}
	env := validEnv()
	env["APP_API_TOKEN"] = "0123456789abcdefXYZ, fedcba9876543210XYZ"
	cfg, err := loadConfig(environ(env))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.apiTokens(); len(got) != 2 || got[1] != "fedcba9876543210XYZ" {
		t.Errorf("tokens %q, want both, trimmed", got)
	}
}

// TestAccessAPIServed: with METRICS_ADDR, GET /v1/access is served there,
// never on the public listener; it refuses without a token (401, JSON)
// and answers a delivered subscription's customer as customer_access
// has it. Without APP_API_TOKEN it is not served at all.
func TestAccessAPIServed(t *testing.T) {
	t.Parallel()
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const token = "test-token-0123456789"
	private := "http://127.0.0.1:" + strconv.Itoa(port)
	s := startService(t, map[string]string{"METRICS_ADDR": "127.0.0.1:" + strconv.Itoa(port), "APP_API_TOKEN": token})
	if resp := s.postStripe(t, fixture(t)); resp.StatusCode != 200 {
		t.Fatalf("delivery: %d", resp.StatusCode)
	}
	var sub, customer string
	conn, err := pgx.Connect(t.Context(), s.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(t.Context(), `SELECT stripe_subscription_id, stripe_customer_id FROM customer_access`).Scan(&sub, &customer); err != nil {
		t.Fatal(err)
	}
	ask := func(base, auth string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/access?stripe_subscription_id="+sub, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.Bytes()
	}
	if code, _ := ask(s.url, "Bearer "+token); code != http.StatusNotFound {
		t.Errorf("public listener: %d, want 404 (METRICS_ADDR serves the API)", code)
	}
	if code, body := ask(private, ""); code != http.StatusUnauthorized || !json.Valid(body) {
		t.Errorf("without a token: %d %s, want 401 and JSON", code, body)
	}
	code, body := ask(private, "Bearer "+token)
	var got struct {
		Data []struct {
			StripeCustomerID string `json:"stripe_customer_id"`
			Subscriptions    []struct {
				ID string `json:"stripe_subscription_id"`
			} `json:"subscriptions"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil || len(got.Data) != 1 ||
		got.Data[0].StripeCustomerID != customer || len(got.Data[0].Subscriptions) != 1 || got.Data[0].Subscriptions[0].ID != sub {
		t.Errorf("with the token: %d %s, want %s's answer with %s", code, body, customer, sub)
	}
	if strings.Contains(s.logs.String(), token) {
		t.Error("the service logged the token")
	}

	off := startService(t, nil)
	if code, _ := ask(off.url, "Bearer "+token); code != http.StatusNotFound {
		t.Errorf("without APP_API_TOKEN: %d, want 404", code)
	}
}

// TestBackfillCommand: relay backfill app_webhook (or app_access) sends the one
// customer's answer, verified by the app with svix, prints progress on
// stderr and the summary on stdout; a wrong consumer or rate is a usage
// error, and an app without access is refused.
func TestBackfillCommand(t *testing.T) {
	t.Parallel()
	env := nowhere(t)
	for _, args := range [][]string{
		{"relay", "backfill"}, {"relay", "backfill", "forward"}, {"relay", "backfill", "app_webhook", "--rate", "0"},
	} {
		if err := wantUsage(t, env, args, "stderr"); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
	const secret = "whsec_YXBwLWJhY2tmaWxsLXRlc3Qtc2VjcmV0LTEyMzQ="
	wh, err := svix.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := wh.Verify(body, r.Header); err != nil {
			t.Errorf("svix refuses the backfill: %v", err)
		}
		mu.Lock()
		got = append(got, r.Header.Get("webhook-id"))
		mu.Unlock()
	}))
	t.Cleanup(app.Close)
	s := startService(t, nil)
	if resp := s.postStripe(t, fixture(t)); resp.StatusCode != 200 {
		t.Fatalf("delivery: %d", resp.StatusCode)
	}
	cfg := validEnv()
	cfg["DATABASE_URL"] = s.databaseURL
	cfg["APP_WEBHOOK_URL"], cfg["APP_WEBHOOK_SECRET"], cfg["APP_WEBHOOK_ALLOW_HTTP"] = app.URL+"/hooks", secret, "true"
	if _, _, err := runCmd(t, cfg, "relay", "backfill", "app_webhook"); err == nil || !strings.Contains(err.Error(), "access") {
		t.Errorf("backfill without access in APP_WEBHOOK_KINDS: %v, want refused", err)
	}
	cfg["APP_WEBHOOK_KINDS"] = "access"
	// The contract's spelling, and the consumer that sends access.changed.
	for _, consumer := range []string{"app_webhook", "app_access"} {
		out, stderr, err := runCmd(t, cfg, "relay", "backfill", consumer, "--rate", "100")
		if err != nil {
			t.Fatalf("backfill %s: %v\n%s", consumer, err, stderr)
		}
		if !strings.Contains(out, `{"customers":1,"delivered":1,"failed":[],"next":""}`) || !strings.Contains(stderr, "1 delivered") {
			t.Errorf("backfill %s printed %q and %q, want its summary and progress", consumer, out, stderr)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || !strings.HasPrefix(got[0], "acc_cus_") || !strings.HasPrefix(got[1], "acc_cus_") {
		t.Errorf("the app got %q, want one acc_ webhook a backfill", got)
	}
}

// TestRelayRetryAppAccess: access.changed is the consumer app_access,
// and relay retry finds it in the service's configuration: a dead one
// is sent again, as the customer's answer now, and recorded delivered.
func TestRelayRetryAppAccess(t *testing.T) {
	t.Parallel()
	const secret = "whsec_YXBwLWFjY2Vzcy1yZXRyeS10ZXN0LXNlY3JldC0xMjM="
	var mu sync.Mutex
	var got []string
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Get("webhook-id"))
		mu.Unlock()
	}))
	t.Cleanup(app.Close)
	dbURL := dbtest.NewDatabase(t)
	pool := newPool(t, dbURL)
	change := `{"id":7,"kind":"subscription","subject":"sub_r1","stripe_customer_id":"cus_r1","before":null,"after":{"status":"active"}}`
	if _, err := pool.Exec(context.Background(), `INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, last_error, change)
VALUES ('app_access', 7, 'sub_r1', 'cus_r1', 'dead', 8, 'app answered 503', $1)`, change); err != nil {
		t.Fatal(err)
	}
	env := validEnv()
	env["DATABASE_URL"] = dbURL
	env["APP_WEBHOOK_URL"], env["APP_WEBHOOK_SECRET"], env["APP_WEBHOOK_ALLOW_HTTP"] = app.URL+"/hooks", secret, "true"
	env["APP_WEBHOOK_KINDS"] = "subscription,access"
	out, stderr, err := runCmd(t, env, "relay", "retry", "app_access", "7")
	var d relay.Delivery
	if err != nil || json.Unmarshal([]byte(out), &d) != nil || d.State != relay.Delivered {
		t.Fatalf("relay retry app_access 7 = %q, %v\n%s; want delivered", out, err, stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !strings.HasPrefix(got[0], "acc_cus_r1_") {
		t.Errorf("the app got %q, want one acc_cus_r1_ webhook", got)
	}
}
