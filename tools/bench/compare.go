package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	// relayed is, with -app-webhook, what the relay made of the compared
	// build's changes by the end of the run.
	relayed *relayed
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
	var appEnv []string
	var relays [2]*relayProbe
	if h.o.appWebhook {
		if appEnv, err = h.startReceiver(ctx); err != nil {
			return nil, err
		}
		conn, err := pgx.Connect(ctx, h.benchURL)
		if err != nil {
			return nil, err
		}
		defer conn.Close(context.Background())
		relays[0] = &relayProbe{conn}
	}
	for i, dir := range []string{".", h.o.against} {
		if svcs[i], err = h.startService(ctx, dir, []string{benchDB, againstDB}[i], [][]string{appEnv, nil}[i]...); err != nil {
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
				w := workload{target: svcs[i], feed: &feed{reqs: events.firstDeliveries(stripeSecret, tag, n)}, status: 200, outcome: "processed", relay: relays[i]}
				res, err := h.runPhase(ctx, w, firsts, fixed, d)
				if err != nil {
					return nil, err
				}
				c.rounds[mode][round][i] = res
			}
		}
	}
	if h.o.appWebhook {
		if c.relayed, err = h.relayedSoFar(ctx); err != nil {
			return nil, err
		}
	}
	c.took = time.Since(h.started)
	return c, nil
}

// deliveryCPU is all our CPU but the load generator's, per request: what
// the service, Postgres, Redis and the kernel spent on a delivery.
func deliveryCPU(r result) float64 { return r.per(allCPU) - r.per(loadCPU) }

func (c *comparison) render(w io.Writer) {
	names := c.names()
	fmt.Fprintf(w, "# First deliveries, %s against %s\n\nWritten by `go run ./tools/bench %s` on %s in %s. "+
		"%d CPUs, %s; %s; %d in flight at saturation, %d req/s at the fixed rate; %d alternating rounds of %s per build and mode, %s warm-up each.\n\n",
		names[0], names[1], c.flags(), c.started.UTC().Format("2006-01-02 15:04 MST"), c.took.Round(time.Second),
		runtime.NumCPU(), runtime.Version(), c.o.postgres(), c.o.concurrency, c.o.rate, c.o.rounds, c.o.duration/time.Duration(c.o.rounds), c.o.warmup)
	fmt.Fprint(w, "Delivery CPU is all our CPU but the load generator's: the service, Postgres, Redis and the kernel on their behalf.\n\n")
	if c.relayed != nil {
		fmt.Fprintf(w, "With the app's webhook on, the service sent every change to examples/appreceiver (at nice 19, not counted in our CPU); "+
			"by the end of the run the relay had delivered %d of the %d changes it took (%d still pending or failed), "+
			"each a median of %s after its change committed (p99 %s). "+
			"Each of its runs ends when the relay has sent every change: its CPU holds the webhooks its deliveries caused, its latencies only the load's time.\n\n"+
			"Tuples of the relay's tables (relay_deliveries, feed_consumers) written a change delivered, as Postgres counted them over the whole run "+
			"(inserted %d, updated %d, deleted %d): **%.3f**.\n\n",
			c.relayed.delivered, c.relayed.taken, c.relayed.taken-c.relayed.delivered, c.relayed.lagP50.Round(time.Millisecond), c.relayed.lagP99.Round(time.Millisecond),
			c.relayed.ins, c.relayed.upd, c.relayed.del, float64(c.relayed.ins+c.relayed.upd+c.relayed.del)/float64(max(c.relayed.delivered, 1)))
	}
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
		for i, name := range c.names() {
			r := builds[i]
			rows = append(rows, []string{name, rps(r.throughput()), ms(r.percentile(.5)), ms(r.percentile(.99)),
				us(r.per(targetCPU)), us(deliveryCPU(r)), us(r.per(allCPU)),
				fmt.Sprintf("%.2f", r.per(pgStatements)), fmt.Sprintf("%.2f", r.per(pgPlans)), fmt.Sprintf("%.2f", r.per(roundTrips))})
		}
		this, other := builds[0], builds[1]
		ratio := func(a, b time.Duration) string { return fmt.Sprintf("x%.2f", float64(a)/float64(b)) }
		rows = append(rows, []string{"change", change(this.throughput(), other.throughput()),
			ratio(this.percentile(.5), other.percentile(.5)), ratio(this.percentile(.99), other.percentile(.99)),
			change(this.per(targetCPU), other.per(targetCPU)), change(deliveryCPU(this), deliveryCPU(other)),
			change(this.per(allCPU), other.per(allCPU)), "", "", ""})
		var relayNote string
		if r := this.relay; r.caughtUp > 0 {
			// The relay's cost per webhook, as it caught up with nothing
			// else running, taken off each run for every webhook it sent.
			perWebhook := func(key string) float64 { return r.catchUp[key] / float64(r.caughtUp) }
			less := func(run result) result {
				run.c = maps.Clone(run.c)
				for _, key := range []string{targetCPU, allCPU} {
					run.c[key] -= perWebhook(key) * float64(run.relay.sent)
				}
				return run
			}
			own := less(this)
			rows = append(rows,
				[]string{"app webhook on, less the relay's work", "", "", "", us(own.per(targetCPU)), us(deliveryCPU(own)), us(own.per(allCPU)), "", "", ""},
				[]string{"change, less the relay's work", "", "", "",
					change(own.per(targetCPU), other.per(targetCPU)), change(deliveryCPU(own), deliveryCPU(other)), change(own.per(allCPU), other.per(allCPU)), "", "", ""})
			var ownRounds []float64
			for _, r := range c.rounds[mode] {
				ownRounds = append(ownRounds, deliveryCPU(less(r[0]))/deliveryCPU(r[1]))
			}
			slices.Sort(ownRounds)
			relayNote = fmt.Sprintf("The relay's own cost, measured as it caught up after each run with the load stopped (%d of the %d webhooks the runs caused): "+
				"%s µs of process CPU and %s µs of all our CPU a webhook. The rows \"less the relay's work\" take that cost off the app webhook's runs for each of the %d: "+
				"what its deliveries themselves cost; round by round, their delivery CPU against the relay off: median %s, from %s to %s.\n\n",
				r.caughtUp, r.sent, us(perWebhook(targetCPU)), us(perWebhook(allCPU)), r.sent,
				change(median(ownRounds), 1), change(ownRounds[0], 1), change(ownRounds[len(ownRounds)-1], 1))
		}
		fmt.Fprintf(w, "## %s\n\n", title)
		table(w, []string{"build", "req/s", "p50 ms", "p99 ms", "process CPU µs/req", "delivery CPU µs/req", "all our CPU µs/req",
			"Postgres statements", "Postgres plans", "Redis round trips"}, rows)
		slices.Sort(perRound)
		fmt.Fprintf(w, "Delivery CPU, %s's change round by round: median %s, from %s to %s.\n\n", names[0],
			change(median(perRound), 1), change(perRound[0], 1), change(perRound[len(perRound)-1], 1))
		fmt.Fprint(w, relayNote)
	}
}

// names are the two services' names in the report.
func (c *comparison) names() [2]string {
	if c.o.appWebhook {
		return [2]string{"app webhook on", "relay off"}
	}
	return [2]string{"this build", c.o.against}
}

// flags are the harness's flags that made the comparison.
func (c *comparison) flags() string {
	if c.o.appWebhook {
		return "-app-webhook"
	}
	return "-against " + c.o.against
}

// relayProbe watches the app webhook's deliveries on the compared build's
// database.
type relayProbe struct{ conn *pgx.Conn }

// delivered counts the webhooks sent so far.
func (p *relayProbe) delivered(ctx context.Context) (int, error) {
	var n int
	err := p.conn.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries WHERE consumer = 'app_webhook' AND state = 'delivered'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("the relay's deliveries: %w", err)
	}
	return n, nil
}

// wait waits until the relay has delivered every change there is.
func (p *relayProbe) wait(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var done bool
		err := p.conn.QueryRow(ctx, `
SELECT coalesce((SELECT max(change_id) FROM relay_deliveries WHERE consumer = 'app_webhook'), 0) = coalesce((SELECT max(id) FROM changes), 0)
   AND NOT EXISTS (SELECT 1 FROM relay_deliveries WHERE state <> 'delivered')`).Scan(&done)
		if err != nil {
			return fmt.Errorf("the relay's progress: %w", err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the relay has not sent every change after 5 minutes")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// relayed counts the compared build's deliveries to the app and how long
// after their changes they went.
type relayed struct {
	taken, delivered int
	lagP50, lagP99   time.Duration
	// ins, upd, del are the tuples the relay wrote to its tables.
	ins, upd, del int64
}

func (h *harness) relayedSoFar(ctx context.Context) (*relayed, error) {
	conn, err := pgx.Connect(ctx, h.benchURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var r relayed
	var p50, p99 *float64
	err = conn.QueryRow(ctx, `
SELECT count(*), count(*) FILTER (WHERE d.state = 'delivered'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM d.delivered_at - c.at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM d.delivered_at - c.at))
FROM relay_deliveries d JOIN changes c ON c.id = d.change_id`).Scan(&r.taken, &r.delivered, &p50, &p99)
	if err != nil {
		return nil, fmt.Errorf("the relay's deliveries: %w", err)
	}
	if p50 != nil && p99 != nil {
		r.lagP50, r.lagP99 = time.Duration(*p50*float64(time.Second)), time.Duration(*p99*float64(time.Second))
	}
	// A backend reports its counts once idle for a second, or at the
	// latest after 10 s (Postgres 15 on): the relay is idle now.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(11 * time.Second):
	}
	err = conn.QueryRow(ctx, `
SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint
FROM pg_stat_user_tables WHERE relname IN ('relay_deliveries', 'feed_consumers')`).Scan(&r.ins, &r.upd, &r.del)
	if err != nil {
		return nil, fmt.Errorf("the relay's tuples: %w", err)
	}
	return &r, nil
}

// median of sorted xs, which is not empty.
func median(xs []float64) float64 {
	m := len(xs) / 2
	if len(xs)%2 == 0 {
		return (xs[m-1] + xs[m]) / 2
	}
	return xs[m]
}
