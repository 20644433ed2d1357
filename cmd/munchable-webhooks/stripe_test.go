package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// The stripe commands print one summary line each on stdout; sync and
// replay themselves are tested in internal/stripesync.
func TestStripeCommandsOutput(t *testing.T) {
	t.Parallel()
	api := stripetest.New(t)
	fx := stripetest.LoadFixtures(t)
	created := time.Now().Add(-time.Hour).Unix()
	sub := fx.Subscription(stripetest.Subscription{ID: "sub_out", Customer: "cus_out", Status: "active",
		PriceID: "price_basic", Created: created, PeriodEnd: created + 30*86400})
	api.PutSubscription(sub)
	api.AddEvent(fx.Event("evt_out", "customer.subscription.created", created, sub, nil), false)
	_, prefix := dbtest.Redis(t)
	env := map[string]string{
		"DATABASE_URL": dbtest.NewDatabase(t), "STRIPE_API_KEY": stripetest.Key, "STRIPE_API_URL": api.URL().String(),
		"REDIS_URL": dbtest.RedisURL(t), "REDIS_KEY_PREFIX": prefix, "LOG_LEVEL": "warn",
	}
	tests := []struct {
		args []string
		want string // the line's beginning
	}{
		{[]string{"sync"}, "stripe sync: 1 subscriptions (1 stored, 0 kept, 0 invalid), 1 customers' entitlements (1 stored, 0 kept, 0 skipped), 2 API requests in "},
		{[]string{"replay", "--since", "24h"}, "stripe replay: 1 events: "},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		if err := run(t.Context(), append([]string{"munchable-webhooks", "stripe"}, tt.args...), environ(env), &stdout, &stderr); err != nil {
			t.Errorf("stripe %s: %v\n%s", strings.Join(tt.args, " "), err, stderr.String())
		}
		if got := stdout.String(); !strings.HasPrefix(got, tt.want) || strings.Count(got, "\n") != 1 {
			t.Errorf("stripe %s: stdout = %q, want one line beginning %q", strings.Join(tt.args, " "), got, tt.want)
		}
	}
}

// stripe verify prints a JSON line per drifted row and a summary, and
// its verdict is errDrift (exit 3) on drift, nil in sync; --repair
// mends, and the next verify is in sync.
func TestStripeVerifyOutput(t *testing.T) {
	t.Parallel()
	api := stripetest.New(t)
	fx := stripetest.LoadFixtures(t)
	created := time.Now().Add(-time.Hour).Unix()
	api.PutSubscription(fx.Subscription(stripetest.Subscription{ID: "sub_vout", Customer: "cus_vout", Status: "active",
		PriceID: "price_basic", Created: created, PeriodEnd: created + 30*86400}))
	env := environ(map[string]string{
		"DATABASE_URL": dbtest.NewDatabase(t), "STRIPE_API_KEY": stripetest.Key, "STRIPE_API_URL": api.URL().String(), "LOG_LEVEL": "warn",
	})
	verify := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), append([]string{"munchable-webhooks", "stripe", "verify"}, args...), env, &stdout, &stderr)
		return stdout.String(), err
	}
	out, err := verify()
	if !errors.Is(err, errDrift) {
		t.Fatalf("verify of an empty table: err = %v, want errDrift", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != `{"kind":"subscription","id":"sub_vout","fields":{"exists":{"stored":false,"stripe":true}}}` ||
		!strings.HasPrefix(lines[1], "stripe verify: 1 subscriptions and 1 customers compared") {
		t.Errorf("verify stdout =\n%s\nwant the missing row as JSON, then the summary", out)
	}
	if out, err = verify("--repair"); !errors.Is(err, errDrift) || !strings.Contains(out, `"repaired":true`) {
		t.Errorf("verify --repair: %v\n%s\nwant the row reported repaired, exit 3", err, out)
	}
	if err == nil || !strings.Contains(err.Error(), "differed from Stripe; --repair stored Stripe's state for every drifted row") {
		t.Errorf("verify --repair that mended every row says %v, want that it did", err)
	}
	time.Sleep(time.Second) // past the repair's snapshot second
	if out, err = verify(); err != nil || strings.Count(out, "\n") != 1 {
		t.Errorf("verify after repair: %v\n%s\nwant in sync, the summary only", err, out)
	}
}

// Progress goes to stderr at most once a second, a line per report.
func TestProgressLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	ago := time.Now().Add(-2 * time.Second)
	p := &progress{w: &buf, command: "stripe sync", start: ago, last: ago}
	p.report("customers", 10, 40)
	p.report("customers", 11, 40) // within the second: nothing
	p.report("subscriptions", 0, 0)
	got := buf.String()
	if !strings.HasPrefix(got, "stripe sync: customers 10/40 (") || strings.Count(got, "\n") != 1 {
		t.Errorf("progress = %q, want one line of customers 10/40", got)
	}
}

func TestStripeCommandLine(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none", "STRIPE_API_KEY": stripetest.Key}
	tests := []struct {
		args    []string
		env     map[string]string
		usage   string // "stdout", "stderr" or "" (none)
		wantErr string // "" for success
	}{
		{[]string{"-h"}, nil, "stdout", ""},
		{[]string{"--help"}, nil, "stdout", ""},
		{[]string{"sync", "-h"}, nil, "stdout", ""},
		{[]string{"replay", "--help"}, nil, "stdout", ""},
		{[]string{"verify", "-h"}, nil, "stdout", ""},
		{[]string{"verify", "--since", "1h"}, nil, "stderr", "not defined"},
		{[]string{"verify", "--repair", "extra"}, nil, "stderr", "want 0 arguments"},
		{nil, nil, "stderr", "missing command"},
		{[]string{"frobnicate"}, nil, "stderr", "unknown command"},
		{[]string{"sync", "--since", "1h"}, nil, "stderr", "not defined"},
		{[]string{"replay"}, nil, "stderr", "--since"},
		{[]string{"replay", "--since", "721h"}, nil, "stderr", "at most 720h"},
		{[]string{"replay", "--since", "1h", "extra"}, nil, "stderr", "want 0 arguments"},
		{[]string{"sync"}, map[string]string{"DATABASE_URL": "postgres://x/y"}, "", "STRIPE_API_KEY is required"},
		{[]string{"replay", "--since", "1h"}, env, "", "REDIS_URL is required"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), append([]string{"munchable-webhooks", "stripe"}, tt.args...), environ(tt.env), &stdout, &stderr)
		name := strings.Join(tt.args, " ")
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("stripe %s: %v", name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("stripe %s: err = %v, want one with %q", name, err, tt.wantErr)
		}
		if usage := tt.usage == "stderr"; usage != errors.Is(err, errUsage) {
			t.Errorf("stripe %s: err = %v, usage error (exit 2) %v", name, err, usage)
		}
		out := map[string]string{"stdout": stdout.String(), "stderr": stderr.String()}
		for stream, text := range out {
			if has := strings.Contains(text, "usage: munchable-webhooks stripe"); has != (stream == tt.usage) {
				t.Errorf("stripe %s: usage on %s = %v, want it on %q only", name, stream, has, tt.usage)
			}
		}
		if tt.usage == "stdout" && stderr.Len() > 0 {
			t.Errorf("stripe %s: help wrote to stderr: %q", name, stderr.String())
		}
	}
}
