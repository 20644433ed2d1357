package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// report is everything one run measured.
type report struct {
	o       options
	started time.Time
	took    time.Duration
	machine machine

	goVersion, pgVersion, redisVersion string
	fastSettings, durableSettings      []string
	redisSettings                      []string
	eventBytes                         int
	svc, durable                       cases // durable: first deliveries only
	chi, verify                        [2]*phase
	pgbench, pgbenchDurable            pgbenchResult
	pgbenchStatements                  counters
	redisBench                         redisBenchResult
	scriptSHA                          string
	peakRSS, peakRSSDurable            int64 // KiB
	profile                            *perfProfile
	profileErr, goBench                string
	pool                               []poolRun
	sliceLength                        time.Duration
	redisClients, pgBackends           int // connections open after the saturation runs
	pgbenchRate, pgbenchRateDurable    *phase
}

// cases are the service's three kinds of delivery, each [saturation,
// fixed rate].
type cases struct {
	first, dup, rejected [2]*phase
}

type poolRun struct {
	settings string
	conns    int
	p        *phase
}

// machine describes where the run happened.
type machine struct {
	cpus  int
	model string
	mem   string
}

func describeMachine() machine {
	m := machine{cpus: runtime.NumCPU(), model: "unknown"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.model = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(line); len(f) >= 2 {
			if kib, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m.mem = fmt.Sprintf("%.1f GiB", float64(kib)/(1<<20))
			}
		}
	}
	return m
}

// eventsFor is how many new events a saturation load of d (plus its
// warm-ups) may need: 4,500 a second, more than this machine manages. A
// faster machine runs dry early, which the report says.
func (h *harness) eventsFor(d time.Duration, slices int) int {
	return int((d.Seconds() + float64(slices)*h.o.warmup.Seconds()) * 4500)
}

// measure runs everything, in this order:
//
//  1. saturation, interleaved in rounds so that every target sees the same
//     background load: service first deliveries, duplicates, rejected; the
//     chi and chi+verify ceilings; pgbench on the upsert; redis-benchmark
//     on the claim script;
//  2. the fixed rate, one run each;
//  3. a perf profile, when a target is missed;
//  4. the Go benchmarks;
//  5. first deliveries and pgbench again on a durable Postgres.
func (h *harness) measure(ctx context.Context) (*report, error) {
	rep := &report{o: h.o, started: h.started, machine: describeMachine(), sliceLength: h.o.duration / time.Duration(h.o.rounds)}
	if err := h.startServers(ctx); err != nil {
		return nil, err
	}
	rep.goVersion, rep.eventBytes = h.goVersion, len(h.tmpl.body)
	var err error
	if rep.redisVersion, rep.redisSettings, err = redisInfo(ctx, h.rdb); err != nil {
		return nil, err
	}
	db, err := createBenchDatabase(ctx, h.pgPort, "bench")
	if err != nil {
		return nil, err
	}
	if rep.pgVersion, rep.fastSettings, err = showSettings(ctx, db); err != nil {
		return nil, err
	}
	sql, err := upsertSQL(h.root)
	if err != nil {
		return nil, err
	}
	svc, err := h.startService(ctx, "service", "bench", h.pgPort, 0)
	if err != nil {
		return nil, err
	}
	h.onClose(svc.stop)
	chi, err := h.startCeiling(ctx, "chi")
	if err != nil {
		return nil, err
	}
	verify, err := h.startCeiling(ctx, "verify")
	if err != nil {
		return nil, err
	}
	h.logf("postgres, redis-server, service and ceilings up")

	// 1. Saturation.
	first := newFeed(h.tmpl.firstDeliveries(stripeSecret, "fs", h.eventsFor(h.o.duration, h.o.rounds)), false)
	dupBody := h.tmpl.event("fdup", 0)
	if err := h.deliverOnce(svc.target, dupBody); err != nil {
		return nil, err
	}
	// The same request again and again; signed afresh before each stage,
	// as signatures expire after the service's 300 s tolerance.
	dup, bad, ceilingReq := repeated(dupBody, stripeSecret), repeated(h.tmpl.event("fbad", 0), wrongSecret), repeated(h.tmpl.event("ceiling", 0), stripeSecret)
	sha, err := h.loadClaimScript(ctx)
	if err != nil {
		return nil, err
	}
	rep.scriptSHA = sha
	h.logf("saturation: %d rounds of %s per target", h.o.rounds, rep.sliceLength)
	err = h.interleave(ctx,
		h.slice(svc.target, "first", 200, first, false, &rep.svc.first[0]),
		h.slice(svc.target, "duplicate", 200, dup, false, &rep.svc.dup[0]),
		h.slice(svc.target, "rejected", 400, bad, false, &rep.svc.rejected[0]),
		h.slice(chi, "chi", 200, ceilingReq, false, &rep.chi[0]),
		h.slice(verify, "verify", 200, ceilingReq, false, &rep.verify[0]),
		h.pgbenchSlice("bench", sql, &rep.pgbench, &rep.pgbenchStatements),
		h.claimSlice(sha, &rep.redisBench),
	)
	if err != nil {
		return nil, err
	}

	if rep.redisClients, rep.pgBackends, err = h.connections(ctx, "bench"); err != nil {
		return nil, err
	}

	// 2. Fixed rate.
	if err := h.settlePostgres(ctx, "bench"); err != nil {
		return nil, err
	}
	dup, bad, ceilingReq = repeated(dupBody, stripeSecret), repeated(h.tmpl.event("fbad", 0), wrongSecret), repeated(h.tmpl.event("ceiling", 0), stripeSecret)
	firstRate := newFeed(h.tmpl.firstDeliveries(stripeSecret, "fr", h.rateEvents()), false)
	h.logf("fixed rate: %d rounds of %s per target", h.o.rounds, rep.sliceLength)
	err = h.interleave(ctx,
		h.slice(svc.target, "first", 200, firstRate, true, &rep.svc.first[1]),
		h.slice(svc.target, "duplicate", 200, dup, true, &rep.svc.dup[1]),
		h.slice(svc.target, "rejected", 400, bad, true, &rep.svc.rejected[1]),
		h.slice(chi, "chi", 200, ceilingReq, true, &rep.chi[1]),
		h.slice(verify, "verify", 200, ceilingReq, true, &rep.verify[1]),
		h.pgbenchRateSlice("bench", sql, &rep.pgbenchRate),
	)
	if err != nil {
		return nil, err
	}
	for _, c := range []struct {
		ph      [2]*phase
		outcome string
	}{{rep.svc.first, "processed"}, {rep.svc.dup, "duplicate"}, {rep.svc.rejected, "rejected"}} {
		checkOutcome(c.ph[0], c.outcome)
		checkOutcome(c.ph[1], c.outcome)
	}

	// 3. The pool sweep if asked for, and a profile if a target is missed.
	if h.o.poolSizes != "" {
		if err := h.poolSweep(ctx, rep, "fast", h.pgPort); err != nil {
			return nil, err
		}
	}
	if h.o.profile == "always" || (h.o.profile == "auto" && rep.anyMissed()) {
		h.logf("profiling first deliveries with perf")
		prof, err := h.profileFirst(ctx, svc.target)
		if err != nil {
			rep.profileErr = err.Error()
			h.logf("profile: %v", err)
		} else {
			rep.profile = &prof
		}
	}
	if rep.peakRSS, err = procStatusKiB(svc.pid, "VmHWM"); err != nil {
		return nil, err
	}
	if err := svc.stop(); err != nil {
		return nil, err
	}

	// 4. Go benchmarks.
	if h.o.benchtime != "" {
		h.logf("go test -bench: internal/stripehook, internal/claim, internal/entitlements")
		env := []string{dbtest.DatabaseURLEnv + "=" + h.pg.URL(), dbtest.RedisURLEnv + "=" + h.redis.URL()}
		if rep.goBench, err = runGoBenchmarks(ctx, h.o.goBin, h.root, env, h.o.benchtime); err != nil {
			return nil, err
		}
	}

	// 5. Durable Postgres.
	if h.o.durable {
		if err := h.durableRun(ctx, rep, sql); err != nil {
			return nil, err
		}
	}
	rep.took = time.Since(h.started)
	return rep, nil
}

// connections counts the clients connected to Redis (the service's go-redis
// pool and the harness's own client) and the backends serving database db
// (the service's pgx pool).
func (h *harness) connections(ctx context.Context, db string) (int, int, error) {
	info, err := h.rdb.Info(ctx, "clients").Result()
	if err != nil {
		return 0, 0, err
	}
	var clients int
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			clients, _ = strconv.Atoi(v)
		}
	}
	conn, err := pgx.Connect(ctx, postgresURL(h.pgPort, "postgres"))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.Background())
	var backends int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", db).Scan(&backends)
	return clients, backends, err
}

// settlePostgres vacuums and analyses the entitlements table and takes a
// checkpoint. The saturation runs have just inserted tens of thousands of
// rows; left alone, the autovacuum and checkpoint they trigger land in the
// fixed-rate run that follows and put their stalls in its tail latency,
// which would then measure the previous run rather than this one.
func (h *harness) settlePostgres(ctx context.Context, db string) error {
	start := time.Now()
	if err := adminExec(ctx, postgresURL(h.pgPort, db), "VACUUM (ANALYZE) entitlements", "CHECKPOINT"); err != nil {
		return err
	}
	h.logf("postgres settled: VACUUM (ANALYZE) entitlements, CHECKPOINT in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// deliverOnce delivers body once and wants it processed.
func (h *harness) deliverOnce(t target, body []byte) error {
	c := client{addr: t.addr}
	defer c.close()
	status, err := c.do(request(body, stripeSecret, time.Now()))
	if err != nil || status != 200 {
		return fmt.Errorf("first delivery of the duplicate: %d, %v", status, err)
	}
	return nil
}

// repeated is a feed of one request, body signed now with secret, sent
// over and over.
func repeated(body []byte, secret string) *feed {
	return newFeed([][]byte{request(body, secret, time.Now())}, true)
}

// interleave runs o.rounds rounds of every run, each for a slice of
// o.duration, so that a change in the machine's background load falls on
// every target alike instead of on whichever ran at the time.
func (h *harness) interleave(ctx context.Context, runs ...func(context.Context, time.Duration) error) error {
	slice := h.o.duration / time.Duration(h.o.rounds)
	for range h.o.rounds {
		for _, run := range runs {
			if err := run(ctx, slice); err != nil {
				return err
			}
		}
	}
	return nil
}

// slice is one target's share of a round: a run of the given load, added
// to dst.
func (h *harness) slice(t target, kind string, want int, f *feed, fixed bool, dst **phase) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		p, err := h.runPhase(ctx, t, kind, want, f, fixed, d)
		if err != nil {
			return err
		}
		*dst = (*dst).add(p)
		return nil
	}
}

// rateEvents is how many new events the fixed-rate runs of one target need,
// warm-ups included.
func (h *harness) rateEvents() int {
	return int((h.o.duration.Seconds()+float64(h.o.rounds)*h.o.warmup.Seconds())*float64(h.o.rate)) + h.o.concurrency
}

// pgbenchSlice runs pgbench on the service's upsert for one slice, and
// collects which statements it ran.
func (h *harness) pgbenchSlice(db, sql string, dst *pgbenchResult, stmts *counters) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		admin := postgresURL(h.pgPort, "postgres")
		before, err := pgStatements(ctx, admin, db)
		if err != nil {
			return err
		}
		res, err := runPgbench(ctx, h.pgBin, h.work, h.pgPort, db, sql, h.o.concurrency, d)
		if err != nil {
			return err
		}
		after, err := pgStatements(ctx, admin, db)
		if err != nil {
			return err
		}
		*stmts = stmts.plus(after.minus(before))
		dst.add(res)
		h.logf("%-16s %-9s %-10s %6.0f tps    latency %.2f ms  cpu %.0f µs/tx", "pgbench "+db, "upsert", "saturation",
			res.tps, res.latencyMS, micros(res.cpuPerTx()))
		return nil
	}
}

// loadClaimScript loads the claim script, read from the service's source,
// with SCRIPT LOAD, and checks that its SHA is the one go-redis sends.
func (h *harness) loadClaimScript(ctx context.Context) (string, error) {
	src, err := claimScriptSource(h.root)
	if err != nil {
		return "", err
	}
	sha, err := h.rdb.ScriptLoad(ctx, src).Result()
	if err != nil {
		return "", err
	}
	if want := redis.NewScript(src).Hash(); sha != want {
		return "", fmt.Errorf("SCRIPT LOAD gave %s, go-redis hashes the script to %s", sha, want)
	}
	return sha, nil
}

// pgbenchRateSlice runs the upsert with pgbench at the fixed rate for one
// slice: the latency the database alone gives at the rate the service is
// held to.
func (h *harness) pgbenchRateSlice(db, sql string, dst **phase) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		before, err := machineBusy()
		if err != nil {
			return err
		}
		ours, err := treeCPU(os.Getpid())
		if err != nil {
			return err
		}
		res, kept, err := runPgbenchRate(ctx, h.pgBin, h.work, h.pgPort, db, sql, h.o.concurrency, h.o.rate, h.o.warmup, d)
		if err != nil {
			return err
		}
		after, err := machineBusy()
		if err != nil {
			return err
		}
		oursAfter, err := treeCPU(os.Getpid())
		if err != nil {
			return err
		}
		// The warm-up's share of the CPU is left out, as it is for the
		// harness's own runs.
		p := &phase{target: "pgbench " + db, kind: "upsert", fixed: true, want: 200, load: res,
			busy: time.Duration(kept * float64(after-before)), ours: time.Duration(kept * float64(oursAfter-ours))}
		h.logf("%-16s %-9s %-10s %6.0f tps    p50 %6s  p99 %6s  p99.9 %6s ms", p.target, "upsert", strconv.Itoa(h.o.rate)+" tx/s",
			res.throughput(), ms(res.percentile(.5)), ms(res.percentile(.99)), ms(res.percentile(.999)))
		*dst = (*dst).add(p)
		return nil
	}
}

// claimSlice runs redis-benchmark on the claim script for about one slice.
func (h *harness) claimSlice(sha string, dst *redisBenchResult) func(context.Context, time.Duration) error {
	runs := 0
	return func(ctx context.Context, d time.Duration) error {
		res, err := runRedisBenchmark(ctx, h.redis.Addr(), sha, h.o.concurrency, int(d.Seconds()*12000))
		if err != nil {
			return err
		}
		n := float64(runs)
		dst.rps = (dst.rps*n + res.rps) / (n + 1)
		dst.cpu = time.Duration((float64(dst.cpu)*n + float64(res.cpu)) / (n + 1))
		dst.p50, dst.p99 = res.p50, res.p99 // the last run's
		runs++
		h.logf("%-16s %-9s %-10s %6.0f calls/s  p50 %s  p99 %s ms  cpu %.0f µs/call", "redis-benchmark", "claim", "saturation",
			res.rps, res.p50, res.p99, micros(res.cpu))
		return nil
	}
}

// profileFirst samples the whole machine with perf while first deliveries
// run at saturation against the real service binary.
func (h *harness) profileFirst(ctx context.Context, t target) (perfProfile, error) {
	d := 5 * time.Second
	f := newFeed(h.tmpl.firstDeliveries(stripeSecret, "prof", h.eventsFor(d+time.Second, 0)), false)
	wait, err := runPerf(ctx, h.work, d, t.pid)
	if err != nil {
		return perfProfile{}, err
	}
	saturate(ctx, t.addr, f, h.o.concurrency, d+500*time.Millisecond)
	return wait()
}

// durableRun restarts Postgres with fsync and synchronous_commit on, and
// measures first deliveries and the pgbench ceiling again, interleaved.
func (h *harness) durableRun(ctx context.Context, rep *report, sql string) error {
	h.logf("restarting postgres with durable settings")
	if err := h.pg.Stop(); err != nil {
		return err
	}
	pgc, err := launchDurablePostgres(h.pgDir, h.pgPort)
	if err != nil {
		return err
	}
	h.onClose(func() error { return pgc.stop(syscall.SIGINT, 30*time.Second) })
	db, err := createBenchDatabase(ctx, h.pgPort, "bench_durable")
	if err != nil {
		return err
	}
	if _, rep.durableSettings, err = showSettings(ctx, db); err != nil {
		return err
	}
	svc, err := h.startService(ctx, "service-durable", "bench_durable", h.pgPort, 0)
	if err != nil {
		return err
	}
	h.onClose(svc.stop)
	first := newFeed(h.tmpl.firstDeliveries(stripeSecret, "ds", h.eventsFor(h.o.duration, h.o.rounds)), false)
	var stmts counters
	err = h.interleave(ctx,
		h.slice(svc.target, "first", 200, first, false, &rep.durable.first[0]),
		h.pgbenchSlice("bench_durable", sql, &rep.pgbenchDurable, &stmts),
	)
	if err != nil {
		return err
	}
	if err := h.settlePostgres(ctx, "bench_durable"); err != nil {
		return err
	}
	firstRate := newFeed(h.tmpl.firstDeliveries(stripeSecret, "dr", h.rateEvents()), false)
	err = h.interleave(ctx,
		h.slice(svc.target, "first", 200, firstRate, true, &rep.durable.first[1]),
		h.pgbenchRateSlice("bench_durable", sql, &rep.pgbenchRateDurable),
	)
	if err != nil {
		return err
	}
	checkOutcome(rep.durable.first[0], "processed")
	checkOutcome(rep.durable.first[1], "processed")
	if h.o.poolSizes != "" {
		if err := h.poolSweep(ctx, rep, "durable", h.pgPort); err != nil {
			return err
		}
	}
	if rep.peakRSSDurable, err = procStatusKiB(svc.pid, "VmHWM"); err != nil {
		return err
	}
	return svc.stop()
}

// poolSweep runs first deliveries at saturation against one service per
// pgx pool size in o.poolSizes, each with a database of its own, all
// started at once and measured in interleaved rounds like the main runs.
func (h *harness) poolSweep(ctx context.Context, rep *report, settings string, pgPort int) error {
	var runs []func(context.Context, time.Duration) error
	var services []*service
	defer func() {
		for _, svc := range services {
			_ = svc.stop()
		}
	}()
	var sweep []poolRun
	for field := range strings.SplitSeq(h.o.poolSizes, ",") {
		conns, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || conns < 1 {
			return fmt.Errorf("-pool-sizes: bad size %q", field)
		}
		db := "bench_pool_" + settings + "_" + strconv.Itoa(conns)
		if _, err := createBenchDatabase(ctx, pgPort, db); err != nil {
			return err
		}
		svc, err := h.startService(ctx, "service-pool-"+strconv.Itoa(conns), db, pgPort, conns)
		if err != nil {
			return err
		}
		services = append(services, svc)
		sweep = append(sweep, poolRun{settings: settings, conns: conns})
	}
	for i, svc := range services {
		f := newFeed(h.tmpl.firstDeliveries(stripeSecret, "pool"+settings+strconv.Itoa(sweep[i].conns), h.eventsFor(h.o.duration, h.o.rounds)), false)
		runs = append(runs, h.slice(svc.target, "first", 200, f, false, &sweep[i].p))
	}
	if err := h.interleave(ctx, runs...); err != nil {
		return err
	}
	rep.pool = append(rep.pool, sweep...)
	return nil
}
