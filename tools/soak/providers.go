package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// providers plays Stripe and Svix: it sends every delivery, concurrently,
// signs every attempt afresh (Stripe's tolerance is 300 s, Svix's 5 min,
// and a compressed retry schedule can outlast neither, but real ones can),
// and retries every answer but a 2xx with exponential backoff, compressed
// from hours to milliseconds.
type providers struct {
	baseURL  string
	client   *http.Client
	deadline time.Time // no retry is scheduled after it

	work    chan attempt
	pending sync.WaitGroup

	attempts, retries                         atomic.Int64
	first, duplicate, degraded                atomic.Int64
	conflict, failed, unavailable, rejected   atomic.Int64
	other, noAnswer, acked, undelivered, sent atomic.Int64
	// noAnswer, by cause: nothing listening, the connection broken
	// (reset, EOF: the service died mid-request), the attempt timed out.
	refused, broken, timedOut atomic.Int64
	slowest                   atomic.Int64 // nanoseconds, over all attempts
}

// attempt is the nth attempt of a delivery.
type attempt struct {
	d *delivery
	n int
}

func newProviders(baseURL string, concurrency int, deadline time.Time) *providers {
	return &providers{
		baseURL:  baseURL,
		deadline: deadline,
		client: &http.Client{
			// Svix gives an attempt 15 s, Stripe a little more; the service
			// answers within HANDLER_TIMEOUT + 2 x REDIS_TIMEOUT.
			Timeout: 10 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        concurrency * 2,
				MaxIdleConnsPerHost: concurrency * 2,
			},
		},
		work: make(chan attempt),
	}
}

// run sends every delivery, rate a second at most (0: as fast as the
// workers go), and returns once each one has been answered 2xx or given up
// on at the deadline.
func (p *providers) run(ctx context.Context, deliveries []*delivery, concurrency int, rate float64) {
	var workers sync.WaitGroup
	for range concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for a := range p.work {
				p.try(ctx, a)
			}
		}()
	}
	start := time.Now()
	for i, d := range deliveries {
		if rate > 0 {
			due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
		}
		p.pending.Add(1)
		p.sent.Add(1)
		p.work <- attempt{d: d, n: 1}
	}
	p.pending.Wait()
	close(p.work)
	workers.Wait()
	p.client.CloseIdleConnections()
}

func (p *providers) try(ctx context.Context, a attempt) {
	p.attempts.Add(1)
	if a.n > 1 {
		p.retries.Add(1)
	}
	var req *http.Request
	var err error
	if a.d.stripe != nil {
		req, err = faulttest.StripeRequest(ctx, p.baseURL, a.d.stripe.body, time.Now())
	} else {
		req, err = faulttest.ResendRequest(ctx, p.baseURL, a.d.mail.Email, time.Now())
	}
	if err != nil {
		panic(err) // signing a well-formed body does not fail
	}
	ans := faulttest.Do(p.client, req)
	for took := int64(ans.Done.Sub(ans.Sent)); ; {
		old := p.slowest.Load()
		if took <= old || p.slowest.CompareAndSwap(old, took) {
			break
		}
	}
	switch {
	case ans.Status == 0:
		p.noAnswer.Add(1)
		var ne net.Error
		switch {
		case errors.Is(ans.Err, syscall.ECONNREFUSED):
			p.refused.Add(1)
		case errors.As(ans.Err, &ne) && ne.Timeout():
			p.timedOut.Add(1)
		default:
			p.broken.Add(1)
		}
	case ans.OK() && ans.Idempotency == "degraded":
		p.degraded.Add(1)
	case ans.OK() && ans.Idempotency == "duplicate":
		p.duplicate.Add(1)
	case ans.OK():
		p.first.Add(1)
	case ans.Status == http.StatusConflict:
		p.conflict.Add(1)
	case ans.Status == http.StatusInternalServerError:
		p.failed.Add(1)
	case ans.Status == http.StatusServiceUnavailable:
		p.unavailable.Add(1)
	case ans.Status == http.StatusBadRequest:
		p.rejected.Add(1)
	default:
		p.other.Add(1)
	}
	if ans.OK() {
		if m := a.d.mail; m != nil {
			m.firstAck.CompareAndSwap(0, ans.Done.UnixNano())
		}
		p.acked.Add(1)
		p.pending.Done()
		return
	}
	if ctx.Err() != nil || time.Now().After(p.deadline) {
		p.undelivered.Add(1)
		p.pending.Done()
		return
	}
	next := attempt{d: a.d, n: a.n + 1}
	time.AfterFunc(faulttest.Backoff(a.n, 100*time.Millisecond, 3*time.Second, rand.Float64()), func() {
		p.work <- next
	})
}
