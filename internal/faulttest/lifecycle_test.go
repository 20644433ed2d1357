package faulttest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// A handler stuck past HANDLER_TIMEOUT (the Resend API never answers) is
// answered 500 at the deadline and its claim released, so the provider's
// retry is processed at once instead of waiting out the processing TTL.
func TestHandlerDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{"HANDLER_TIMEOUT": "1s", "CLAIM_PROCESSING_TTL": "30s"})
	mail := newEmail("deadline")
	r.api.Add(mail)
	var hang atomic.Bool
	hang.Store(true)
	r.api.SetHook(func(ctx context.Context, _ string) int {
		if hang.Load() {
			<-ctx.Done() // the service's deadline, not ours
			return http.StatusGatewayTimeout
		}
		return 0
	})

	a := r.resend(svc, mail)
	took := a.Done.Sub(a.Sent)
	if a.Status != http.StatusInternalServerError || a.Idempotency != "first" {
		t.Fatalf("stuck handler: %v, want 500 first", a)
	}
	if took < time.Second || took > 3*time.Second {
		t.Errorf("stuck handler answered after %v, want just over HANDLER_TIMEOUT (1s)", took)
	}
	if v, _ := r.claim("resend", mail.SvixID); v != "" {
		t.Errorf("claim after the deadline = %q, want absent (released)", v)
	}
	hang.Store(false)
	retry := r.resend(svc, mail)
	if !retry.OK() || retry.Idempotency != "first" {
		t.Errorf("retry right after the deadline: %v, want 200 first (not 409: the claim was released)", retry)
	}
	if n := r.supportRows(mail); n != 1 {
		t.Errorf("%d support rows, want 1", n)
	}
	figure(t, "stuck handler answered 500 after %v (HANDLER_TIMEOUT 1s), claim released; the retry %v later was processed, 29s before the 30s claim would have expired",
		took.Round(time.Millisecond), retry.Sent.Sub(a.Done).Round(time.Millisecond))
}

// SIGTERM with 50 deliveries in flight (45 whose Resend fetch the fake API
// holds until 1.3s after the signal, 5 stuck past the 3s handler deadline)
// and a stream of Stripe deliveries: every delivery sent before the signal
// is answered, 200 or 500 with its claim released; /readyz answers 503
// while the listener still accepts (SHUTDOWN_DELAY=1s); the process exits 0.
func TestSIGTERMUnderLoad(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{
		"SHUTDOWN_DELAY":       "1s",
		"HANDLER_TIMEOUT":      "3s",
		"CLAIM_PROCESSING_TTL": "6s",
	})
	const held, stuck = 45, 5
	release := make(chan struct{})
	var waiting sync.WaitGroup
	waiting.Add(held + stuck)
	r.api.SetHook(func(ctx context.Context, id string) int {
		waiting.Done()
		if strings.Contains(id, "stuck") {
			<-ctx.Done()
			return http.StatusGatewayTimeout
		}
		select {
		case <-release:
			return 0
		case <-ctx.Done():
			return http.StatusGatewayTimeout
		}
	})

	type sent struct {
		mail   faulttest.Email
		answer faulttest.Answer
	}
	inflight := make([]sent, held+stuck)
	var answered sync.WaitGroup
	for i := range inflight {
		name := fmt.Sprintf("held-%02d", i)
		if i >= held {
			name = fmt.Sprintf("stuck-%02d", i)
		}
		inflight[i].mail = newEmail(name)
		r.api.Add(inflight[i].mail)
		answered.Add(1)
		go func() {
			defer answered.Done()
			inflight[i].answer = r.resend(svc, inflight[i].mail)
		}()
	}
	waitGroup(t, &waiting, 10*time.Second, "50 handlers fetching")

	// A provider keeps sending, each delivery on a new connection, until the
	// listener refuses.
	streamer := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var stream []faulttest.Answer
	var streamEvents []faulttest.StripeEvent
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		for i := 1; ; i++ {
			ev := subEvent(i, "active")
			req, err := faulttest.StripeRequest(context.Background(), svc.URL(), ev.JSON(), time.Now())
			if err != nil {
				panic(err)
			}
			a := faulttest.Do(streamer, req)
			stream = append(stream, a)
			streamEvents = append(streamEvents, ev)
			if a.Err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)

	if err := svc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	type probe struct {
		at     time.Duration
		status int
	}
	var probes []probe
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		for refused := 0; refused < 3 && time.Since(signalled) < 10*time.Second; {
			status := svc.Probe(context.Background(), "/readyz")
			probes = append(probes, probe{time.Since(signalled), status})
			if status == 0 {
				refused++
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.AfterFunc(1300*time.Millisecond, func() { close(release) })

	answered.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	state, err := svc.Wait(ctx)
	if err != nil {
		t.Fatalf("service still running 20s after SIGTERM: %v", err)
	}
	exited := time.Since(signalled)
	<-probesDone
	<-streamDone

	if state.ExitCode() != 0 {
		t.Errorf("exit after SIGTERM: %v, want 0", state)
	}
	var ok, failed int
	var lastAnswer time.Duration
	for _, s := range inflight {
		a := s.answer
		lastAnswer = max(lastAnswer, a.Done.Sub(signalled))
		switch {
		case a.OK() && a.Idempotency == "first":
			ok++
			if n := r.supportRows(s.mail); n != 1 {
				t.Errorf("%s answered 200 but has %d support rows", s.mail.SvixID, n)
			}
			if v, _ := r.claim("resend", s.mail.SvixID); !strings.HasPrefix(v, "done|") {
				t.Errorf("%s answered 200, claim = %q, want done", s.mail.SvixID, v)
			}
		case a.Status == http.StatusInternalServerError:
			failed++
			if v, _ := r.claim("resend", s.mail.SvixID); v != "" {
				t.Errorf("%s answered 500, claim = %q, want released", s.mail.SvixID, v)
			}
			if n := r.supportRows(s.mail); n != 0 {
				t.Errorf("%s answered 500 but has %d support rows", s.mail.SvixID, n)
			}
		default:
			t.Errorf("%s in flight at SIGTERM: %v, want 200 or 500", s.mail.SvixID, a)
		}
	}
	if ok != held || failed != stuck {
		t.Errorf("%d answered 200 and %d 500, want %d and %d", ok, failed, held, stuck)
	}

	streamOK, streamAfter := 0, 0
	for i, a := range stream {
		if a.Err != nil {
			if a.Sent.Before(signalled) {
				t.Errorf("stream delivery sent before the signal got no answer: %v", a)
			}
			continue
		}
		if !a.OK() || a.Idempotency != "first" {
			t.Errorf("stream delivery %d: %v, want 200 first", i, a)
			continue
		}
		streamOK++
		if a.Sent.After(signalled) {
			streamAfter++
		}
		if _, found := r.entitlement(streamEvents[i].SubscriptionID); !found {
			t.Errorf("stream delivery %d answered 200 but has no entitlement", i)
		}
	}

	// The signal is handled a moment after it is sent; from the first 503
	// on, readiness never comes back.
	var first503, firstRefused time.Duration = -1, -1
	for _, p := range probes {
		if p.status == http.StatusServiceUnavailable && first503 < 0 {
			first503 = p.at
		}
		if p.status == 0 && firstRefused < 0 {
			firstRefused = p.at
		}
		if p.status == http.StatusOK && first503 >= 0 {
			t.Errorf("/readyz answered 200 %v after SIGTERM, after a 503 at %v", p.at, first503)
		}
	}
	if first503 < 0 || first503 > 500*time.Millisecond || firstRefused < 0 || first503 > firstRefused {
		t.Errorf("/readyz after SIGTERM: first 503 at %v, listener closed at %v; want a 503 at once, before the listener closes", first503, firstRefused)
	}
	figure(t, "50 in flight at SIGTERM: %d answered 200 (released 1.3s after the signal), %d 500 at the 3s deadline with claims released; /readyz 503 from %v, listener closed at %v; %d stream deliveries 200 (%d of them sent after the signal); last answer %v, exit 0 after %v",
		ok, failed, first503.Round(time.Millisecond), firstRefused.Round(time.Millisecond), streamOK, streamAfter,
		lastAnswer.Round(time.Millisecond), exited.Round(time.Millisecond))
}

// waitGroup waits for wg, failing the test after timeout.
func waitGroup(t *testing.T, wg *sync.WaitGroup, timeout time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}
