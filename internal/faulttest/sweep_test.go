package faulttest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// sweepInterval is the shortest SWEEP_INTERVAL the service takes. A
// replica checks whether a sweep is due once an interval, so a pass
// follows the last one within two intervals.
const sweepInterval = 10 * time.Second

// TestSweepResendTwoReplicas: a mail Resend received and lists, whose
// webhook never comes, is queued by the service's own sweep with two
// replicas sweeping, one at a time: one support message, fetched once,
// run once through the claim (never met in progress by the other
// replica) and counted once in webhook_sweep_recovered_total over both.
// The pass that gets there first is held in its fetch for an interval
// after both replicas are up, so the other replica's checks meet it
// running. Later passes find the mail queued and count nothing, and
// webhook_sweep_last_success_timestamp_seconds moves forward with them.
// The webhook arriving late is claimed under its svix-id, which the list
// does not carry, so the sweep claimed received:{email id} instead: the
// delivery runs, fetches once more, and the queue answers unchanged: 200
// first, still one message, the ledger saying unchanged.
func TestSweepResendTwoReplicas(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	m := newEmail("swept")
	r.api.Add(m) // received and listed; its webhook is not sent
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r.api.SetHook(func(ctx context.Context, _ string) int {
		once.Do(func() { close(held) })
		select {
		case <-release:
		case <-ctx.Done():
		}
		return 0
	})
	replicas := r.replicas(2, map[string]string{
		"SWEEP_INTERVAL": sweepInterval.String(),
		// The held fetch is the first pass's handler: room for the hold
		// beyond the default 30s on busy cores.
		"HANDLER_TIMEOUT": "60s",
	})
	sum := func(name string, match ...string) float64 {
		t.Helper()
		return sumMetric(t, replicas, name, match...)
	}
	recovered := func() float64 { return sum("webhook_sweep_recovered_total", "provider", "resend") }

	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("no sweep fetched the mail within 1m")
	}
	// Both replicas' schedulers run (they start before the listener): each
	// checks once an interval, and while no pass has ended the job is due,
	// so the one not holding the lock tries it at least once meanwhile.
	time.Sleep(sweepInterval + 2*time.Second)
	close(release)

	eventually(t, time.Minute, "the sweep queues the mail", func() bool { return r.supportRows(m) == 1 })
	// The pass counts once it has listed the whole window.
	eventually(t, 30*time.Second, "webhook_sweep_recovered_total{provider=resend} counts the mail", func() bool { return recovered() > 0 })
	first := nextSweep(t, replicas[0], "resend", 0)
	later := nextSweep(t, replicas[0], "resend", first)

	if n := r.supportRows(m); n != 1 {
		t.Errorf("support rows after a later pass = %d, want 1", n)
	}
	if got := recovered(); got != 1 {
		t.Errorf("webhook_sweep_recovered_total{provider=resend} over both replicas = %v, want 1", got)
	}
	if n := r.api.Fetches(); n != 1 {
		t.Errorf("fetches of the mail by the sweeps = %d, want 1", n)
	}
	for outcome, want := range map[string]float64{"processed": 1, "in_progress": 0, "failed": 0} {
		if got := sum("webhook_deliveries_total", "provider", "resend", "outcome", outcome); got != want {
			t.Errorf("webhook_deliveries_total{provider=resend,outcome=%s} over both replicas = %v, want %v", outcome, got, want)
		}
	}
	sweptID := "received:" + m.EmailID
	if got := r.ledgerOutcome("resend", sweptID); got != "applied" {
		t.Errorf("ledger outcome of resend %s = %q, want applied", sweptID, got)
	}
	if v, _ := r.claim("resend", sweptID); !strings.HasPrefix(v, "done|") {
		t.Errorf("claim of resend %s = %q, want done", sweptID, v)
	}

	late := r.resend(replicas[1], m)
	if late.Status != http.StatusOK || late.Idempotency != "first" || late.Body != `{"received":true}` {
		t.Errorf("late webhook of the swept mail: %v, want 200 first {\"received\":true}", late)
	}
	if n := r.supportRows(m); n != 1 {
		t.Errorf("support rows after the late webhook = %d, want 1", n)
	}
	if got := r.ledgerOutcome("resend", m.SvixID); got != "unchanged" {
		t.Errorf("ledger outcome of resend %s (the late webhook) = %q, want unchanged", m.SvixID, got)
	}
	if n := r.api.Fetches(); n != 2 {
		t.Errorf("fetches after the late webhook = %d, want 2 (the sweep's and the webhook's)", n)
	}
	if got := recovered(); got != 1 {
		t.Errorf("webhook_sweep_recovered_total{provider=resend} after the late webhook = %v, want 1", got)
	}
	figure(t, "resend sweep, 2 replicas, interval %s: mail queued once, recovered 1 over both; last success %v then %v; late webhook %d %s",
		sweepInterval, time.Unix(int64(first), 0).UTC().Format(time.TimeOnly), time.Unix(int64(later), 0).UTC().Format(time.TimeOnly),
		late.Status, late.Idempotency)
}

// TestSweepStripe: an event Stripe lists (GET /v1/events, played by
// stripetest's fake) whose webhook never comes is applied by the service's
// own sweep, through the claim with the delivery's key
// webhook:stripe:{event id}: the entitlement appears, the ledger says
// applied, webhook_sweep_recovered_total{provider=stripe} counts it once,
// and webhook_sweep_last_success_timestamp_seconds moves forward with later
// passes. The webhook arriving late finds the claim done: 200 duplicate,
// nothing written.
func TestSweepStripe(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	api := stripetest.New(t)
	ev := subEvent(1, "active")
	ev.Created = time.Now().Unix() // inside the first pass's window
	api.AddEvent(ev.JSON(), false) // listed; its webhook is not sent
	svc := r.service(map[string]string{
		"SWEEP_INTERVAL": sweepInterval.String(),
		"STRIPE_API_KEY": stripetest.Key,
		"STRIPE_API_URL": api.URL().String(),
		// Verify, on by default with a key, is not what is tested here.
		"VERIFY_INTERVAL": "0",
	})
	recovered := func() float64 {
		return sumMetric(t, []*faulttest.Service{svc}, "webhook_sweep_recovered_total", "provider", "stripe")
	}

	eventually(t, time.Minute, "the sweep applies the event", func() bool { _, ok := r.entitlement(ev.SubscriptionID); return ok })
	eventually(t, 30*time.Second, "webhook_sweep_recovered_total{provider=stripe} counts the event", func() bool { return recovered() > 0 })
	first := nextSweep(t, svc, "stripe", 0)
	later := nextSweep(t, svc, "stripe", first)

	swept, _ := r.entitlement(ev.SubscriptionID)
	if swept.Status != ev.Status || swept.LastEventID != ev.ID {
		t.Errorf("entitlement after the sweep = %+v, want %s from %s", swept, ev.Status, ev.ID)
	}
	if got := r.ledgerOutcome("stripe", ev.ID); got != "applied" {
		t.Errorf("ledger outcome of stripe %s = %q, want applied", ev.ID, got)
	}
	if v, _ := r.claim("stripe", ev.ID); !strings.HasPrefix(v, "done|") {
		t.Errorf("claim of stripe %s = %q, want done", ev.ID, v)
	}
	if got := recovered(); got != 1 {
		t.Errorf("webhook_sweep_recovered_total{provider=stripe} after a later pass = %v, want 1", got)
	}

	late := r.stripe(svc, ev)
	if late.Status != http.StatusOK || late.Idempotency != "duplicate" || late.Body != `{"received":true,"skipped":true}` {
		t.Errorf("late webhook of the swept event: %v, want 200 duplicate {\"received\":true,\"skipped\":true}", late)
	}
	if e, _ := r.entitlement(ev.SubscriptionID); e != swept {
		t.Errorf("entitlement after the late webhook = %+v, want unchanged %+v", e, swept)
	}
	if got := r.ledgerOutcome("stripe", ev.ID); got != "applied" {
		t.Errorf("ledger outcome of stripe %s after the late webhook = %q, want applied", ev.ID, got)
	}
	if got := recovered(); got != 1 {
		t.Errorf("webhook_sweep_recovered_total{provider=stripe} after the late webhook = %v, want 1", got)
	}
	figure(t, "stripe sweep, interval %s: event applied once, recovered 1; last success %v then %v; late webhook %d %s; %d event listings",
		sweepInterval, time.Unix(int64(first), 0).UTC().Format(time.TimeOnly), time.Unix(int64(later), 0).UTC().Format(time.TimeOnly),
		late.Status, late.Idempotency, api.Calls(stripetest.ListEvents))
}

// nextSweep waits until svc's webhook_sweep_last_success_timestamp_seconds
// for provider is past after, and returns it: a pass that ended later.
func nextSweep(t *testing.T, svc *faulttest.Service, provider string, after float64) float64 {
	t.Helper()
	var got float64
	eventually(t, 90*time.Second, "webhook_sweep_last_success_timestamp_seconds{provider="+provider+"} moves forward", func() bool {
		got = sumMetric(t, []*faulttest.Service{svc}, "webhook_sweep_last_success_timestamp_seconds", "provider", provider)
		return got > after
	})
	return got
}

// eventually polls cond until it holds, failing the test after within:
// the sweeps run on their own schedule, so a test waits for their effects.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// ledgerOutcome is the outcome webhook_events holds for an event, "" when
// it has no row.
func (r *rig) ledgerOutcome(provider, id string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var outcome string
	err := r.db.QueryRow(ctx, `SELECT outcome FROM webhook_events WHERE provider = $1 AND event_id = $2`, provider, id).Scan(&outcome)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		r.t.Fatalf("ledger row of %s %s: %v", provider, id, err)
	}
	return outcome
}
