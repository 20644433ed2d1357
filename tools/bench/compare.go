package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"time"
)

// comparison is what -against measured: first deliveries at saturation on
// this build and on the one in o.against, in alternating rounds.
type comparison struct {
	o       options
	started time.Time
	took    time.Duration
	builds  [2]result // this build, the other
}

// compare runs first deliveries on both builds, each on its own database
// beside the other, round by round, the order swapped every round so that
// the machine's drifting background load falls on both alike. On a shared
// machine two make bench runs minutes apart differed by 15 % in all CPU
// per request (docs/PERFORMANCE.md); a change's cost is smaller than that.
func (h *harness) compare(ctx context.Context) (*comparison, error) {
	c := &comparison{o: h.o, started: h.started}
	events, err := loadFixture()
	if err != nil {
		return nil, err
	}
	if err := h.startServers(ctx); err != nil {
		return nil, err
	}
	var loads [2]workload
	secs := h.o.duration.Seconds() + float64(h.o.rounds)*h.o.warmup.Seconds()
	n := int(secs*6000) + h.o.concurrency // as measure: more than 2 cores manage
	for i, b := range []struct{ dir, db, tag string }{{".", benchDB, "this"}, {h.o.against, againstDB, "against"}} {
		svc, err := h.startService(ctx, b.dir, b.db)
		if err != nil {
			return nil, err
		}
		loads[i] = workload{svc, &feed{reqs: events.firstDeliveries(stripeSecret, b.tag, n)}, 200, "processed"}
	}
	h.logf("servers up; %d rounds of %s per build, this build first in odd rounds", h.o.rounds, h.o.duration/time.Duration(h.o.rounds))
	for round := range h.o.rounds {
		for k := range 2 {
			i := k ^ round%2
			res, err := h.runPhase(ctx, loads[i], firsts, false, h.o.duration/time.Duration(h.o.rounds))
			if err != nil {
				return nil, err
			}
			c.builds[i].add(res)
		}
	}
	for i := range c.builds {
		c.builds[i].sort()
	}
	c.took = time.Since(h.started)
	return c, nil
}

func (c *comparison) render(w io.Writer) {
	fmt.Fprintf(w, "# First deliveries, this build against %s\n\nWritten by `go run ./tools/bench -against %s` on %s in %s. "+
		"%d CPUs, %s; %d in flight; %d alternating rounds of %s per build, %s warm-up each.\n\n",
		c.o.against, c.o.against, c.started.UTC().Format("2006-01-02 15:04 MST"), c.took.Round(time.Second),
		runtime.NumCPU(), runtime.Version(), c.o.concurrency, c.o.rounds, c.o.duration/time.Duration(c.o.rounds), c.o.warmup)
	var rows [][]string
	for i, name := range []string{"this build", c.o.against} {
		r := c.builds[i]
		rows = append(rows, []string{name, rps(r.throughput()), ms(r.percentile(.5)), ms(r.percentile(.99)),
			us(r.per(targetCPU)), us(r.per(allCPU)), fmt.Sprintf("%.2f", r.per(pgStatements)), fmt.Sprintf("%.2f", r.per(roundTrips))})
	}
	this, other := c.builds[0], c.builds[1]
	change := func(a, b float64) string { return fmt.Sprintf("%+.0f %%", 100*(a/b-1)) }
	rows = append(rows, []string{"change", change(this.throughput(), other.throughput()), "", "",
		change(this.per(targetCPU), other.per(targetCPU)), change(this.per(allCPU), other.per(allCPU)), "", ""})
	table(w, []string{"build", "req/s", "p50 ms", "p99 ms", "process CPU µs/req", "all our CPU µs/req",
		"Postgres statements", "Redis round trips"}, rows)
}
