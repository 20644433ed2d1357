package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

func TestClaimsCommand(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := dbtest.Redis(t)
	store := claim.NewStore(rdb, claim.StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: 2 * time.Minute})
	// Only Redis settings: the tool must not ask for the webhook secrets.
	env := []string{"REDIS_URL=" + dbtest.RedisURL(t), "REDIS_KEY_PREFIX=" + prefix, "RESEND_DEDUPE_TTL=1h"}
	claims := func(args ...string) (string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"munchable-webhooks", "claims"}, args...), env, &out, &errOut)
		return out.String(), err
	}
	mustContain := func(out string, err error, wants ...string) {
		t.Helper()
		if err != nil {
			t.Fatalf("claims: %v", err)
		}
		for _, want := range wants {
			if !strings.Contains(out, want) {
				t.Errorf("output %q lacks %q", out, want)
			}
		}
	}

	out, err := claims("show", "stripe", "evt_1")
	mustContain(out, err, prefix+":stripe:evt_1 absent")

	// A delivery's processing claim, written as the flow writes it.
	rdb.Set(ctx, store.Key("stripe", "evt_1"), processingValue("tok1", time.Now(), "fp1"), 2*time.Minute)
	out, err = claims("show", "stripe", "evt_1")
	mustContain(out, err, "processing", "owner=tok1", " age=", " ttl=", "fingerprint=fp1")

	out, err = claims("release", "stripe", "evt_1")
	mustContain(out, err, "released: "+prefix+":stripe:evt_1 processing owner=tok1")
	out, err = claims("show", "stripe", "evt_1")
	mustContain(out, err, "absent failures=0")

	// A poison event's failures outlive its released claims: show says
	// them when the key is absent too.
	rdb.Set(ctx, store.Key("stripe", "evt_poison")+":failures", 6, time.Hour)
	out, err = claims("show", "stripe", "evt_poison")
	mustContain(out, err, prefix+":stripe:evt_poison absent failures=6")

	// done uses the provider's dedupe TTL.
	out, err = claims("done", "stripe", "evt_1")
	mustContain(out, err, "marked done for 72h0m0s")
	if ttl := rdb.PTTL(ctx, store.Key("stripe", "evt_1")).Val(); ttl < 71*time.Hour {
		t.Errorf("stripe done TTL = %s, want 72h", ttl)
	}
	out, err = claims("done", "resend", "msg_1")
	mustContain(out, err, "marked done for 1h0m0s")
	if e, err := store.Inspect(ctx, "resend", "msg_1"); err != nil || e.State != claim.Done {
		t.Errorf("key after `claims done` = %+v, %v; want done", e, err)
	}

	// A done key is deleted only with -force, which may stand anywhere.
	if _, err := claims("release", "stripe", "evt_1"); err == nil || !strings.Contains(err.Error(), "-force") {
		t.Errorf("release of a done key without -force: err = %v, want a refusal naming -force", err)
	}
	out, err = claims("release", "stripe", "evt_1", "-force")
	mustContain(out, err, "released: "+prefix+":stripe:evt_1 done")

	// stuck lists old processing claims only.
	rdb.Set(ctx, store.Key("resend", "msg_stuck"), processingValue("crashed", time.Now().Add(-5*time.Minute), ""), time.Hour)
	rdb.Set(ctx, store.Key("stripe", "evt_young"), processingValue("young", time.Now(), ""), 2*time.Minute)
	out, err = claims("stuck")
	mustContain(out, err, prefix+":resend:msg_stuck processing owner=crashed age=5m0s", "1 processing claims older than 1m0s")
	if strings.Contains(out, "evt_young") {
		t.Errorf("stuck lists a young claim:\n%s", out)
	}
	out, err = claims("stuck", "-older-than", "10m")
	mustContain(out, err, "0 processing claims older than 10m0s")
}

func TestClaimsCommandRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     []string
		args    []string
		wantErr string
	}{
		{"no REDIS_URL", nil, []string{"show", "stripe", "evt_1"}, "REDIS_URL is required"},
		{"bad REDIS_URL", []string{"REDIS_URL=http://x"}, []string{"stuck"}, "REDIS_URL is invalid"},
		{"bad TTL", []string{"REDIS_URL=redis://127.0.0.1:1", "STRIPE_DEDUPE_TTL=0s"}, []string{"done", "stripe", "e"}, "STRIPE_DEDUPE_TTL"},
		{"unknown provider", []string{"REDIS_URL=redis://127.0.0.1:1"}, []string{"show", "paypal", "evt_1"}, "paypal"},
		{"missing event id", []string{"REDIS_URL=redis://127.0.0.1:1"}, []string{"show", "stripe"}, "want 2 arguments"},
		{"unknown command", []string{"REDIS_URL=redis://127.0.0.1:1"}, []string{"purge"}, "purge"},
		{"redis down", []string{"REDIS_URL=redis://127.0.0.1:1"}, []string{"show", "stripe", "evt_1"}, "inspect"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := run(t.Context(), append([]string{"munchable-webhooks", "claims"}, tt.args...), tt.env, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: err = %v, want one mentioning %q", tt.name, err, tt.wantErr)
		}
	}
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"munchable-webhooks", "claims"}, nil, &out, &errOut); !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), "stuck") {
		t.Errorf("claims without a command = %v, %q; want a usage error and the usage on stderr", err, errOut.String())
	}
}

// An event that keeps failing shows its failed attempts to the person on
// call, in show and in stuck.
func TestClaimsShowFailures(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := dbtest.Redis(t)
	store := claim.NewStore(rdb, claim.StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: 2 * time.Minute})
	flow := claim.NewFlow(store, claim.FlowConfig{HandlerTimeout: time.Second})
	ep := flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: time.Hour})
	failing := claim.Event{ID: "evt_poison", Type: "customer.subscription.updated",
		Apply: func(context.Context) (claim.Effect, error) { return "", errors.New("upsert: boom") }}
	for range 3 {
		if res, _ := ep.Process(ctx, []byte(`{}`), failing); res.Outcome != claim.Failed {
			t.Fatalf("outcome = %s, want failed", res.Outcome)
		}
	}
	env := []string{"REDIS_URL=" + dbtest.RedisURL(t), "REDIS_KEY_PREFIX=" + prefix}
	claims := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, append([]string{"munchable-webhooks", "claims"}, args...), env, &out, &out); err != nil {
			t.Fatalf("claims %v: %v\n%s", args, err, &out)
		}
		return out.String()
	}

	// The fourth attempt holds the claim: show and stuck both count the
	// three before it.
	rdb.Set(ctx, store.Key("stripe", "evt_poison"), processingValue("tok4", time.Now().Add(-5*time.Minute), ""), time.Hour)
	if out := claims("show", "stripe", "evt_poison"); !strings.Contains(out, "failures=3") {
		t.Errorf("show = %q, want failures=3", out)
	}
	if out := claims("stuck"); !strings.Contains(out, ":stripe:evt_poison processing owner=tok4") || !strings.Contains(out, "failures=3") {
		t.Errorf("stuck = %q, want the claim with failures=3", out)
	}
	rdb.Set(ctx, store.Key("stripe", "evt_fine"), processingValue("tok", time.Now(), ""), time.Hour)
	if out := claims("show", "stripe", "evt_fine"); !strings.Contains(out, "failures=0") {
		t.Errorf("show of an event that never failed = %q, want failures=0", out)
	}
}

// processingValue is a processing claim's value as the claim package
// documents it (claim.Entry).
func processingValue(owner string, at time.Time, fingerprint string) string {
	return fmt.Sprintf("processing|%s|%d|%s", owner, at.UnixMilli(), fingerprint)
}
