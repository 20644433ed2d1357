package faulttest_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// kill -9 while a handler runs (its Resend fetch held open by the fake API):
// the processing claim outlives the process, so a retry after the restart is
// told to come back (409, Retry-After) until the claim expires, and the
// first retry after that is processed: one support message, no 2xx for work
// that did not happen.
func TestCrashMidDelivery(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{"HANDLER_TIMEOUT": "2s", "CLAIM_PROCESSING_TTL": "4s"})
	mail := newEmail("crash-mid")
	r.api.Add(mail)

	fetching := make(chan struct{}, 1)
	var hold atomic.Bool
	hold.Store(true)
	r.api.SetHook(func(ctx context.Context, _ string) int {
		if !hold.Load() {
			return 0
		}
		select {
		case fetching <- struct{}{}:
		default:
		}
		<-ctx.Done() // until the service dies
		return http.StatusServiceUnavailable
	})

	first := make(chan faulttest.Answer, 1)
	go func() { first <- r.resend(svc, mail) }()
	select {
	case <-fetching:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never fetched the email")
	}
	svc.Kill()
	killedAt := time.Now()
	if a := <-first; a.Err == nil {
		t.Fatalf("the delivery whose handler was killed got an answer: %v", a)
	}
	val, ttl := r.claim("resend", mail.SvixID)
	if !strings.HasPrefix(val, "processing|") || ttl <= 0 {
		t.Fatalf("claim after kill -9 = %q (TTL %v), want a live processing claim", val, ttl)
	}
	expiresAt := time.Now().Add(ttl)
	if n := r.supportRows(mail); n != 0 {
		t.Fatalf("%d support rows before any handler finished, want 0", n)
	}

	hold.Store(false)
	r.start(svc)
	restarted := time.Since(killedAt)
	a := r.resend(svc, mail)
	if a.Status != http.StatusConflict || a.Idempotency != "in-progress" {
		t.Fatalf("retry right after the restart: %v, want 409 in-progress", a)
	}
	if s := a.RetryAfterSeconds(); s < 1 || s > 4 {
		t.Errorf("Retry-After = %q, want 1..4 (seconds left on a 4s claim)", a.RetryAfter)
	}
	firstRetryAfter := a.RetryAfter

	// The provider keeps retrying; each retry is turned away until the claim
	// expires, and never acknowledged before.
	conflicts := 1
	for {
		a = r.resend(svc, mail)
		if a.OK() {
			break
		}
		if a.Status != http.StatusConflict {
			t.Fatalf("retry: %v, want 409 until the claim expires", a)
		}
		conflicts++
		if time.Since(killedAt) > 15*time.Second {
			t.Fatal("still 409 15s after the kill; the 4s claim never expired")
		}
		time.Sleep(200 * time.Millisecond)
	}
	processedAt := time.Now()
	if a.Idempotency != "first" {
		t.Errorf("the retry after expiry answered %v, want 200 first (processed)", a)
	}
	if early := expiresAt.Sub(processedAt); early > 100*time.Millisecond {
		t.Errorf("processed %v before the crashed claim expired", early)
	}
	if n := r.supportRows(mail); n != 1 {
		t.Errorf("%d support rows, want 1", n)
	}
	if n := r.api.Fetches(); n != 2 {
		t.Errorf("Resend API fetched %d times, want 2 (the killed attempt, the one after expiry)", n)
	}
	if v, _ := r.claim("resend", mail.SvixID); !strings.HasPrefix(v, "done|") {
		t.Errorf("claim after processing = %q, want done", v)
	}
	figure(t, "restart took %v; first retry 409 Retry-After=%s; %d retries answered 409; processed %.1fs after the kill (claim TTL 4s); 1 support row",
		restarted.Round(time.Millisecond), firstRetryAfter, conflicts, processedAt.Sub(killedAt).Seconds())
}

// The effect is committed, then the process dies before the done marker
// reaches Redis. Production code has no test hooks, so the test makes the
// crash happen in exactly that window: the service's Redis is a proxy that
// swallows the confirm (the plain SET of a done|... value that Store.Confirm
// sends only after the handler returned nil, i.e. after Postgres committed),
// and the test kills the service while it waits for the reply. REDIS_TIMEOUT
// is 2s, so the service cannot give up on the confirm before the kill. The
// claim stays processing until its TTL; the retry after it re-applies the
// event, harmlessly: still one entitlement state, one support message.
//
// The second half swallows the confirms without killing anything: the
// service answers 200 (the effect is committed), counts
// webhook_claim_confirm_failures_total, and the retry after the claim's TTL
// again re-applies harmlessly.
func TestCrashAfterEffectBeforeConfirm(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	proxy := startRedisProxy(t, r.redis.Addr())
	svc := r.service(map[string]string{
		"REDIS_URL":            proxy.URL(),
		"REDIS_TIMEOUT":        "2s",
		"HANDLER_TIMEOUT":      "2s",
		"CLAIM_PROCESSING_TTL": "4s",
	})

	type pair struct {
		ev   faulttest.StripeEvent
		mail faulttest.Email
	}
	deliverBoth := func(p pair) (faulttest.Answer, faulttest.Answer) {
		stripe, resend := make(chan faulttest.Answer, 1), make(chan faulttest.Answer, 1)
		go func() { stripe <- r.stripe(svc, p.ev) }()
		go func() { resend <- r.resend(svc, p.mail) }()
		return <-stripe, <-resend
	}
	waitHeld := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-proxy.held:
			case <-time.After(10 * time.Second):
				t.Fatal("no confirm reached Redis")
			}
		}
	}
	// retryAfterExpiry delivers both again: 409 while the stale processing
	// claims live, then processed (re-applied) once they expire.
	retryAfterExpiry := func(p pair) time.Duration {
		t.Helper()
		sa, ra := deliverBoth(p)
		for _, a := range []faulttest.Answer{sa, ra} {
			if a.Status != http.StatusConflict || a.RetryAfterSeconds() < 1 {
				t.Errorf("retry while the unconfirmed claim lives: %v, want 409 with Retry-After", a)
			}
		}
		start := time.Now()
		for {
			sv, _ := r.claim("stripe", p.ev.ID)
			rv, _ := r.claim("resend", p.mail.SvixID)
			if sv == "" && rv == "" {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("claims never expired: %q %q", sv, rv)
			}
			time.Sleep(50 * time.Millisecond)
		}
		waited := time.Since(start)
		sa, ra = deliverBoth(p)
		for _, a := range []faulttest.Answer{sa, ra} {
			if !a.OK() || a.Idempotency != "first" {
				t.Errorf("retry after the claim expired: %v, want 200 first (re-applied)", a)
			}
		}
		return waited
	}
	// applied checks the effect is there exactly once and unchanged.
	applied := func(p pair, when string) entitlement {
		t.Helper()
		e, ok := r.entitlement(p.ev.SubscriptionID)
		if !ok || e.LastEventID != p.ev.ID || e.Status != p.ev.Status {
			t.Errorf("%s: entitlement = %+v (found %v), want %s from %s", when, e, ok, p.ev.Status, p.ev.ID)
		}
		if n := r.supportRows(p.mail); n != 1 {
			t.Errorf("%s: %d support rows, want 1", when, n)
		}
		// The ledger says applied from the moment the effect committed,
		// and a re-application appends no second change to the feed.
		for _, k := range [][2]string{{"stripe", p.ev.ID}, {"resend", p.mail.SvixID}} {
			if n := r.count(`SELECT count(*) FROM webhook_events WHERE provider = $1 AND event_id = $2 AND outcome = 'applied'`, k[0], k[1]); n != 1 {
				t.Errorf("%s: %s %s is not applied in the ledger", when, k[0], k[1])
			}
			if n := r.count(`SELECT count(*) FROM changes WHERE event_id = $1`, k[1]); n != 1 {
				t.Errorf("%s: %s %s has %d changes in the feed, want 1", when, k[0], k[1], n)
			}
		}
		return e
	}

	// Crash between commit and confirm.
	crash := pair{ev: subEvent(1, "active"), mail: newEmail("crash-after-effect")}
	r.api.Add(crash.mail)
	proxy.setHold(isConfirm)
	type answers struct{ stripe, resend faulttest.Answer }
	got := make(chan answers, 1)
	go func() {
		s, rs := deliverBoth(crash)
		got <- answers{s, rs}
	}()
	waitHeld(2)
	svc.Kill()
	proxy.setHold(nil)
	if a := <-got; a.stripe.Err == nil || a.resend.Err == nil {
		t.Fatalf("a delivery killed before its confirm got an answer: stripe %v, resend %v", a.stripe, a.resend)
	}
	before := applied(crash, "after the crash")
	for _, k := range [][2]string{{"stripe", crash.ev.ID}, {"resend", crash.mail.SvixID}} {
		if v, _ := r.claim(k[0], k[1]); !strings.HasPrefix(v, "processing|") {
			t.Errorf("%s claim after the crash = %q, want processing (the confirm never landed)", k[0], v)
		}
	}
	r.start(svc)
	waited := retryAfterExpiry(crash)
	after := applied(crash, "after the re-application")
	if !after.LastCreated.Equal(before.LastCreated) || after.Status != before.Status {
		t.Errorf("entitlement moved: %+v -> %+v", before, after)
	}
	if n := r.api.Fetches(); n != 2 {
		t.Errorf("Resend API fetched %d times, want 2", n)
	}
	figure(t, "crash after commit: retries 409 until the claim expired (%.1fs after restart), then re-applied: 1 entitlement state (%s from %s), 1 support row",
		waited.Seconds(), after.Status, after.LastEventID)

	// The confirm is lost but the process lives.
	lost := pair{ev: subEvent(2, "trialing"), mail: newEmail("confirm-lost")}
	r.api.Add(lost.mail)
	proxy.setHold(isConfirm)
	start := time.Now()
	sa, ra := deliverBoth(lost)
	answered := time.Since(start)
	proxy.setHold(nil)
	for _, a := range []faulttest.Answer{sa, ra} {
		if !a.OK() || a.Idempotency != "first" {
			t.Errorf("delivery whose confirm was lost: %v, want 200 first (the effect is committed)", a)
		}
	}
	applied(lost, "after the lost confirm")
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Sum("webhook_claim_confirm_failures_total"); n != 2 {
		t.Errorf("webhook_claim_confirm_failures_total = %v, want 2", n)
	}
	waited = retryAfterExpiry(lost)
	applied(lost, "after the re-application")
	figure(t, "confirm lost, process alive: answered 200 after %v (REDIS_TIMEOUT 2s), confirm_failures_total=2, retry re-applied after %.1fs: still 1 row",
		answered.Round(10*time.Millisecond), waited.Seconds())
}
