package stripesync

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/leader"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// sweepJob is the Stripe sweep as serve builds it, on pool, counted in reg.
func (r *rig) sweepJob(reg prometheus.Registerer, interval time.Duration) leader.Job {
	return sweep.Job(sweep.Source{Provider: "stripe", Horizon: Window, Pass: SweepPass(ReplayConfig{
		API: r.client, Receiver: r.replayer, Endpoint: r.ep, Logger: r.logger,
	})}, sweep.Config{Interval: interval, Overlap: 10 * time.Minute, HorizonMargin: 5 * 24 * time.Hour,
		Metrics: sweep.NewMetrics(reg), Logger: r.logger})
}

// replica is another process's pool on the rig's database.
func (r *rig) replica(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), r.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (r *rig) addEvents(t *testing.T, prefix string, n int, created int64) {
	t.Helper()
	for i := range n {
		s := stripetest.Subscription{ID: fmt.Sprintf("sub_%s%05d", prefix, i), Customer: fmt.Sprintf("cus_%s%05d", prefix, i),
			Status: "active", PriceID: "price_basic", Created: created, PeriodEnd: created + 30*86400}
		r.api.AddEvent(r.fx.Event(fmt.Sprintf("evt_%s%05d", prefix, i), "customer.subscription.created", created, r.fx.Subscription(s), nil), false)
	}
}

// TestSweepRecoversUndelivered: of four events in Stripe's list, one was
// delivered by its webhook and one by a webhook that ran degraded (its
// claim is gone, as after a Redis outage); one pass applies the other two
// and counts them recovered, and the delivered ones are not counted. A
// second pass, within the overlap, recovers nothing.
func TestSweepRecoversUndelivered(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	now := time.Now().Unix()
	r.addEvents(t, "sw", 4, now-60)
	for _, id := range []string{"sw00001", "sw00003"} {
		delivered := stripetest.Subscription{ID: "sub_" + id, Customer: "cus_" + id, Status: "active", PriceID: "price_basic", Created: now - 60, PeriodEnd: now + 30*86400}
		r.deliver(t, r.fx.Event("evt_"+id, "customer.subscription.created", now-60, r.fx.Subscription(delivered), nil))
	}
	if err := r.rdb.Del(t.Context(), r.prefix+":stripe:evt_sw00003").Err(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	job := r.sweepJob(reg, 5*time.Minute)
	s := leader.Scheduler{Pool: r.pool, Poll: time.Minute, Logger: r.logger}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	s.Run(ctx, job) // one pass, then polls until the timeout
	cancel()
	if got := recovered(t, reg); got != 2 {
		t.Errorf("recovered = %v, want 2 (the delivered events are not)", got)
	}
	if rows := r.rows(t); len(rows) != 4 {
		t.Errorf("%d subscriptions stored, want 4", len(rows))
	}
	if n := metric(t, reg, "webhook_sweep_last_success_timestamp_seconds"); n < float64(now) {
		t.Errorf("last success = %v, want set by the pass", n)
	}
	// Due again: the next pass lists the same events (overlap) and
	// finds them all done.
	if _, err := r.pool.Exec(t.Context(), `UPDATE scheduled_jobs SET started_at = started_at - interval '6 minutes'`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), time.Second)
	s.Run(ctx, job)
	cancel()
	if got := recovered(t, reg); got != 2 {
		t.Errorf("after a second pass recovered = %v, want still 2", got)
	}
}

// metric is the value of the one series of the named counter or gauge
// (0 when absent).
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

func recovered(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return metric(t, reg, "webhook_sweep_recovered_total")
}

// TestSweepTwoReplicas: two replicas' schedulers sweep the same account
// at once; the lock lets one pass run, so each event is applied once and
// counted once.
func TestSweepTwoReplicas(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.addEvents(t, "two", 250, time.Now().Unix()-60)
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, pool := range []*pgxpool.Pool{r.pool, r.replica(t)} {
		job := r.sweepJob(regs[i], time.Hour)
		s := leader.Scheduler{Pool: pool, Poll: 50 * time.Millisecond, Logger: r.logger}
		wg.Go(func() { s.Run(ctx, job) })
	}
	wg.Wait()
	total := recovered(t, regs[0]) + recovered(t, regs[1])
	if total != 250 {
		t.Errorf("recovered on both replicas = %v, want 250: each event applied once", total)
	}
	if got := r.api.Calls(stripetest.ListEvents); got != 6 {
		t.Errorf("event pages listed = %d, want 6 (one pass: two listings of three pages)", got)
	}
}

// TestSweepLarge sweeps 10,000 undelivered events against the fake, and
// reports time and peak heap; then again, all delivered, for what a pass
// costs when the webhooks work.
func TestSweepLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 events: not in -short")
	}
	r := newRig(t)
	r.logger = slog.New(slog.DiscardHandler)
	const total = 10_000
	r.addEvents(t, "big", total, time.Now().Unix()-120)
	reg := prometheus.NewRegistry()
	job := r.sweepJob(reg, time.Hour)
	peak := watchHeap(t)
	heapBase := peak()
	start := time.Now()
	out, err := job.Run(t.Context(), time.Time{})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	n := out.(sweep.Counts)
	if n.Listed != total || n.Recovered != total {
		t.Fatalf("sweep = %+v, want %d listed and recovered", n, total)
	}
	t.Logf("sweep of %d undelivered events: %s, peak live heap %.1f MiB (before the pass %.1f MiB: the fake's events)",
		total, elapsed.Round(time.Millisecond), float64(peak())/(1<<20), float64(heapBase)/(1<<20))

	start = time.Now()
	out, err = job.Run(t.Context(), time.Time{})
	if err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if n := out.(sweep.Counts); n.Delivered != total || n.Recovered != 0 {
		t.Fatalf("second sweep = %+v, want all %d delivered", n, total)
	}
	t.Logf("sweep of %d delivered events: %s, peak live heap %.1f MiB", total, time.Since(start).Round(time.Millisecond), float64(peak())/(1<<20))
}
