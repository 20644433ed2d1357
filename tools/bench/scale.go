package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// The scale bench (-scale N, `make bench-scale`) measures what the app's
// questions and the service's upkeep cost as the tables grow: the same
// figures on an empty database, at N/10 subscriptions and at N, side by
// side (docs/PERFORMANCE.md, "How cost grows").

// lookups are the app's access checks, by each key: the docs/APP.md query
// by client_reference_id, and the rows of a customer and of a
// subscription.
var lookups = []struct{ name, sql, key string }{
	{"access by client_reference_id", `SELECT coalesce(bool_or(has_access AND ('plan_1' = ANY (price_lookup_keys) OR 'plan_1' = ANY (features))), false)
FROM customer_access WHERE client_reference_id = $1`, "user_"},
	{"access by stripe_customer_id", `SELECT * FROM customer_access WHERE stripe_customer_id = $1`, "cus_scale_"},
	{"access by stripe_subscription_id", `SELECT * FROM customer_access WHERE stripe_subscription_id = $1`, "sub_scale_"},
	// The whole answer (GET /v1/access, access.changed): every row of the
	// customers the key names.
	{"answer by client_reference_id", access.LookupSQL(access.ByClientReference), "user_"},
	{"answer by stripe_customer_id", access.LookupSQL(access.ByCustomer), "cus_scale_"},
	{"answer by stripe_subscription_id", access.LookupSQL(access.BySubscription), "sub_scale_"},
}

// scaleTables are the tables whose disk per row the report gives.
var scaleTables = []string{"entitlements", "entitlement_items", "checkout_sessions", "customer_features", "webhook_events", "changes"}

// feedPage is the page a feed read asks for: changes tail's.
const feedPage = 500

// scalePoint is what one size measured.
type scalePoint struct {
	size        int
	grew        time.Duration
	sat, fixed  result
	lookup      [][]time.Duration // per lookup, sorted
	lookupExec  [][]time.Duration // per lookup, EXPLAIN ANALYZE's execution time, sorted
	feedStart   []time.Duration   // a page from the start, sorted
	feedEnd     []time.Duration   // one new change at the end, sorted
	drain       time.Duration     // every page from the start
	drained     int
	bytesPerRow map[string]float64
	rows        map[string]float64
	trim        *trimRun
	unpaced     *trimRun // the largest size only
}

// trimRun is one retention pass over expired rows, with deliveries at the
// fixed rate before, during and after it.
type trimRun struct {
	rows                  int64
	passes                int
	took                  time.Duration
	wal                   int64
	checkpoints           int64
	before, during, after result
}

type scaleReport struct {
	o       options
	started time.Time
	took    time.Duration
	points  []scalePoint
}

// scale grows the database to 0, N/10 and N subscriptions and measures
// each size.
func (h *harness) scale(ctx context.Context) (*scaleReport, error) {
	rep := &scaleReport{o: h.o, started: h.started}
	events, err := loadFixture()
	if err != nil {
		return nil, err
	}
	if err := h.startServers(ctx); err != nil {
		return nil, err
	}
	// The service trims nothing itself: the bench runs the trim it
	// measures, with the service's code and pace.
	h.o.serviceEnv = strings.Trim(h.o.serviceEnv+",EVENTS_RETENTION=0", ",")
	svc, err := h.startService(ctx, ".", benchDB)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, h.benchURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	pool, err := pgxpool.New(ctx, h.benchURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	sizes := []int{0, h.o.scale / 10, h.o.scale}
	sizes = slices.Compact(sizes)
	round := 0
	grown := 0
	for _, size := range sizes {
		p := scalePoint{size: size}
		start := time.Now()
		h.logf("growing to %d subscriptions", size)
		if err := grow(ctx, conn, grown, size); err != nil {
			return nil, err
		}
		grown = size
		p.grew = time.Since(start)
		h.logf("grown in %s", p.grew.Round(time.Second))

		for _, fixed := range []bool{false, true} {
			round++
			rate := 6000
			if fixed {
				rate = h.o.rate
			}
			n := int((h.o.duration+h.o.warmup).Seconds()*float64(rate)) + h.o.concurrency
			w := workload{svc, &feed{reqs: events.firstDeliveries(stripeSecret, "s"+strconv.Itoa(round), n)}, 200, "processed", nil}
			res, err := h.runPhase(ctx, w, firsts, fixed, h.o.duration)
			if err != nil {
				return nil, err
			}
			if fixed {
				p.fixed = res
			} else {
				p.sat = res
			}
		}
		if err := h.measureLookups(ctx, conn, &p); err != nil {
			return nil, err
		}
		if err := h.measureFeed(ctx, svc, events, &p); err != nil {
			return nil, err
		}
		if err := h.measureDisk(ctx, conn, &p); err != nil {
			return nil, err
		}
		if size > 0 {
			if p.trim, err = h.measureTrim(ctx, conn, pool, svc, events, size*9/10, nil); err != nil {
				return nil, err
			}
		}
		// The same pass unpaced, as the first release ran it, for
		// comparison under the same conditions.
		if size == h.o.scale {
			if p.unpaced, err = h.measureTrim(ctx, conn, pool, svc, events, size*9/10, &ledger.TrimPace{}); err != nil {
				return nil, err
			}
		}
		rep.points = append(rep.points, p)
	}
	rep.took = time.Since(h.started)
	return rep, nil
}

// measureLookups times each lookup 300 times on one connection, as an app
// sends it (a prepared statement: after five runs Postgres may keep a
// generic plan), for keys spread over the grown rows.
func (h *harness) measureLookups(ctx context.Context, conn *pgx.Conn, p *scalePoint) error {
	for _, l := range lookups {
		var lat []time.Duration
		for i := range 300 {
			g := 1 + i*7919%max(p.size, 1)
			start := time.Now()
			rows, err := conn.Query(ctx, l.sql, lookupKey(l.key, g))
			if err != nil {
				return err
			}
			for rows.Next() {
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("%s: %w", l.name, err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		p.lookup = append(p.lookup, lat)
		// The server's side alone, which the machine's load and the round
		// trip blur less: EXPLAIN ANALYZE's execution time.
		var exec []time.Duration
		for i := range 30 {
			g := 1 + i*7919%max(p.size, 1)
			var plan []struct {
				Execution float64 `json:"Execution Time"`
			}
			if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+l.sql, lookupKey(l.key, g)).Scan(&plan); err != nil || len(plan) != 1 {
				return fmt.Errorf("%s: EXPLAIN: %v", l.name, err)
			}
			exec = append(exec, time.Duration(plan[0].Execution*float64(time.Millisecond)))
		}
		slices.Sort(exec)
		p.lookupExec = append(p.lookupExec, exec)
		h.logf("%-37s p50 %6s  p99 %6s ms; in Postgres p50 %s ms", l.name, ms(pctl(lat, .5)), ms(pctl(lat, .99)), ms(pctl(exec, .5)))
	}
	return nil
}

// lookupKey is the key of grown subscription g.
func lookupKey(prefix string, g int) string {
	if prefix == "cus_scale_" {
		g /= 2
	}
	return prefix + strconv.Itoa(g)
}

// measureFeed reads the feed on one long-lived connection whose plans are
// generic (as a follower's become): a page from the start 20 times, every
// page to the end, then one new change at a time at the end.
func (h *harness) measureFeed(ctx context.Context, svc target, events fixture, p *scalePoint) error {
	conn, err := pgx.Connect(ctx, h.benchURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		return err
	}
	for range 20 {
		start := time.Now()
		if _, _, err := ledger.Read(ctx, conn, ledger.Cursor{}, feedPage); err != nil {
			return err
		}
		p.feedStart = append(p.feedStart, time.Since(start))
	}
	slices.Sort(p.feedStart)
	var c ledger.Cursor
	start := time.Now()
	for {
		page, next, err := ledger.Read(ctx, conn, c, feedPage)
		if err != nil {
			return err
		}
		p.drained += len(page)
		c = next
		if len(page) < feedPage {
			break
		}
	}
	p.drain = time.Since(start)
	cl := client{addr: svc.addr}
	defer cl.close()
	reqs := events.firstDeliveries(stripeSecret, "feed"+strconv.Itoa(p.size), 20)
	for _, req := range reqs {
		if status, err := cl.do(req); err != nil || status != 200 {
			return fmt.Errorf("delivery for the feed's end: %d, %v", status, err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			start := time.Now()
			page, next, err := ledger.Read(ctx, conn, c, feedPage)
			if err != nil {
				return err
			}
			p.feedEnd = append(p.feedEnd, time.Since(start))
			c = next
			if len(page) > 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("a delivery's change not in the feed after 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	slices.Sort(p.feedEnd)
	h.logf("feed: a page from the start p50 %s ms; every page, %d changes, in %s; at the end p50 %s ms",
		ms(pctl(p.feedStart, .5)), p.drained, p.drain.Round(time.Millisecond), ms(pctl(p.feedEnd, .5)))
	return nil
}

// measureDisk reads each table's size with its indexes and TOAST, per row
// (counted by the statistics the last VACUUM ANALYZE left).
func (h *harness) measureDisk(ctx context.Context, conn *pgx.Conn, p *scalePoint) error {
	p.bytesPerRow, p.rows = map[string]float64{}, map[string]float64{}
	for _, t := range scaleTables {
		var bytes, rows float64
		if err := conn.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)::float8, greatest(reltuples, 0)::float8 FROM pg_class WHERE oid = $1::regclass`, t).Scan(&bytes, &rows); err != nil {
			return err
		}
		p.rows[t] = rows
		if rows > 0 {
			p.bytesPerRow[t] = bytes / rows
		}
	}
	return nil
}

// measureTrim adds n expired rows to webhook_events and to changes, then
// runs retention as the service does (passes of its default pace, here
// one after another until nothing is left) while first deliveries go on
// at the fixed rate, and 60 s after it.
func (h *harness) measureTrim(ctx context.Context, conn *pgx.Conn, pool *pgxpool.Pool, svc target, events fixture, n int, pace *ledger.TrimPace) (*trimRun, error) {
	h.logf("adding %d expired rows to webhook_events and to changes", n)
	for _, sql := range []string{`
INSERT INTO webhook_events (provider, event_id, event_type, subject, outcome, attempts, first_seen_at, finished_at)
SELECT 'stripe', 'evt_expired_' || g, 'customer.subscription.updated', 'sub_expired_' || g, 'applied', 1,
       now() - interval '40 days', now() - interval '40 days'
FROM generate_series(1, $1::int) g`, `
INSERT INTO changes (at, kind, subject, stripe_customer_id, event_id, before, after)
SELECT now() - interval '40 days', 'subscription', 'sub_expired_' || g, 'cus_expired_' || g,
       'evt_expired_' || g, '{"status": "trialing"}', '{"status": "active"}'
FROM generate_series(1, $1::int) g`, `VACUUM ANALYZE webhook_events`, `VACUUM ANALYZE changes`, `CHECKPOINT`} {
		args := []any{}
		if strings.Contains(sql, "$1") {
			args = append(args, n)
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return nil, fmt.Errorf("expired rows: %w", err)
		}
	}
	round := 0
	deliver := func(d time.Duration) result {
		round++
		reqs := events.firstDeliveries(stripeSecret, fmt.Sprintf("t%d_%t_%d", n, pace != nil, round), int(d.Seconds()*float64(h.o.rate))+h.o.concurrency)
		return fixedRate(ctx, svc.addr, &feed{reqs: reqs}, h.o.concurrency, h.o.rate, d)
	}
	walAndCheckpoints := func() (wal, ckpt int64, err error) {
		err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)`).Scan(&wal, &ckpt)
		return wal, ckpt, err
	}
	tr := &trimRun{}
	deliver(time.Second) // warm-up
	tr.before = deliver(10 * time.Second)
	wal0, ck0, err := walAndCheckpoints()
	if err != nil {
		return nil, err
	}
	l := ledger.New(pool, 0)
	if pace != nil {
		l.SetTrimPace(*pace)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		for {
			ev, ch, err := l.Trim(ctx, 30*24*time.Hour)
			tr.rows += ev + ch
			tr.passes++
			if err != nil || ev+ch == 0 {
				tr.took = time.Since(start)
				done <- err
				return
			}
		}
	}()
	var trimErr error
	for running := true; running; {
		tr.during.add(deliver(time.Second))
		select {
		case trimErr = <-done:
			running = false
		default:
		}
	}
	if trimErr != nil {
		return nil, trimErr
	}
	tr.during.sort()
	for range 6 {
		tr.after.add(deliver(10 * time.Second))
	}
	tr.after.sort()
	wal1, ck1, err := walAndCheckpoints()
	if err != nil {
		return nil, err
	}
	tr.wal, tr.checkpoints = wal1-wal0, ck1-ck0
	h.logf("trim (unpaced %t) of %d rows in %s (%d passes); deliveries p99 before %s, during %s, after %s ms; max %s / %s / %s ms",
		pace != nil, tr.rows, tr.took.Round(time.Second), tr.passes-1, ms(tr.before.percentile(.99)), ms(tr.during.percentile(.99)), ms(tr.after.percentile(.99)),
		ms(tr.before.percentile(1)), ms(tr.during.percentile(1)), ms(tr.after.percentile(1)))
	return tr, nil
}

// pctl is the q-quantile of sorted durations.
func pctl(d []time.Duration, q float64) time.Duration {
	r := result{lat: d}
	return r.percentile(q)
}

// over counts the latencies above limit.
func over(r result, limit time.Duration) int {
	i, _ := slices.BinarySearch(r.lat, limit+1)
	return len(r.lat) - i
}

func (r *scaleReport) render(w io.Writer) {
	fmt.Fprintf(w, "# Latest scale bench run\n\nWritten by `make bench-scale` (tools/bench -scale %d) on %s in %s; do not edit: run it again. "+
		"docs/PERFORMANCE.md (\"How cost grows\") says what each figure measures.\n\n",
		r.o.scale, r.started.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	fmt.Fprintf(w, "%d CPUs, %s; %s; first deliveries at saturation with %d in flight and at a fixed %s req/s, %s each.\n\n",
		runtime.NumCPU(), runtime.Version(), r.o.postgres(), r.o.concurrency, rps(float64(r.o.rate)), r.o.duration)
	header := []string{"figure"}
	for _, p := range r.points {
		header = append(header, fmt.Sprintf("%d subscriptions", p.size))
	}
	row := func(name string, f func(p scalePoint) string) []string {
		out := []string{name}
		for _, p := range r.points {
			out = append(out, f(p))
		}
		return out
	}
	rows := [][]string{
		row("grown in", func(p scalePoint) string { return p.grew.Round(time.Second).String() }),
		row("first deliveries at saturation, req/s", func(p scalePoint) string { return rps(p.sat.throughput()) }),
		row("first deliveries, CPU µs/req (service / all)", func(p scalePoint) string {
			return us(p.sat.per(targetCPU)) + " / " + us(p.sat.per(allCPU))
		}),
		row("first deliveries at the fixed rate, p50 / p99 ms", func(p scalePoint) string {
			return ms(p.fixed.percentile(.5)) + " / " + ms(p.fixed.percentile(.99))
		}),
	}
	for i, l := range lookups {
		rows = append(rows, row(l.name+", p50 / p99 ms (in Postgres p50)", func(p scalePoint) string {
			return ms(pctl(p.lookup[i], .5)) + " / " + ms(pctl(p.lookup[i], .99)) + " (" + ms(pctl(p.lookupExec[i], .5)) + ")"
		}))
	}
	rows = append(rows,
		row("feed: a page of 500 from the start, p50 ms", func(p scalePoint) string { return ms(pctl(p.feedStart, .5)) }),
		row("feed: one new change at the end, p50 ms", func(p scalePoint) string { return ms(pctl(p.feedEnd, .5)) }),
		row("feed: every page from the start", func(p scalePoint) string {
			return fmt.Sprintf("%d in %s", p.drained, p.drain.Round(time.Millisecond))
		}),
	)
	for _, run := range []struct {
		name string
		of   func(p scalePoint) *trimRun
	}{
		{"retention", func(p scalePoint) *trimRun { return p.trim }},
		{"retention unpaced", func(p scalePoint) *trimRun { return p.unpaced }},
	} {
		trim := func(f func(t *trimRun) string) func(p scalePoint) string {
			return func(p scalePoint) string {
				if t := run.of(p); t != nil {
					return f(t)
				}
				return "-"
			}
		}
		rows = append(rows,
			row(run.name+": expired rows trimmed", trim(func(t *trimRun) string {
				return fmt.Sprintf("%d in %s (%d passes)", t.rows, t.took.Round(time.Second), t.passes-1)
			})),
			row(run.name+": WAL written, checkpoints (trim + 60 s)", trim(func(t *trimRun) string {
				return fmt.Sprintf("%.0f MB, %d", float64(t.wal)/1e6, t.checkpoints)
			})),
			row(run.name+", deliveries before the trim, p50 / p99 / max ms", trim(func(t *trimRun) string {
				return ms(t.before.percentile(.5)) + " / " + ms(t.before.percentile(.99)) + " / " + ms(t.before.percentile(1))
			})),
			row(run.name+", deliveries during the trim, p50 / p99 / max ms", trim(func(t *trimRun) string {
				return ms(t.during.percentile(.5)) + " / " + ms(t.during.percentile(.99)) + " / " + ms(t.during.percentile(1))
			})),
			row(run.name+", deliveries 60 s after it, p50 / p99 / max ms", trim(func(t *trimRun) string {
				return ms(t.after.percentile(.5)) + " / " + ms(t.after.percentile(.99)) + " / " + ms(t.after.percentile(1))
			})),
			row(run.name+", deliveries over 50 ms: before / during / after", trim(func(t *trimRun) string {
				return fmt.Sprintf("%d / %d / %d", over(t.before, 50*time.Millisecond), over(t.during, 50*time.Millisecond), over(t.after, 50*time.Millisecond))
			})),
		)
	}
	for _, t := range scaleTables {
		rows = append(rows, row("disk per row: "+t+", bytes", func(p scalePoint) string {
			if p.bytesPerRow[t] == 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f (%.0f rows)", p.bytesPerRow[t], p.rows[t])
		}))
	}
	table(w, header, rows)
}
