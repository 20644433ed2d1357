package faulttest_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// Redis is killed under steady Stripe traffic and comes back a few seconds
// later, the service running throughout. No delivery is lost; every one
// processed while Redis was down says so (Webhook-Idempotency: degraded, and
// webhook_claim_degraded_total counts exactly those); once Redis answers
// again deliveries are `first` without a restart.
func TestRedisDiesUnderTraffic(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(nil)
	pid := svc.PID()

	type delivery struct {
		ev      faulttest.StripeEvent
		answers []faulttest.Answer
	}
	var (
		mu         sync.Mutex
		deliveries []*delivery
		next       atomic.Int64
		stop       atomic.Bool
		wg         sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				d := &delivery{ev: subEvent(int(next.Add(1)), "active")}
				d.answers = untilOK(20*time.Second, func() faulttest.Answer { return r.stripe(svc, d.ev) })
				mu.Lock()
				deliveries = append(deliveries, d)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}

	time.Sleep(time.Second)
	killBegan := time.Now()
	r.redis.Kill()
	killed := time.Now()
	time.Sleep(3 * time.Second)
	restartBegan := time.Now()
	r.redis.Start()
	restarted := time.Now()
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()

	var (
		all, degraded, degradedAfter, notOK int
		down, downDegraded                  int
		firstAfter                          time.Time
		downLatency                         []time.Duration
	)
	for _, d := range deliveries {
		for _, a := range d.answers {
			all++
			if !a.OK() {
				notOK++
				t.Errorf("%s: %v, want 200 (Redis down fails open)", d.ev.ID, a)
			}
			if a.Idempotency == "degraded" {
				degraded++
			}
			switch {
			case a.Done.Before(killBegan):
				if a.Idempotency != "first" {
					t.Errorf("%s before the kill: %v, want first", d.ev.ID, a)
				}
			case a.Sent.After(killed) && a.Done.Before(restartBegan):
				down++
				downLatency = append(downLatency, a.Done.Sub(a.Sent))
				if a.Idempotency == "degraded" {
					downDegraded++
				} else {
					t.Errorf("%s while Redis was down: %v, want 200 degraded", d.ev.ID, a)
				}
			case a.Sent.After(restarted):
				if a.Idempotency == "first" && firstAfter.IsZero() {
					firstAfter = a.Sent
				}
				if a.Idempotency == "degraded" {
					degradedAfter++
				}
				// go-redis probes a dead server once a second after enough
				// failed dials; allow it two.
				if a.Sent.After(restarted.Add(2*time.Second)) && a.Idempotency != "first" {
					t.Errorf("%s sent %v after Redis returned: %v, want first", d.ev.ID, a.Sent.Sub(restarted), a)
				}
			}
		}
	}
	if down == 0 {
		t.Fatal("no delivery ran while Redis was down: the test measured nothing")
	}
	if firstAfter.IsZero() {
		t.Fatal("no delivery was `first` after Redis returned")
	}

	rows := r.count(`SELECT count(*) FROM entitlements`)
	if rows != len(deliveries) {
		t.Errorf("%d entitlement rows for %d events: %d lost", rows, len(deliveries), len(deliveries)-rows)
	}
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("webhook_claim_degraded_total", "provider", "stripe"); int(got) != degraded {
		t.Errorf("webhook_claim_degraded_total{provider=stripe} = %v, want %d (the degraded answers)", got, degraded)
	}
	if got := m.Sum("webhook_claim_degraded_total", "provider", "stripe", "reason", "redis_error"); int(got) != degraded {
		t.Errorf("webhook_claim_degraded_total{reason=redis_error} = %v, want %d", got, degraded)
	}
	if svc.PID() != pid || svc.Launches() != 1 || !svc.Running() {
		t.Error("the service was restarted")
	}
	slices.Sort(downLatency)
	figure(t, "%d events (%d deliveries, %d non-2xx), Redis down %.1fs: %d deliveries while down, all 200 degraded (latency median %v, max %v, REDIS_TIMEOUT 1s); %d degraded in total = webhook_claim_degraded_total; first `first` %v after Redis returned, %d degraded after it; %d/%d rows",
		len(deliveries), all, notOK, restartBegan.Sub(killed).Seconds(), down,
		downLatency[len(downLatency)/2].Round(time.Millisecond), downLatency[len(downLatency)-1].Round(time.Millisecond), degraded,
		firstAfter.Sub(restarted).Round(time.Millisecond), degradedAfter, rows, len(deliveries))
}

// Postgres is killed: deliveries fail (500) and release their claims, so the
// provider's retry is a first delivery rather than a 409; readiness fails.
// Once Postgres is back, every event is applied when the provider retries.
func TestPostgresDiesAndReturns(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{"HANDLER_TIMEOUT": "2s", "CLAIM_PROCESSING_TTL": "4s"})
	ctx := context.Background()

	if a := r.stripe(svc, subEvent(0, "active")); !a.OK() {
		t.Fatalf("delivery before the fault: %v", a)
	}
	r.pg.Kill()
	killed := time.Now()
	for svc.Probe(ctx, "/readyz") != http.StatusServiceUnavailable {
		if time.Since(killed) > 10*time.Second {
			t.Fatal("/readyz still not 503 10s after Postgres died")
		}
		time.Sleep(20 * time.Millisecond)
	}
	notReady := time.Since(killed)

	var events []faulttest.StripeEvent
	var mails []faulttest.Email
	var slowest time.Duration
	check := func(what, provider, id string, a faulttest.Answer) {
		t.Helper()
		if a.Status != http.StatusInternalServerError || a.Idempotency != "first" {
			t.Errorf("%s with Postgres down: %v, want 500 first", what, a)
		}
		if v, _ := r.claim(provider, id); v != "" {
			t.Errorf("%s: claim after the 500 = %q, want absent (released)", what, v)
		}
		slowest = max(slowest, a.Done.Sub(a.Sent))
	}
	for i := 1; i <= 10; i++ {
		ev := subEvent(i, "active")
		events = append(events, ev)
		check(ev.ID, "stripe", ev.ID, r.stripe(svc, ev))
	}
	for _, name := range []string{"pg-down-1", "pg-down-2", "pg-down-3"} {
		m := newEmail(name)
		r.api.Add(m)
		mails = append(mails, m)
		check(m.SvixID, "resend", m.SvixID, r.resend(svc, m))
	}

	restartBegan := time.Now()
	r.pg.Start()
	for svc.Probe(ctx, "/readyz") != http.StatusOK {
		if time.Since(restartBegan) > 20*time.Second {
			t.Fatal("/readyz not 200 20s after Postgres returned")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ready := time.Since(restartBegan)

	// The provider retries every failed delivery.
	retries := 0
	for _, ev := range events {
		answers := untilOK(20*time.Second, func() faulttest.Answer { return r.stripe(svc, ev) })
		retries += len(answers)
		if a := answers[len(answers)-1]; !a.OK() || a.Idempotency != "first" {
			t.Errorf("%s retried after Postgres returned: %v, want 200 first", ev.ID, a)
		}
	}
	for _, m := range mails {
		answers := untilOK(20*time.Second, func() faulttest.Answer { return r.resend(svc, m) })
		retries += len(answers)
		if a := answers[len(answers)-1]; !a.OK() || a.Idempotency != "first" {
			t.Errorf("%s retried after Postgres returned: %v, want 200 first", m.SvixID, a)
		}
		if n := r.supportRows(m); n != 1 {
			t.Errorf("%s: %d support rows, want 1", m.SvixID, n)
		}
	}
	if n := r.count(`SELECT count(*) FROM entitlements`); n != len(events)+1 {
		t.Errorf("%d entitlement rows, want %d", n, len(events)+1)
	}
	figure(t, "readyz 503 %v after the kill; 13 deliveries answered 500 first (slowest %v), each claim released; Postgres restart+recovery to readyz 200: %v; %d retry attempts to apply all 13; 11 entitlements + 3 support rows",
		notReady.Round(time.Millisecond), slowest.Round(time.Millisecond), ready.Round(time.Millisecond), retries)
}

// Redis hangs (every command stalls for 2s, then runs late) under steady
// traffic. Each delivery gives up on Redis after REDIS_TIMEOUT and runs
// degraded; no answer waits on the hang. The claims the service gave up on
// still land when Redis resumes: stale processing claims with no owner,
// which turn redeliveries away (409) until they expire; never a wrong 2xx,
// and the re-application after expiry changes nothing.
func TestRedisHangs(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	proxy := startRedisProxy(t, r.redis.Addr())
	svc := r.service(map[string]string{
		"REDIS_URL":            proxy.URL(),
		"REDIS_TIMEOUT":        "500ms",
		"HANDLER_TIMEOUT":      "1s",
		"CLAIM_PROCESSING_TTL": "4s",
	})
	if a := r.stripe(svc, subEvent(0, "active")); !a.OK() || a.Idempotency != "first" {
		t.Fatalf("delivery before the hang: %v", a)
	}

	proxy.stall()
	var events []faulttest.StripeEvent
	var slowest time.Duration
	stalled := time.Now()
	for i := 1; time.Since(stalled) < 2*time.Second; i++ {
		ev := subEvent(i, "active")
		events = append(events, ev)
		a := r.stripe(svc, ev)
		if !a.OK() || a.Idempotency != "degraded" {
			t.Errorf("%s while Redis hangs: %v, want 200 degraded", ev.ID, a)
		}
		slowest = max(slowest, a.Done.Sub(a.Sent))
	}
	proxy.resume()
	if slowest > 500*time.Millisecond+700*time.Millisecond {
		t.Errorf("slowest delivery while Redis hung took %v, want about REDIS_TIMEOUT (500ms)", slowest)
	}

	// The late claims land as Redis works through what it was sent.
	time.Sleep(200 * time.Millisecond)
	stale := 0
	for _, ev := range events {
		if v, _ := r.claim("stripe", ev.ID); strings.HasPrefix(v, "processing|") {
			stale++
		}
	}
	// The provider redelivers each (as if our 200 had been lost on the
	// way): 409 while a stale claim lives, then processed again, harmlessly.
	conflicts := 0
	resumed := time.Now()
	for _, ev := range events {
		answers := untilOK(15*time.Second, func() faulttest.Answer { return r.stripe(svc, ev) })
		for _, a := range answers {
			switch {
			case a.Status == http.StatusConflict:
				conflicts++
			case a.OK() && a.Idempotency == "first":
			default:
				t.Errorf("%s redelivered after the hang: %v, want 409 or 200 first", ev.ID, a)
			}
		}
		if e, ok := r.entitlement(ev.SubscriptionID); !ok || e.LastEventID != ev.ID {
			t.Errorf("%s: entitlement %+v (found %v)", ev.ID, e, ok)
		}
	}
	settled := time.Since(resumed)
	if n := r.count(`SELECT count(*) FROM entitlements`); n != len(events)+1 {
		t.Errorf("%d entitlement rows, want %d", n, len(events)+1)
	}
	figure(t, "Redis hung 2s: %d deliveries all 200 degraded, slowest %v (REDIS_TIMEOUT 500ms); %d stale processing claims landed late; redeliveries met %d 409s and were all re-applied within %.1fs (claim TTL 4s); %d rows",
		len(events), slowest.Round(time.Millisecond), stale, conflicts, settled.Seconds(), len(events)+1)
}

// Postgres hangs (the connection stalls for 3s, then everything sent runs
// late). Each delivery fails at HANDLER_TIMEOUT with 500 and releases its
// claim, so the provider's retry is first, not 409; /readyz fails. After the
// hang the late statements may commit what was answered 500: the retry then
// re-applies harmlessly, one row per event.
func TestPostgresHangs(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	u, err := url.Parse(r.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := startTCPProxy(t, u.Host)
	u.Host = proxy.Addr()
	svc := r.service(map[string]string{"DATABASE_URL": u.String(), "HANDLER_TIMEOUT": "1s", "CLAIM_PROCESSING_TTL": "4s"})
	if a := r.stripe(svc, subEvent(0, "active")); !a.OK() {
		t.Fatalf("delivery before the hang: %v", a)
	}

	proxy.stall()
	stalled := time.Now()
	var events []faulttest.StripeEvent
	var slowest time.Duration
	mail := newEmail("pg-hang")
	r.api.Add(mail)
	for i := 1; i <= 2; i++ {
		ev := subEvent(i, "active")
		events = append(events, ev)
		a := r.stripe(svc, ev)
		if a.Status != http.StatusInternalServerError || a.Idempotency != "first" {
			t.Errorf("%s while Postgres hangs: %v, want 500 first", ev.ID, a)
		}
		if v, _ := r.claim("stripe", ev.ID); v != "" {
			t.Errorf("%s: claim after the 500 = %q, want released", ev.ID, v)
		}
		slowest = max(slowest, a.Done.Sub(a.Sent))
	}
	if a := r.resend(svc, mail); a.Status != http.StatusInternalServerError {
		t.Errorf("mail while Postgres hangs: %v, want 500", a)
	} else if v, _ := r.claim("resend", mail.SvixID); v != "" {
		t.Errorf("mail: claim after the 500 = %q, want released", v)
	}
	probed := time.Now()
	readyz, readyzBody := 0, ""
	if resp, err := r.client.Get(svc.URL() + "/readyz"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		readyz, readyzBody = resp.StatusCode, strings.TrimSpace(string(b))
	}
	readyzTook := time.Since(probed)
	if readyz != http.StatusServiceUnavailable {
		t.Errorf("/readyz while Postgres hangs = %d after %v, want 503", readyz, readyzTook)
	}
	time.Sleep(time.Until(stalled.Add(3 * time.Second)))
	proxy.resume()

	resumed := time.Now()
	attempts := 0
	for _, ev := range events {
		answers := untilOK(15*time.Second, func() faulttest.Answer { return r.stripe(svc, ev) })
		attempts += len(answers)
		if last := answers[len(answers)-1]; !last.OK() || last.Idempotency != "first" {
			t.Errorf("%s retried after the hang: %v, want 200 first", ev.ID, last)
		}
		if e, ok := r.entitlement(ev.SubscriptionID); !ok || e.LastEventID != ev.ID {
			t.Errorf("%s: entitlement %+v (found %v)", ev.ID, e, ok)
		}
	}
	answers := untilOK(15*time.Second, func() faulttest.Answer { return r.resend(svc, mail) })
	attempts += len(answers)
	if last := answers[len(answers)-1]; !last.OK() {
		t.Errorf("mail retried after the hang: %v", last)
	}
	if n := r.supportRows(mail); n != 1 {
		t.Errorf("%d support rows for the mail, want 1", n)
	}
	figure(t, "Postgres hung 3s: 3 deliveries answered 500 first, slowest %v (HANDLER_TIMEOUT 1s), claims released, /readyz %d %s after %v; after the hang %d attempts applied all 3 in %v; 1 row each",
		slowest.Round(time.Millisecond), readyz, readyzBody, readyzTook.Round(time.Millisecond), attempts, time.Since(resumed).Round(time.Millisecond))
}
