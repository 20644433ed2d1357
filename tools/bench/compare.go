package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"
)

// comparison is what -against measured: first deliveries on this build
// and on the one in o.against, at saturation and at the fixed rate, in
// alternating rounds.
type comparison struct {
	o       options
	started time.Time
	took    time.Duration
	// rounds[mode][round][build]: mode 0 saturation, 1 fixed rate; build 0
	// this one, 1 the other.
	rounds [2][][2]result
}

// compare runs first deliveries on both builds, each on its own database
// beside the other, round by round, the order swapped every round so that
// the machine's drifting background load falls on both alike. On a shared
// machine two make bench runs minutes apart differed by 15 % in all CPU
// per request (docs/PERFORMANCE.md); a change's cost is smaller than that,
// so the report also compares each round's two runs, taken a few seconds
// apart, and gives the median of those changes.
func (h *harness) compare(ctx context.Context) (*comparison, error) {
	c := &comparison{o: h.o, started: h.started}
	events, err := loadFixture()
	if err != nil {
		return nil, err
	}
	if err := h.startServers(ctx); err != nil {
		return nil, err
	}
	var svcs [2]target
	for i, dir := range []string{".", h.o.against} {
		if svcs[i], err = h.startService(ctx, dir, []string{benchDB, againstDB}[i]); err != nil {
			return nil, err
		}
	}
	d := h.o.duration / time.Duration(h.o.rounds)
	h.logf("servers up; %d rounds of %s per build at saturation, then as many at %d req/s; this build first in odd rounds",
		h.o.rounds, d, h.o.rate)
	for mode, fixed := range []bool{false, true} {
		if fixed {
			// As measure: so that the autovacuum and checkpoint the
			// saturation rounds set off do not land in the first
			// fixed-rate rounds.
			for _, db := range []string{benchDB, againstDB} {
				url := strings.Replace(h.pg.URL(), "/postgres?", "/"+db+"?", 1)
				if err := adminExec(ctx, url, "VACUUM (ANALYZE) entitlements", "CHECKPOINT"); err != nil {
					return nil, err
				}
			}
		}
		// As measure: saturation needs at most 6,000 events a second. Each
		// round signs its own, as signatures expire after 300 s.
		n := int((d+h.o.warmup).Seconds()*float64([]int{6000, h.o.rate}[mode])) + h.o.concurrency
		c.rounds[mode] = make([][2]result, h.o.rounds)
		for round := range h.o.rounds {
			for k := range 2 {
				i := k ^ round%2
				tag := fmt.Sprintf("%s%d.%d", []string{"this", "against"}[i], mode, round)
				w := workload{svcs[i], &feed{reqs: events.firstDeliveries(stripeSecret, tag, n)}, 200, "processed"}
				res, err := h.runPhase(ctx, w, firsts, fixed, d)
				if err != nil {
					return nil, err
				}
				c.rounds[mode][round][i] = res
			}
		}
	}
	c.took = time.Since(h.started)
	return c, nil
}

// deliveryCPU is all our CPU but the load generator's, per request: what
// the service, Postgres, Redis and the kernel spent on a delivery.
func deliveryCPU(r result) float64 { return r.per(allCPU) - r.per(loadCPU) }

func (c *comparison) render(w io.Writer) {
	fmt.Fprintf(w, "# First deliveries, this build against %s\n\nWritten by `go run ./tools/bench -against %s` on %s in %s. "+
		"%d CPUs, %s; %s; %d in flight at saturation, %d req/s at the fixed rate; %d alternating rounds of %s per build and mode, %s warm-up each.\n\n",
		c.o.against, c.o.against, c.started.UTC().Format("2006-01-02 15:04 MST"), c.took.Round(time.Second),
		runtime.NumCPU(), runtime.Version(), c.o.postgres(), c.o.concurrency, c.o.rate, c.o.rounds, c.o.duration/time.Duration(c.o.rounds), c.o.warmup)
	fmt.Fprint(w, "Delivery CPU is all our CPU but the load generator's: the service, Postgres, Redis and the kernel on their behalf.\n\n")
	change := func(a, b float64) string { return fmt.Sprintf("%+.0f %%", 100*(a/b-1)) }
	for mode, title := range []string{"At saturation", fmt.Sprintf("At a fixed %s requests a second", rps(float64(c.o.rate)))} {
		var builds [2]result
		var perRound []float64 // this build's delivery CPU over the other's, round by round
		for _, r := range c.rounds[mode] {
			builds[0].add(r[0])
			builds[1].add(r[1])
			perRound = append(perRound, deliveryCPU(r[0])/deliveryCPU(r[1]))
		}
		for i := range builds {
			builds[i].sort()
		}
		var rows [][]string
		for i, name := range []string{"this build", c.o.against} {
			r := builds[i]
			rows = append(rows, []string{name, rps(r.throughput()), ms(r.percentile(.5)), ms(r.percentile(.99)),
				us(r.per(targetCPU)), us(deliveryCPU(r)), us(r.per(allCPU)),
				fmt.Sprintf("%.2f", r.per(pgStatements)), fmt.Sprintf("%.2f", r.per(pgPlans)), fmt.Sprintf("%.2f", r.per(roundTrips))})
		}
		this, other := builds[0], builds[1]
		rows = append(rows, []string{"change", change(this.throughput(), other.throughput()), "", "",
			change(this.per(targetCPU), other.per(targetCPU)), change(deliveryCPU(this), deliveryCPU(other)),
			change(this.per(allCPU), other.per(allCPU)), "", "", ""})
		fmt.Fprintf(w, "## %s\n\n", title)
		table(w, []string{"build", "req/s", "p50 ms", "p99 ms", "process CPU µs/req", "delivery CPU µs/req", "all our CPU µs/req",
			"Postgres statements", "Postgres plans", "Redis round trips"}, rows)
		slices.Sort(perRound)
		fmt.Fprintf(w, "Delivery CPU, this build's change round by round: median %s, from %s to %s.\n\n",
			change(median(perRound), 1), change(perRound[0], 1), change(perRound[len(perRound)-1], 1))
	}
}

// median of sorted xs, which is not empty.
func median(xs []float64) float64 {
	m := len(xs) / 2
	if len(xs)%2 == 0 {
		return (xs[m-1] + xs[m]) / 2
	}
	return xs[m]
}
