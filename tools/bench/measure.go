package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// rssConcurrency is how many duplicates are in flight in the last run,
// after which the service's peak RSS is read. Keep it, and the runs before
// it, as they are: the figure is compared across changes of the service.
const rssConcurrency = 64

// The loads of every round, in this order; they index report.runs.
const (
	firsts = iota
	duplicates
	rejections
	chiCeiling
	intakeCeiling
	loads
)

// workload is one of the loads of a round: what is sent where, and the
// answer every request should get.
type workload struct {
	target  target
	feed    *feed
	status  int
	outcome string // counted by the service; "" for a ceiling
	// relay, when set, is the target's relay: a run waits for it to have
	// sent every change before it starts and after its load, so that the
	// run's CPU holds all the webhooks its requests caused and none of an
	// earlier run's.
	relay *relayProbe
}

// report is everything one run measured.
type report struct {
	o          options
	started    time.Time
	took       time.Duration
	eventBytes int
	runs       [2][loads]result // at saturation, at the fixed rate
	upsert     pgbenchRun
	peakRSS    int64 // KiB, VmHWM
}

// measure runs every load at saturation (and pgbench), then at the fixed
// rate, each in interleaved rounds so that the machine's background load
// falls on every target alike; then duplicates at rssConcurrency, after
// which it reads the service's peak RSS.
func (h *harness) measure(ctx context.Context) (*report, error) {
	rep := &report{o: h.o, started: h.started}
	events, err := loadFixture()
	if err != nil {
		return nil, err
	}
	rep.eventBytes = len(events)
	if err := h.startServers(ctx); err != nil {
		return nil, err
	}
	svc, err := h.startService(ctx, ".", benchDB)
	if err != nil {
		return nil, err
	}
	chi, err := h.startCeiling("chi")
	if err != nil {
		return nil, err
	}
	intake, err := h.startCeiling("intake")
	if err != nil {
		return nil, err
	}
	dupBody := events.event("dup", 0)
	once := &feed{reqs: [][]byte{request(dupBody, stripeSecret, time.Now())}}
	if r := saturate(ctx, svc.addr, once, 1, time.Minute); r.statuses[200] != 1 {
		return nil, fmt.Errorf("first delivery of the duplicate: %v, %v", r.statuses, r.firstErr)
	}
	h.logf("servers up")

	for i, fixed := range []bool{false, true} {
		h.logf("%s: %d rounds of %s per target", []string{"saturation", "fixed rate"}[i], h.o.rounds, h.o.duration/time.Duration(h.o.rounds))
		// Saturation needs at most 6,000 new events a second, more than a
		// 2-core machine manages.
		perSecond, secs := 6000, h.o.duration.Seconds()+float64(h.o.rounds)*h.o.warmup.Seconds()
		if fixed {
			// So that the autovacuum and checkpoint the saturation runs
			// trigger do not land in the fixed-rate runs' tail latency.
			if err := adminExec(ctx, h.benchURL, "VACUUM (ANALYZE) entitlements", "CHECKPOINT"); err != nil {
				return nil, err
			}
			perSecond = h.o.rate
		}
		// Every stage signs its requests afresh: signatures expire after
		// the service's 300 s tolerance.
		n := int(secs*float64(perSecond)) + h.o.concurrency
		ceil := repeated(events.event("ceiling", 0), stripeSecret)
		runs := [loads]workload{
			firsts:        {svc, &feed{reqs: events.firstDeliveries(stripeSecret, "f"+strconv.Itoa(i), n)}, 200, "processed", nil},
			duplicates:    {svc, repeated(dupBody, stripeSecret), 200, "duplicate", nil},
			rejections:    {svc, repeated(events.event("bad", 0), wrongSecret), 400, "rejected", nil},
			chiCeiling:    {chi, ceil, 200, "", nil},
			intakeCeiling: {intake, ceil, 200, "", nil},
		}
		for range h.o.rounds {
			d := h.o.duration / time.Duration(h.o.rounds)
			for j, w := range runs {
				res, err := h.runPhase(ctx, w, j, fixed, d)
				if err != nil {
					return nil, err
				}
				rep.runs[i][j].add(res)
				rep.runs[i][j].sort()
			}
			if !fixed {
				if err := h.pgbench(ctx, entitlements.ApplySQL, d, &rep.upsert); err != nil {
					return nil, err
				}
			}
		}
	}

	h.logf("%d duplicates in flight, for peak RSS", rssConcurrency)
	saturate(ctx, svc.addr, repeated(dupBody, stripeSecret), rssConcurrency, 3*time.Second)
	if rep.peakRSS, err = peakRSS(svc.pid); err != nil {
		return nil, err
	}
	rep.took = time.Since(h.started)
	return rep, nil
}

// snapshot reads every counter a result is the difference of; the
// service's metrics and statements only for the service.
func (h *harness) snapshot(ctx context.Context, t target) (counters, error) {
	c := counters{}
	var err error
	if t.db != "" {
		if c, err = settledMetrics("http://" + t.addr + "/metrics"); err != nil {
			return nil, err
		}
		if c[pgStatements], c[pgPlans], err = statements(ctx, h.admin, t.db); err != nil {
			return nil, err
		}
	}
	if c[roundTrips], err = redisRoundTrips(ctx, h.rdb); err != nil {
		return nil, err
	}
	_, own, _, err := procStat(t.pid)
	if err != nil {
		return nil, err
	}
	_, load, _, err := procStat(os.Getpid())
	if err != nil {
		return nil, err
	}
	all, err := ourCPU(h.app)
	c[targetCPU], c[allCPU], c[loadCPU] = float64(own), float64(all), float64(load)
	return c, err
}

// delta is what a run cost: the difference of the snapshots around it,
// less the reply to the INFO that read before's round trips.
func delta(before, after counters) counters {
	d := counters{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	d[roundTrips]--
	return d
}

// runPhase warms the target up with the same load for o.warmup, then
// measures a run of d between two snapshots.
func (h *harness) runPhase(ctx context.Context, w workload, kind int, fixed bool, d time.Duration) (result, error) {
	load := func(d time.Duration) result {
		if fixed {
			return fixedRate(ctx, w.target.addr, w.feed, h.o.concurrency, h.o.rate, d)
		}
		return saturate(ctx, w.target.addr, w.feed, h.o.concurrency, d)
	}
	load(h.o.warmup)
	var sent int // by the relay before the run
	if w.relay != nil {
		if err := w.relay.wait(ctx); err != nil {
			return result{}, err
		}
		var err error
		if sent, err = w.relay.delivered(ctx); err != nil {
			return result{}, err
		}
	}
	before, err := h.snapshot(ctx, w.target)
	if err != nil {
		return result{}, err
	}
	res := load(d)
	if w.relay != nil {
		if res.relay, err = h.catchUp(ctx, w, sent); err != nil {
			return result{}, err
		}
	}
	after, err := h.snapshot(ctx, w.target) // fails too once ctx is done
	if err != nil {
		return result{}, err
	}
	res.c = delta(before, after)
	h.logf("%-37s %6.0f req/s  p50 %6s  p99 %6s ms  cpu %4.0f µs/req  all %4.0f µs/req",
		label(kind)+map[string]string{againstDB: " (against)"}[w.target.db], res.throughput(), ms(res.percentile(.5)), ms(res.percentile(.99)), res.per(targetCPU)/1e3, res.per(allCPU)/1e3)
	// Figures of a run that did not do what it was meant to are not
	// figures: fail the bench rather than report them.
	if res.requests == 0 {
		return result{}, fmt.Errorf("%s: no requests in %s", label(kind), d)
	}
	if n := res.requests - res.statuses[w.status]; n > 0 {
		return result{}, fmt.Errorf("%s: %d of %d answers were not %d (%v; first error: %v)", label(kind), n, res.requests, w.status, res.statuses, res.firstErr)
	}
	counted := res.c[`webhook_deliveries_total{outcome="`+w.outcome+`",provider="stripe"}`]
	if w.outcome != "" && (int(counted) != res.requests || delivered(res.c) != counted) {
		return result{}, fmt.Errorf("%s: of %d requests the service counted %.0f deliveries, %.0f %s", label(kind), res.requests, delivered(res.c), counted, w.outcome)
	}
	return res, nil
}

// catchUp waits, after a run's load, for the relay to send what the run's
// requests caused, and measures that wait alone: what the relay still had
// to send and what it cost with nothing else running (but the wait's own
// polls, a query every 20 ms).
func (h *harness) catchUp(ctx context.Context, w workload, sentBefore int) (relayRun, error) {
	sentDuring, err := w.relay.delivered(ctx)
	if err != nil {
		return relayRun{}, err
	}
	start, err := h.snapshot(ctx, w.target)
	if err != nil {
		return relayRun{}, err
	}
	if err := w.relay.wait(ctx); err != nil {
		return relayRun{}, err
	}
	end, err := h.snapshot(ctx, w.target)
	if err != nil {
		return relayRun{}, err
	}
	sent, err := w.relay.delivered(ctx)
	if err != nil {
		return relayRun{}, err
	}
	return relayRun{sent: sent - sentBefore, caughtUp: sent - sentDuring, catchUp: delta(start, end)}, nil
}

// repeated is a feed of one request, body signed now with secret, sent
// over and over.
func repeated(body []byte, secret string) *feed {
	return &feed{reqs: [][]byte{request(body, secret, time.Now())}, cycle: true}
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }
