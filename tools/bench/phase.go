package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// phase is what one kind of load against one target measured: one run, or
// the sum of the slices of interleaved rounds.
type phase struct {
	target string
	kind   string // first, duplicate, rejected, chi, verify
	fixed  bool   // fixed rate; else saturation
	want   int    // expected status
	load   loadResult

	cpu    time.Duration // the target process's CPU during the runs
	byProc counters      // CPU (ns) of the harness and everything it started, by process

	redis   counters // deltas; see redisDelta
	pg      counters // pg_stat_statements calls
	metrics counters // the service's /metrics
	notes   []string
}

// ours is the CPU of the harness and everything it started.
func (p *phase) ours() time.Duration { return time.Duration(p.byProc.sum()) }

func (p *phase) perRequest(d time.Duration) time.Duration {
	if p.load.requests == 0 {
		return 0
	}
	return d / time.Duration(p.load.requests)
}

func (p *phase) redisPer() counters { return p.redis.perRequest(max(p.load.requests, 1)) }
func (p *phase) pgPer() counters    { return p.pg.perRequest(max(p.load.requests, 1)) }

// add folds q, another slice of the same load, into p.
func (p *phase) add(q *phase) *phase {
	if p == nil {
		return q
	}
	l := &p.load
	l.requests += q.load.requests
	l.elapsed += q.load.elapsed
	l.errors += q.load.errors
	if l.firstErr == nil {
		l.firstErr = q.load.firstErr
	}
	for code, n := range q.load.statuses {
		l.statuses[code] += n
	}
	l.lat = append(l.lat, q.load.lat...)
	slices.Sort(l.lat)
	p.cpu += q.cpu
	p.redis = p.redis.plus(q.redis)
	p.pg = p.pg.plus(q.pg)
	p.metrics = p.metrics.plus(q.metrics)
	p.notes = append(p.notes, q.notes...)
	p.byProc = p.byProc.plus(q.byProc)
	return p
}

// outcomes counts the service's webhook_deliveries_total by outcome.
func (p *phase) outcomes() map[string]float64 {
	out := map[string]float64{}
	for k, v := range p.metrics {
		if !strings.HasPrefix(k, "webhook_deliveries_total{") {
			continue
		}
		_, rest, _ := strings.Cut(k, `outcome="`)
		outcome, _, _ := strings.Cut(rest, `"`)
		out[outcome] += v
	}
	return out
}

// settledMetrics reads the service's metrics until two reads 10 ms apart
// count the same deliveries (for at most a second). The service counts a
// delivery just after answering it, so the last answers of a run can be
// counted after the load generator has seen them, in the next run's window.
func settledMetrics(ctx context.Context, url string) (counters, error) {
	var last counters
	for range 100 {
		m, err := serviceMetrics(ctx, url)
		if err != nil {
			return nil, err
		}
		if last != nil && delivered(m) == delivered(last) {
			return m, nil
		}
		last = m
		time.Sleep(10 * time.Millisecond)
	}
	return last, nil
}

// delivered is the total of webhook_deliveries_total.
func delivered(c counters) float64 {
	var n float64
	for _, v := range (&phase{metrics: c}).outcomes() {
		n += v
	}
	return n
}

// checkOutcome notes a phase in which the service counted other outcomes
// than the one every request should have had.
func checkOutcome(p *phase, want string) {
	got := p.outcomes()
	if int(got[want]) != p.load.requests || len(got) != 1 {
		p.notes = append(p.notes, fmt.Sprintf("service counted outcomes %v for %d requests", got, p.load.requests))
	}
}

// target is a server under load.
type target struct {
	name       string
	addr       string
	pid        int
	metricsURL string // "" for the ceilings
	db         string // database whose statements are counted, "" for none
	pgPort     int
}

type snapshot struct {
	cpu     time.Duration
	byProc  counters
	redis   counters
	pg      counters
	metrics counters
}

func (h *harness) snapshot(ctx context.Context, t target) (snapshot, error) {
	var s snapshot
	var err error
	if t.metricsURL != "" {
		if s.metrics, err = settledMetrics(ctx, t.metricsURL); err != nil {
			return s, err
		}
	}
	if s.redis, err = redisCounters(ctx, h.rdb); err != nil {
		return s, err
	}
	if t.db != "" {
		if s.pg, err = pgStatements(ctx, postgresURL(t.pgPort, "postgres"), t.db); err != nil {
			return s, err
		}
	}
	if s.cpu, err = procCPU(t.pid); err != nil {
		return s, err
	}
	s.byProc, err = treeCPU(os.Getpid())
	return s, err
}

// runPhase warms the target up with the same load for o.warmup, then
// measures a run of d between two snapshots.
func (h *harness) runPhase(ctx context.Context, t target, kind string, want int, f *feed, fixed bool, d time.Duration) (*phase, error) {
	if h.o.warmup > 0 {
		if fixed {
			fixedRate(ctx, t.addr, f, h.o.concurrency, h.o.rate, h.o.warmup)
		} else {
			saturate(ctx, t.addr, f, h.o.concurrency, h.o.warmup)
		}
	}
	before, err := h.snapshot(ctx, t)
	if err != nil {
		return nil, err
	}
	var res loadResult
	if fixed {
		res = fixedRate(ctx, t.addr, f, h.o.concurrency, h.o.rate, d)
	} else {
		res = saturate(ctx, t.addr, f, h.o.concurrency, d)
	}
	after, err := h.snapshot(ctx, t)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &phase{
		target: t.name, kind: kind, fixed: fixed, want: want, load: res,
		cpu:     after.cpu - before.cpu,
		redis:   redisDelta(before.redis, after.redis),
		pg:      after.pg.minus(before.pg),
		metrics: after.metrics.minus(before.metrics),
		byProc:  after.byProc.minus(before.byProc),
	}
	if n := res.unexpected(want); n > 0 {
		p.notes = append(p.notes, fmt.Sprintf("%d of %d answers were not %d (%v; first error: %v)", n, res.requests, want, res.statuses, res.firstErr))
	}
	if !fixed && res.elapsed < d-100*time.Millisecond {
		p.notes = append(p.notes, fmt.Sprintf("ran out of pre-generated events after %.1f s", res.elapsed.Seconds()))
	}
	mode := "saturation"
	if fixed {
		mode = strconv.Itoa(h.o.rate) + " req/s"
	}
	h.logf("%-16s %-9s %-10s %6.0f req/s  p50 %6s  p99 %6s ms  cpu %4.0f µs/req  all %4.0f µs/req %v",
		t.name, kind, mode, res.throughput(), ms(res.percentile(.5)), ms(res.percentile(.99)),
		micros(p.perRequest(p.cpu)), micros(p.perRequest(p.ours())), p.notes)
	return p, nil
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }

func micros(d time.Duration) float64 { return float64(d) / 1e3 }
