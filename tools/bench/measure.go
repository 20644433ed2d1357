package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// report is everything one run measured.
type report struct {
	o         options
	started   time.Time
	took      time.Duration
	goVersion string

	pgVersion, redisVersion       string
	fastSettings, durableSettings []string
	eventBytes                    int
	// [0] at saturation, [1] at the fixed rate.
	first, dup, rejected, durable [2]*phase
	chi, intake                   [2]*phase
	pgbench, pgbenchDurable       pgbenchResult
	redisBench                    redisBenchResult
	peakRSS, peakRSSDurable       int64 // KiB, VmHWM
	goBench                       string
}

// eventsFor is how many new events a saturation load of d (plus its
// warm-ups) may need: 6,000 a second, more than a 2-core machine manages.
func (h *harness) eventsFor(d time.Duration, slices int) int {
	return int((d.Seconds() + float64(slices)*h.o.warmup.Seconds()) * 6000)
}

// rateEvents is how many new events one target's fixed-rate runs need.
func (h *harness) rateEvents() int {
	return int((h.o.duration.Seconds()+float64(h.o.rounds)*h.o.warmup.Seconds())*float64(h.o.rate)) + h.o.concurrency
}

// measure runs, in order: saturation and then the fixed rate, each in
// interleaved rounds so that the machine's background load falls on every
// target alike (the service's first deliveries, duplicates and rejected
// deliveries; the chi and intake ceilings; pgbench on the upsert;
// redis-benchmark on the claim script); duplicates at -rss-concurrency,
// after which the service's peak RSS is read; the Go benchmarks; first
// deliveries and pgbench again on a durable Postgres.
func (h *harness) measure(ctx context.Context) (*report, error) {
	rep := &report{o: h.o, started: h.started}
	if err := h.startServers(ctx); err != nil {
		return nil, err
	}
	rep.goVersion, rep.eventBytes = h.goVersion, len(h.tmpl.body)
	var err error
	if rep.redisVersion, err = redisVersion(ctx, h.rdb); err != nil {
		return nil, err
	}
	db, err := createBenchDatabase(ctx, h.pgPort, "bench")
	if err != nil {
		return nil, err
	}
	if rep.pgVersion, rep.fastSettings, err = showSettings(ctx, db); err != nil {
		return nil, err
	}
	svc, err := h.startService(ctx, "service", "bench", h.pgPort)
	if err != nil {
		return nil, err
	}
	h.onClose(svc.stop)
	chi, err := h.startCeiling(ctx, "chi")
	if err != nil {
		return nil, err
	}
	intake, err := h.startCeiling(ctx, "intake")
	if err != nil {
		return nil, err
	}
	sha, err := h.rdb.ScriptLoad(ctx, claim.ClaimLua).Result()
	if err != nil {
		return nil, err
	}
	if want := redis.NewScript(claim.ClaimLua).Hash(); sha != want {
		return nil, fmt.Errorf("SCRIPT LOAD gave %s, go-redis hashes the claim script to %s", sha, want)
	}
	dupBody := h.tmpl.event("dup", 0)
	if err := h.deliverOnce(svc.target, dupBody); err != nil {
		return nil, err
	}
	h.logf("servers up")

	// The same request again and again, signed afresh before each stage:
	// signatures expire after the service's 300 s tolerance.
	for i, fixed := range []bool{false, true} {
		h.logf("%s: %d rounds of %s per target", []string{"saturation", "fixed rate"}[i], h.o.rounds, h.o.duration/time.Duration(h.o.rounds))
		n := h.eventsFor(h.o.duration, h.o.rounds)
		if fixed {
			if err := h.settlePostgres(ctx, "bench"); err != nil {
				return nil, err
			}
			n = h.rateEvents()
		}
		first := newFeed(h.tmpl.firstDeliveries(stripeSecret, "f"+strconv.Itoa(i), n), false)
		dup, bad, ceil := repeated(dupBody, stripeSecret), repeated(h.tmpl.event("bad", 0), wrongSecret), repeated(h.tmpl.event("ceiling", 0), stripeSecret)
		runs := []func(context.Context, time.Duration) error{
			h.slice(svc.target, "first", 200, first, fixed, &rep.first[i]),
			h.slice(svc.target, "duplicate", 200, dup, fixed, &rep.dup[i]),
			h.slice(svc.target, "rejected", 400, bad, fixed, &rep.rejected[i]),
			h.slice(chi, "chi", 200, ceil, fixed, &rep.chi[i]),
			h.slice(intake, "intake", 200, ceil, fixed, &rep.intake[i]),
		}
		if !fixed {
			runs = append(runs, h.pgbenchSlice("bench", &rep.pgbench), h.claimSlice(sha, &rep.redisBench))
		}
		if err := h.interleave(ctx, runs...); err != nil {
			return nil, err
		}
		checkOutcome(rep.first[i], "processed")
		checkOutcome(rep.dup[i], "duplicate")
		checkOutcome(rep.rejected[i], "rejected")
	}

	h.logf("%d duplicates in flight, for peak RSS", h.o.rssConc)
	saturate(ctx, svc.addr, repeated(dupBody, stripeSecret), h.o.rssConc, 3*time.Second)
	if rep.peakRSS, err = procStatusKiB(svc.pid, "VmHWM"); err != nil {
		return nil, err
	}
	if err := svc.stop(); err != nil {
		return nil, err
	}
	if h.o.benchtime != "" {
		h.logf("go test -bench")
		env := []string{dbtest.DatabaseURLEnv + "=" + h.pg.URL(), dbtest.RedisURLEnv + "=" + h.redis.URL()}
		if rep.goBench, err = runGoBenchmarks(ctx, h.o.goBin, h.root, env, h.o.benchtime); err != nil {
			return nil, err
		}
	}
	if h.o.durable {
		if err := h.durableRun(ctx, rep); err != nil {
			return nil, err
		}
	}
	rep.took = time.Since(h.started)
	return rep, nil
}

// durableRun restarts Postgres with fsync and synchronous_commit on, and
// measures first deliveries and the pgbench ceiling again, interleaved.
func (h *harness) durableRun(ctx context.Context, rep *report) error {
	h.logf("restarting postgres with durable settings")
	if err := h.pg.Stop(); err != nil {
		return err
	}
	pgc, err := launchDurablePostgres(h.pgDir, h.pgPort)
	if err != nil {
		return err
	}
	h.onClose(func() error { return pgc.stop(syscall.SIGINT, 30*time.Second) })
	const db = "bench_durable"
	url, err := createBenchDatabase(ctx, h.pgPort, db)
	if err != nil {
		return err
	}
	if _, rep.durableSettings, err = showSettings(ctx, url); err != nil {
		return err
	}
	svc, err := h.startService(ctx, "service-durable", db, h.pgPort)
	if err != nil {
		return err
	}
	h.onClose(svc.stop)
	first := newFeed(h.tmpl.firstDeliveries(stripeSecret, "ds", h.eventsFor(h.o.duration, h.o.rounds)), false)
	if err := h.interleave(ctx, h.slice(svc.target, "first", 200, first, false, &rep.durable[0]), h.pgbenchSlice(db, &rep.pgbenchDurable)); err != nil {
		return err
	}
	if err := h.settlePostgres(ctx, db); err != nil {
		return err
	}
	first = newFeed(h.tmpl.firstDeliveries(stripeSecret, "dr", h.rateEvents()), false)
	if err := h.interleave(ctx, h.slice(svc.target, "first", 200, first, true, &rep.durable[1])); err != nil {
		return err
	}
	checkOutcome(rep.durable[0], "processed")
	checkOutcome(rep.durable[1], "processed")
	if rep.peakRSSDurable, err = procStatusKiB(svc.pid, "VmHWM"); err != nil {
		return err
	}
	return svc.stop()
}

// settlePostgres vacuums and analyses the entitlements table and takes a
// checkpoint, so that the autovacuum and checkpoint the saturation runs
// trigger do not land in the fixed-rate run's tail latency.
func (h *harness) settlePostgres(ctx context.Context, db string) error {
	return adminExec(ctx, postgresURL(h.pgPort, db), "VACUUM (ANALYZE) entitlements", "CHECKPOINT")
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

// slice is one target's share of a round, added to dst.
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

// pgbenchSlice runs pgbench on the service's upsert (entitlements.ApplySQL)
// for one slice.
func (h *harness) pgbenchSlice(db string, dst *pgbenchResult) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		res, err := pgbench(ctx, h.pgBin, h.work, h.pgPort, db, entitlements.ApplySQL, h.o.concurrency, d)
		if err != nil {
			return err
		}
		dst.add(res)
		h.logf("pgbench %-13s upsert saturation %6.0f tps  latency %.2f ms  cpu %.0f µs/tx", db, res.tps, res.latencyMS, micros(res.cpuPerTx()))
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
		h.logf("redis-benchmark claim saturation %6.0f calls/s  cpu %.0f µs/call", res.rps, micros(res.cpu))
		return nil
	}
}

func redisVersion(ctx context.Context, rdb *redis.Client) (string, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}
