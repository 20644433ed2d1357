package faulttest_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// forwardEnv turns the forward to the team on, to the rig's fake Resend
// API.
var forwardEnv = map[string]string{
	"SUPPORT_FORWARD_TO":   "team@munchable.app",
	"SUPPORT_FORWARD_FROM": "Munchable Support <support-forward@munchable.app>",
	"SUPPORT_FORWARD_RATE": "50",
	"RELAY_RETRY_SCHEDULE": "100ms,100ms,100ms,1h",
}

// waitForward waits until the relay's forward consumer has taken its
// place at the end of the feed: what is queued from then on is forwarded.
func (r *rig) waitForward() {
	r.t.Helper()
	r.waitCount("the forward consumer", 1, `SELECT count(*) FROM feed_consumers WHERE name = 'forward' AND enabled`)
}

// waitCount polls query until it counts want.
func (r *rig) waitCount(what string, want int, query string, args ...any) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for r.count(query, args...) != want {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s (%d, want %d)", what, r.count(query, args...), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A mail delivered three times while Redis is stopped is queued once and
// forwarded once: every delivery runs degraded, the queue's unique keys
// make one message, one change, one send.
func TestForwardOnceWithRedisStopped(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(forwardEnv)
	r.waitForward()
	r.redis.Kill()
	m := newEmail("degraded-forward")
	r.api.Add(m)
	for i := range 3 {
		if a := r.resend(svc, m); !a.OK() || a.Idempotency != "degraded" {
			t.Fatalf("delivery %d with Redis stopped: %v, want 2xx degraded", i+1, a)
		}
	}
	r.waitCount("the forward delivered", 1, `SELECT count(*) FROM relay_deliveries WHERE consumer = 'forward' AND state = 'delivered'`)
	if n := r.supportRows(m); n != 1 {
		t.Errorf("support messages = %d, want 1", n)
	}
	if sends, emails := len(r.api.Sends()), r.api.Emails(); sends != 1 || emails != 1 {
		t.Errorf("POST /emails %d times, %d emails; want one of each", sends, emails)
	}
}

// A replica killed (SIGKILL) after Resend took a forward and before the
// relay recorded it sends it again on restart with the same
// Idempotency-Key: two requests, one email, and the delivery records the
// first email's id.
func TestForwardKilledBetweenSendAndRecord(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(forwardEnv)
	r.waitForward()
	// killed says the run has exited, not only that the kill began: a
	// restart before the kill is done would find the old run still there.
	var kill sync.Once
	var killed atomic.Bool
	r.api.SetSendHook(func(string) {
		kill.Do(func() {
			svc.Kill() // Resend has sent it; the answer never reaches the relay
			killed.Store(true)
		})
	})
	m := newEmail("killed-forward")
	r.api.Add(m)
	if a := r.resend(svc, m); !a.OK() {
		t.Fatalf("delivery: %v", a)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !killed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the forward was never sent")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := r.count(`SELECT count(*) FROM relay_deliveries WHERE state = 'delivered'`); n != 0 {
		t.Fatalf("%d deliveries recorded by a killed replica", n)
	}
	r.start(svc)
	r.waitCount("the forward delivered after the restart", 1, `SELECT count(*) FROM relay_deliveries WHERE consumer = 'forward' AND state = 'delivered'`)
	sends := r.api.Sends()
	if len(sends) != 2 || sends[0].Key != sends[1].Key || r.api.Emails() != 1 {
		t.Fatalf("sends = %+v, %d emails; want the same Idempotency-Key twice, one email", sends, r.api.Emails())
	}
	want := sends[0].ID
	if n := r.count(`SELECT count(*) FROM relay_deliveries WHERE result = $1`, want); n != 1 {
		t.Errorf("the delivery does not record the first email's id %s", want)
	}
}

// Two replicas, one relay: mails delivered to both are each sent once,
// by whichever replica holds the relay's lock.
func TestForwardTwoReplicasOneSender(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	replicas := r.replicas(2, forwardEnv)
	r.waitForward()
	const mails = 6
	for i := range mails {
		m := newEmail(fmt.Sprintf("two-replicas-%d", i))
		r.api.Add(m)
		if a := r.resend(replicas[i%2], m); !a.OK() {
			t.Fatalf("delivery %d: %v", i, a)
		}
	}
	r.waitCount("every forward delivered", mails, `SELECT count(*) FROM relay_deliveries WHERE consumer = 'forward' AND state = 'delivered'`)
	keys := map[string]int{}
	for _, s := range r.api.Sends() {
		keys[s.Key]++
	}
	for k, n := range keys {
		if n != 1 {
			t.Errorf("%s sent %d times, want once", k, n)
		}
	}
	if len(keys) != mails || r.api.Emails() != mails {
		t.Errorf("%d keys sent, %d emails; want %d", len(keys), r.api.Emails(), mails)
	}
	if got := sumMetric(t, replicas, "relay_deliveries_total", "consumer", "forward", "outcome", "delivered"); got != mails {
		t.Errorf("relay_deliveries_total{delivered} over both replicas = %v, want %d", got, mails)
	}
}
