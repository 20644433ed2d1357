package faulttest_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// Three replicas share one Redis and one Postgres, as behind a load
// balancer. 50 concurrent deliveries of one Stripe event spread over them
// make one effect: one processed outcome and one handler run across all
// three; the rest are told in-progress (409) or duplicate. Then 1,000
// distinct events spread over them, 32 at a time, make 1,000 rows. Last,
// with Redis dead, 50 concurrent deliveries of one mail all run (degraded)
// and still make one support message: the store's unique keys hold.
func TestThreeReplicas(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	replicas := r.replicas(3, map[string]string{"DATABASE_MAX_CONNS": "16"})
	sum := func(name string, match ...string) float64 {
		t.Helper()
		return sumMetric(t, replicas, name, match...)
	}

	// One event, 50 concurrent deliveries.
	ev := subEvent(0, "active")
	answers := make([]faulttest.Answer, 50)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			answers[i] = r.stripe(replicas[i%3], ev)
		}()
	}
	close(gate)
	wg.Wait()
	tally := map[string]int{}
	for i, a := range answers {
		key := http.StatusText(a.Status) + " " + a.Idempotency
		tally[key]++
		switch {
		case a.OK() && (a.Idempotency == "first" || a.Idempotency == "duplicate"):
		case a.Status == http.StatusConflict && a.Idempotency == "in-progress":
			// The provider retries it.
			retried := untilOK(10*time.Second, func() faulttest.Answer { return r.stripe(replicas[i%3], ev) })
			if last := retried[len(retried)-1]; !last.OK() || last.Idempotency != "duplicate" {
				t.Errorf("retry of a 409: %v, want 200 duplicate", last)
			}
		default:
			t.Errorf("concurrent delivery %d: %v", i, a)
		}
	}
	if tally["OK first"] != 1 {
		t.Errorf("answers %v: want exactly one 200 first", tally)
	}
	if n := sum("webhook_deliveries_total", "provider", "stripe", "outcome", "processed"); n != 1 {
		t.Errorf("processed outcomes across replicas = %v, want 1", n)
	}
	if n := sum("webhook_handler_duration_seconds_count", "provider", "stripe"); n != 1 {
		t.Errorf("handler runs across replicas = %v, want 1", n)
	}
	if e, ok := r.entitlement(ev.SubscriptionID); !ok || e.LastEventID != ev.ID {
		t.Errorf("entitlement = %+v (found %v), want written by %s", e, ok, ev.ID)
	}
	figure(t, "one event, 50 concurrent deliveries over 3 replicas: %v; processed across replicas = 1, handler runs = 1", tally)

	// 1,000 distinct events, 32 at a time.
	const events, workers = 1000, 32
	var next atomic.Int64
	var attempts, failures atomic.Int64
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := int(next.Add(1))
				if n > events {
					return
				}
				e := subEvent(n, "active")
				got := untilOK(20*time.Second, func() faulttest.Answer { return r.stripe(replicas[n%3], e) })
				attempts.Add(int64(len(got)))
				if last := got[len(got)-1]; !last.OK() || last.Idempotency != "first" {
					failures.Add(1)
					t.Errorf("%s: %v, want 200 first", e.ID, last)
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if n := r.count(`SELECT count(*) FROM entitlements WHERE stripe_subscription_id <> $1`, ev.SubscriptionID); n != events {
		t.Errorf("%d entitlement rows for %d events", n, events)
	}
	if n := sum("webhook_deliveries_total", "provider", "stripe", "outcome", "processed"); n != events+1 {
		t.Errorf("processed outcomes across replicas = %v, want %d", n, events+1)
	}
	figure(t, "1000 distinct events over 3 replicas, 32 concurrent: 1000 rows, %d attempts, %d failures, %v (%.0f deliveries/s)",
		attempts.Load(), failures.Load(), took.Round(time.Millisecond), float64(events)/took.Seconds())

	// Redis dead: no claim protects anything; the stores do.
	r.redis.Kill()
	mail := newEmail("replicas-no-redis")
	r.api.Add(mail)
	fetchesBefore := r.api.Fetches()
	gate = make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			answers[i] = r.resend(replicas[i%3], mail)
		}()
	}
	close(gate)
	wg.Wait()
	degraded := 0
	for i, a := range answers {
		if a.OK() && a.Idempotency == "degraded" {
			degraded++
			continue
		}
		t.Errorf("delivery %d of one mail with Redis dead: %v, want 200 degraded", i, a)
	}
	if n := r.supportRows(mail); n != 1 {
		t.Errorf("%d support rows for one mail delivered 50 times without Redis, want 1", n)
	}
	figure(t, "Redis dead, one mail delivered 50 times concurrently over 3 replicas: %d answered 200 degraded, %d handler runs (Resend fetches), 1 support row",
		degraded, r.api.Fetches()-fetchesBefore)
}
