package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Targets from the issue.
const (
	dupShareGoal   = 0.75 // duplicates vs the chi+verify ceiling
	firstShareGoal = 0.70 // first deliveries vs the serial ceiling
	firstP99Goal   = 3 * time.Millisecond
	dupP99Goal     = 2 * time.Millisecond
	peakRSSGoalKiB = 32 << 10
)

type targetRow struct {
	name, goal, result string
	met                bool
}

// serialCeiling is the throughput of verify and upsert done one after the
// other on the same machine: 1/(1/verify + 1/upsert).
func serialCeiling(verify, upsert float64) float64 {
	if verify <= 0 || upsert <= 0 {
		return 0
	}
	return 1 / (1/verify + 1/upsert)
}

func (r *report) serial() float64 {
	return serialCeiling(r.verify[0].load.throughput(), r.pgbench.tps)
}

func (r *report) targets() []targetRow {
	var rows []targetRow
	first, dup := r.svc.first[0], r.svc.dup[0]
	verify := r.verify[0].load.throughput()
	share := dup.load.throughput() / verify
	rows = append(rows, targetRow{
		"done duplicates: throughput / chi+verify ceiling", pct(dupShareGoal, "≥ "),
		fmt.Sprintf("%s (%s / %s req/s)", pct(share, ""), rps(dup.load.throughput()), rps(verify)), share >= dupShareGoal,
	})
	serial := r.serial()
	share = first.load.throughput() / serial
	rows = append(rows, targetRow{
		"first deliveries: throughput / serial ceiling 1/(1/verify + 1/upsert)", pct(firstShareGoal, "≥ "),
		fmt.Sprintf("%s (%s / %s req/s)", pct(share, ""), rps(first.load.throughput()), rps(serial)), share >= firstShareGoal,
	})
	for _, c := range []struct {
		p    *phase
		name string
		want float64
	}{{first, "first delivery", 2}, {dup, "duplicate", 1}} {
		got := c.p.redisPer()["round trips"]
		rows = append(rows, targetRow{
			"Redis round trips per " + c.name, fmt.Sprintf("%.0f", c.want),
			fmt.Sprintf("%.2f (commands run: %s)", got, commands(c.p.redisPer())), got > c.want-0.01 && got < c.want+0.01,
		})
	}
	for _, c := range []struct {
		p       *phase
		name    string
		goal    time.Duration
		durable *phase
	}{
		{r.svc.first[1], "first deliveries", firstP99Goal, r.durable.first[1]},
		{r.svc.dup[1], "done duplicates", dupP99Goal, nil},
	} {
		got := c.p.load.percentile(.99)
		result := ms(got) + " ms"
		if c.durable != nil {
			result += fmt.Sprintf(" (durable Postgres, reported beside: %s ms)", ms(c.durable.load.percentile(.99)))
		}
		rows = append(rows, targetRow{
			fmt.Sprintf("p99 at %s req/s, %s", rps(float64(r.o.rate)), c.name), "< " + ms(c.goal) + " ms", result, got < c.goal,
		})
	}
	rss := mib(r.peakRSS)
	if r.peakRSSDurable > 0 {
		rss += fmt.Sprintf(" (durable run: %s)", mib(r.peakRSSDurable))
	}
	rows = append(rows, targetRow{"peak RSS of the service (VmHWM)", "< 32 MiB", rss, r.peakRSS < peakRSSGoalKiB})
	return rows
}

func (r *report) anyMissed() bool {
	for _, t := range r.targets() {
		if !t.met {
			return true
		}
	}
	return false
}

// sameStatement reports whether the statement pgbench ran has the queryid
// of the one the service ran (pg_stat_statements identifies a statement by
// its parse tree, so equal ids mean the same SQL).
func (r *report) sameStatement() string {
	keys := r.pgbenchStatements.sortedKeys()
	if len(keys) == 0 {
		return "pgbench's statement was not seen in pg_stat_statements"
	}
	if _, ok := r.svc.first[0].pg[keys[0]]; ok {
		return "yes, pgbench's statement has the pg_stat_statements queryid of the service's (`" + keys[0] + "`)"
	}
	return "**no**: pgbench ran `" + keys[0] + "`, which the service did not"
}

// write renders the report to o.out (or stdout for "-").
func (h *harness) write(r *report, stdout io.Writer) error {
	var b strings.Builder
	r.render(&b)
	if h.o.out == "-" {
		_, err := io.WriteString(stdout, b.String())
		return err
	}
	path := h.o.out
	if !filepath.IsAbs(path) {
		path = filepath.Join(h.root, path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	h.logf("wrote %s; the run took %s", path, r.took.Round(time.Second))
	return nil
}

type printer func(format string, args ...any)

func (r *report) render(w io.Writer) {
	p := printer(func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) })
	p("# Performance")
	p("")
	p("Written by `make bench` (`tools/bench`) on %s; the whole run took %s. Do not edit by hand: run it again.",
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	p("The load generator, the service, the ceiling servers, Postgres and Redis share the machine's %d cores, and runs", r.machine.cpus)
	p("vary by 10-50 %%: compare the ratios, which are taken within one run, rather than the absolute figures.")
	p("")
	p("```sh")
	p("make bench    # = go run ./tools/bench -out docs/PERFORMANCE.md")
	p("```")
	p("")
	p("It needs Go and the `postgres`, `pgbench`, `redis-server` and `redis-benchmark` binaries, nothing running, and")
	p("`perf` for the profile taken when a target is missed. `go run ./tools/bench -h` lists the knobs (`-duration`,")
	p("`-concurrency`, `-rate`, `-rounds`, `-pool-sizes 8,16,32`, `-profile always`, `-out -`).")
	p("")
	p("## Targets")
	p("")
	p("| target | goal | result | |")
	p("| --- | --- | --- | --- |")
	for _, t := range r.targets() {
		mark := "met"
		if !t.met {
			mark = "**missed**"
		}
		p("| %s | %s | %s | %s |", t.name, t.goal, t.result, mark)
	}
	p("")
	r.renderWhy(p)
	r.renderSaturation(p)
	r.renderFixed(p)
	r.renderPerDelivery(p)
	r.renderCeilings(p)
	r.renderDurable(p)
	r.renderPool(p)
	r.renderProfile(p)
	r.renderChanges(p)
	r.renderGoBench(p)
	r.renderSetup(p)
}

func (r *report) renderSaturation(p printer) {
	p("## Throughput at saturation")
	p("")
	p("%d requests in flight; each target ran %d slices of %s (after a %s warm-up each), interleaved round by round",
		r.o.concurrency, r.o.rounds, r.sliceLength, r.o.warmup)
	p("with the other targets, pgbench and redis-benchmark, so that the machine's background load falls on all of them")
	p("alike. CPU per request: the target process's user+system time, and that of every process the harness started")
	p("(target, Postgres, Redis, load generator, and the kernel's work on their behalf), divided by the requests.")
	p("\"Others\" is the share of the machine's capacity used meanwhile by processes the harness did not start, kernel")
	p("threads (the file system's among them, which durable commits keep busy) and interrupts: the noise in the figures.")
	p("")
	p("| case | req/s | / ceiling | ceiling | p50 ms | p99 ms | process CPU µs/req | all our CPU µs/req | others |")
	p("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
	serial := r.serial()
	verify := r.verify[0].load.throughput()
	for _, row := range []struct {
		name    string
		ph      *phase
		ceiling float64
		cname   string
	}{
		{"service: first deliveries", r.svc.first[0], serial, "serial"},
		{"service: done duplicates", r.svc.dup[0], verify, "chi + verify"},
		{"service: rejected signatures (400)", r.svc.rejected[0], verify, "chi + verify"},
		{"ceiling: chi, read body, 200", r.chi[0], 0, ""},
		{"ceiling: chi + verify", r.verify[0], 0, ""},
	} {
		ratio := ""
		if row.ceiling > 0 {
			ratio = pct(row.ph.load.throughput()/row.ceiling, "")
		}
		p("| %s | %s | %s | %s | %s | %s | %.0f | %.0f | %s |", row.name, rps(row.ph.load.throughput()), ratio, row.cname,
			ms(row.ph.load.percentile(.5)), ms(row.ph.load.percentile(.99)),
			micros(row.ph.perRequest(row.ph.cpu)), micros(row.ph.perRequest(row.ph.ours)), pct(row.ph.others(r.machine.cpus), ""))
	}
	p("| ceiling: pgbench, the service's upsert | %s | | | | | | %.0f | |", rps(r.pgbench.tps), micros(r.pgbench.cpuPerTx()))
	p("| ceiling: serial, 1/(1/verify + 1/upsert) | %s | | | | | | | |", rps(serial))
	p("| redis-benchmark, the claim script | %s | | | %s | %s | | %.0f | |", rps(r.redisBench.rps), r.redisBench.p50, r.redisBench.p99, micros(r.redisBench.cpu))
	p("")
	r.renderNotes(p)
	r.renderCostModel(p)
}

// renderCostModel accounts for a delivery's machine CPU with the ceilings'
// own: what the service adds on top of what it cannot avoid.
func (r *report) renderCostModel(p printer) {
	cost := func(ph *phase) float64 { return micros(ph.perRequest(ph.ours)) }
	verify, chi := cost(r.verify[0]), cost(r.chi[0])
	upsert, claim := micros(r.pgbench.cpuPerTx()), micros(r.redisBench.cpu)
	first, dup, rej := cost(r.svc.first[0]), cost(r.svc.dup[0]), cost(r.svc.rejected[0])
	p("### Where a delivery's CPU goes")
	p("")
	p("CPU per request at saturation of every process the harness started, set against the ceilings' own. pgbench's and")
	p("redis-benchmark's figures include their client's work, as the service's include pgx's and go-redis's.")
	p("")
	p("| | µs | |")
	p("| --- | ---: | --- |")
	p("| chi ceiling: HTTP request and answer over loopback, generator included | %.0f | |", chi)
	p("| chi + verify ceiling | %.0f | HMAC-SHA256: %+.0f |", verify, verify-chi)
	p("| rejected signature | %.0f | %+.0f over verify: metrics, the warning log line |", rej, rej-verify)
	p("| done duplicate | %.0f | %+.0f over verify, of which one claim round trip costs %.0f (redis-benchmark) |", dup, dup-verify, claim)
	p("| first delivery | %.0f | %+.0f over verify, of which the upsert costs %.0f (pgbench) and two Redis round trips about %.0f |",
		first, first-verify, upsert, 2*claim)
	p("")
	dupCeiling := serialCeiling(r.verify[0].load.throughput(), r.redisBench.rps)
	p("A duplicate cannot be answered without its one claim round trip, so the most it can reach here is about")
	p("1/(1/verify + 1/claim) = %s req/s (%s of the chi+verify ceiling); the service reached %s of that.",
		rps(dupCeiling), pct(dupCeiling/r.verify[0].load.throughput(), ""), pct(r.svc.dup[0].load.throughput()/dupCeiling, ""))
	firstCeiling := 1 / (1/r.verify[0].load.throughput() + 1/r.pgbench.tps + 2/r.redisBench.rps)
	p("Likewise a first delivery cannot avoid its two round trips: 1/(1/verify + 1/upsert + 2/claim) = %s req/s; the", rps(firstCeiling))
	p("service reached %s of that.", pct(r.svc.first[0].load.throughput()/firstCeiling, ""))
	p("")
}

func (r *report) renderNotes(p printer) {
	var notes []string
	for _, ph := range r.allPhases() {
		for _, n := range ph.notes {
			notes = append(notes, fmt.Sprintf("- %s, %s: %s", ph.target, ph.kind, n))
		}
	}
	if len(notes) > 0 {
		p("Anomalies in this run:")
		p("")
		for _, n := range notes {
			p("%s", n)
		}
		p("")
	}
}

func (r *report) allPhases() []*phase {
	var out []*phase
	for _, ph := range [][2]*phase{r.svc.first, r.svc.dup, r.svc.rejected, r.chi, r.verify, r.durable.first} {
		for _, p := range ph {
			if p != nil {
				out = append(out, p)
			}
		}
	}
	for _, pr := range r.pool {
		out = append(out, pr.p)
	}
	return out
}

func (r *report) renderFixed(p printer) {
	p("## Latency at a fixed %s requests a second", rps(float64(r.o.rate)))
	p("")
	p("Each target ran %d slices of %s (after a %s warm-up each), interleaved round by round like the saturation runs.",
		r.o.rounds, r.sliceLength, r.o.warmup)
	p("Requests are released on a fixed schedule over up to %d connections; latency runs from a request's release to", r.o.concurrency)
	p("the end of its answer, so one that waits for a free connection counts the wait")
	p("(no coordinated omission). pgbench (`-R %d -l`, %d clients) measures each transaction from its scheduled start.", r.o.rate, r.o.concurrency)
	p("")
	p("| case | req/s | p50 ms | p99 ms | p99.9 ms | max ms | process CPU µs/req | all our CPU µs/req | others |")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, row := range []struct {
		name string
		ph   *phase
	}{
		{"service: first deliveries", r.svc.first[1]},
		{"service: first deliveries, durable Postgres", r.durable.first[1]},
		{"service: done duplicates", r.svc.dup[1]},
		{"service: rejected signatures", r.svc.rejected[1]},
		{"ceiling: chi", r.chi[1]},
		{"ceiling: chi + verify", r.verify[1]},
		{"ceiling: pgbench, the upsert alone (-R, fast Postgres)", r.pgbenchRate},
		{"ceiling: pgbench, the upsert alone (-R, durable Postgres)", r.pgbenchRateDurable},
	} {
		if row.ph == nil {
			continue
		}
		l := row.ph.load
		process := "–"
		if row.ph.cpu > 0 {
			process = fmt.Sprintf("%.0f", micros(row.ph.perRequest(row.ph.cpu)))
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %.0f | %s |", row.name, rps(l.throughput()), ms(l.percentile(.5)), ms(l.percentile(.99)),
			ms(l.percentile(.999)), ms(l.percentile(1)), process, micros(row.ph.perRequest(row.ph.ours)),
			pct(row.ph.others(r.machine.cpus), ""))
	}
	p("")
}

func (r *report) renderPerDelivery(p printer) {
	p("## Cost per delivery (saturation runs)")
	p("")
	p("Redis round trips: `INFO stats` total_writes_processed, one reply write per unpipelined command. Redis commands:")
	p("`INFO commandstats`, which also counts the commands the claim script runs inside Redis. Postgres statements:")
	p("`pg_stat_statements` calls in the service's database (preloaded on the throwaway cluster). Allocations and GC")
	p("cycles: the service's `go_memstats_alloc_bytes_total`, `go_memstats_mallocs_total` and")
	p("`go_gc_duration_seconds_count` from `/metrics`, read before and after each slice.")
	p("")
	p("| case | Redis round trips | Redis commands | Postgres statements | bytes allocated | objects allocated | GCs per 1,000 |")
	p("| --- | ---: | --- | --- | ---: | ---: | ---: |")
	for _, row := range []struct {
		name string
		ph   *phase
	}{
		{"first delivery", r.svc.first[0]},
		{"first delivery, durable Postgres", r.durable.first[0]},
		{"done duplicate", r.svc.dup[0]},
		{"rejected signature", r.svc.rejected[0]},
	} {
		ph := row.ph
		if ph == nil {
			continue
		}
		n := float64(max(ph.load.requests, 1))
		p("| %s | %.2f | %s | %s | %.0f | %.1f | %.2f |", row.name, ph.redisPer()["round trips"], commands(ph.redisPer()), statements(ph.pgPer()),
			ph.metrics["go_memstats_alloc_bytes_total"]/n, ph.metrics["go_memstats_mallocs_total"]/n,
			1000*ph.metrics["go_gc_duration_seconds_count"]/n)
	}
	p("")
	p("Peak RSS of the service (VmHWM over the whole fast run): %s; over the durable run: %s.", mib(r.peakRSS), mib(r.peakRSSDurable))
	p("")
	p("Pools after the saturation runs: %d clients connected to Redis (the service's go-redis pool, PoolSize 64, plus", r.redisClients)
	p("the harness's one), %d Postgres backends on the service's database (its pgx pool, DATABASE_MAX_CONNS=16). The", r.pgBackends)
	p("go-redis pool never needs more connections than deliveries in flight. How many pgx connections pay off depends on")
	p("what Postgres can commit in parallel, not on the deliveries in flight: `make bench BENCH_FLAGS=-pool-sizes=4,8,16,32,64`")
	p("measures each size, fast and durable, in interleaved rounds.")
	p("")
}

func (r *report) renderCeilings(p printer) {
	p("## The ceilings")
	p("")
	p("- **chi**: a bare chi router in a process of its own (this binary, `bench ceiling -mode chi`), with the service's")
	p("  server timeouts, reading the body as the Stripe handler does (`claim.ReadPooledBody`) and answering 200 with the service's body.")
	p("- **chi + verify**: the same plus `webhook.ValidatePayloadWithTolerance`, called as `internal/stripehook` calls it.")
	p("- **upsert**: pgbench running the service's upsert, read from `const applySQL` in `internal/entitlements` (the")
	p("  harness parses the Go file: one source of truth, nothing exported), `-M prepared`, %d clients, 2 threads, a", r.o.concurrency)
	p("  random subscription and event id per transaction (each an insert, as in a first delivery), the fixture's other")
	p("  values. Same statement as the service's: %s.", r.sameStatement())
	p("  Fast Postgres: %s tps, average latency %.2f ms, %d failed. Durable Postgres: %s tps, average latency %.2f ms.",
		rps(r.pgbench.tps), r.pgbench.latencyMS, r.pgbench.failed, rps(r.pgbenchDurable.tps), r.pgbenchDurable.latencyMS)
	p("- **serial**: 1/(1/verify + 1/upsert), the throughput of a delivery that verifies and then upserts with nothing")
	p("  else to do.")
	p("- **claim**: redis-benchmark, `EVALSHA` of the claim script read from `internal/claim/store.go` (`SCRIPT LOAD`ed,")
	p("  SHA `%s`, the hash go-redis computes for the service), a new key per call", r.scriptSHA)
	p("  (`webhook:stripe:bench___rand_int__`, -r 100000000), %d clients: %s calls/s, p50 %s ms, p99 %s ms (the",
		r.o.concurrency, rps(r.redisBench.rps), r.redisBench.p50, r.redisBench.p99)
	p("  last slice's). Redis's own work per call is small; what a delivery pays for each call is the round trip.")
	p("")
}

func (r *report) renderDurable(p printer) {
	ds, dr := r.durable.first[0], r.durable.first[1]
	if ds == nil || dr == nil {
		return
	}
	fs, fr := r.svc.first[0], r.svc.first[1]
	p("## First deliveries on a durable Postgres")
	p("")
	p("The same cluster restarted with %s: every commit waits for", strings.Join(r.durableSettings[:3], ", "))
	p("its WAL flush (commits in flight together share one). A fresh database and a fresh service process;")
	p("saturation interleaved with pgbench as above.")
	p("")
	p("| | fast Postgres | durable Postgres |")
	p("| --- | ---: | ---: |")
	p("| first deliveries, req/s at saturation | %s | %s |", rps(fs.load.throughput()), rps(ds.load.throughput()))
	p("| pgbench upsert, tps | %s | %s |", rps(r.pgbench.tps), rps(r.pgbenchDurable.tps))
	dser := serialCeiling(r.verify[0].load.throughput(), r.pgbenchDurable.tps)
	p("| serial ceiling (verify from the fast run) | %s | %s |", rps(r.serial()), rps(dser))
	p("| first deliveries / serial ceiling | %s | %s |", pct(fs.load.throughput()/r.serial(), ""), pct(ds.load.throughput()/dser, ""))
	p("| p50 / p99 / p99.9 ms at %s req/s | %s / %s / %s | %s / %s / %s |", rps(float64(r.o.rate)),
		ms(fr.load.percentile(.5)), ms(fr.load.percentile(.99)), ms(fr.load.percentile(.999)),
		ms(dr.load.percentile(.5)), ms(dr.load.percentile(.99)), ms(dr.load.percentile(.999)))
	p("| all our CPU µs per delivery at saturation | %.0f | %.0f |", micros(fs.perRequest(fs.ours)), micros(ds.perRequest(ds.ours)))
	p("")
}

func (r *report) renderPool(p printer) {
	if len(r.pool) == 0 {
		return
	}
	p("## pgx pool size (DATABASE_MAX_CONNS): first deliveries at saturation")
	p("")
	p("One service process and database per size, all running at once; %d interleaved slices of %s each.", r.o.rounds, r.sliceLength)
	p("")
	p("| Postgres | DATABASE_MAX_CONNS | req/s | p50 ms | p99 ms | all our CPU µs/req | others |")
	p("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, pr := range r.pool {
		l := pr.p.load
		p("| %s | %d | %s | %s | %s | %.0f | %s |", pr.settings, pr.conns, rps(l.throughput()), ms(l.percentile(.5)), ms(l.percentile(.99)),
			micros(pr.p.perRequest(pr.p.ours)), pct(pr.p.others(r.machine.cpus), ""))
	}
	p("")
}

func (r *report) renderProfile(p printer) {
	if r.profile == nil && r.profileErr == "" {
		return
	}
	p("## CPU profile of first deliveries")
	p("")
	if r.profile == nil {
		p("The profile failed: %s", r.profileErr)
		p("")
		return
	}
	prof := r.profile
	p("`perf record -a -F 499` over 5 s of first deliveries at saturation against the real service binary, after the")
	p("measured runs. The service has no pprof endpoint, and a flag to add one would be a test branch in production")
	p("code; perf needs neither, and it also sees the kernel and the other processes, which here do most of the work.")
	p("")
	p("Every core's samples by process (`swapper` is idle time, `bench` the load generator; names not started by the")
	p("harness belong to whoever else uses the machine):")
	p("")
	renderShares(p, prof.byProcess)
	p("The service's own samples (its process, all threads), of which %.0f %% in the kernel, by Go package, as shares of", 100*prof.kernelShare)
	p("the service's samples:")
	p("")
	renderShares(p, prof.byPackage)
	p("and by symbol (Go code only):")
	p("")
	renderShares(p, prof.bySymbol)
}

func renderShares(p printer, shares []share) {
	p("```")
	for _, s := range shares {
		p("%6.1f %%  %s", s.pct, s.name)
	}
	p("```")
	p("")
}

func (r *report) renderGoBench(p printer) {
	if r.goBench == "" {
		return
	}
	p("## Go benchmarks")
	p("")
	p("`go test -run '^$' -bench . -benchmem -benchtime %s ./internal/stripehook ./internal/claim ./internal/entitlements`,", r.o.benchtime)
	p("against the fast throwaway servers, in the same run:")
	p("")
	p("```")
	p("%s", r.goBench)
	p("```")
	p("")
}

func (r *report) renderSetup(p printer) {
	p("## Machine and settings")
	p("")
	p("- Machine: %d CPUs (nproc), %s, %s RAM. %s, Postgres %s, Redis %s.", r.machine.cpus, r.machine.model, r.machine.mem,
		strings.Replace(r.goVersion, "go", "Go ", 1), r.pgVersion, r.redisVersion)
	p("- Service: `go build ./cmd/munchable-webhooks`, run as a child process with DATABASE_URL, REDIS_URL, the three")
	p("  secrets, SUPPORT_INBOUND_ADDRESSES, LISTEN_ADDR and LOG_LEVEL=warn, everything else at its default")
	p("  (DATABASE_MAX_CONNS=16, REDIS_TIMEOUT=250ms, go-redis pool 64). At warn a processed or duplicate delivery")
	p("  logs nothing, so the figures leave out the one info line per delivery that production writes; a rejected")
	p("  delivery still logs its warning.")
	if r.o.serviceEnv != "" {
		p("- **Extra service environment for this run: %s.**", r.o.serviceEnv)
	}
	p("- Events: testdata/events/customer.subscription.updated.json compacted (%d bytes), with a new event id and", r.eventBytes)
	p("  subscription id for every first delivery, signed with stripe-go's `webhook.GenerateTestSignedPayload` shortly")
	p("  before use. A duplicate is one event delivered and confirmed, then sent again and again; a rejected delivery is")
	p("  an event signed with another secret.")
	p("- Load: the harness's own HTTP/1.1 keep-alive client, one connection per worker and pre-rendered requests:")
	p("  cheaper per request than net/http's client, so more of the two cores go to what is measured. Counters are")
	p("  read between runs, never during one.")
	p("- Fast Postgres (`dbtest.LaunchPostgres`, pg_stat_statements preloaded by one restart): %s.", strings.Join(r.fastSettings, ", "))
	if len(r.durableSettings) > 0 {
		p("- Durable Postgres (same data directory, restarted by the harness): %s.", strings.Join(r.durableSettings, ", "))
	}
	p("- Redis (`dbtest.LaunchRedis`): %s.", strings.Join(r.redisSettings, ", "))
	p("")
}

// goBenchmark is one result line of the Go benchmarks.
type goBenchmark struct {
	ns, bytes, allocs float64
}

// goBenchmarks parses "BenchmarkName-2  N  123 ns/op ... 456 B/op  7 allocs/op".
func (r *report) goBenchmarks() map[string]goBenchmark {
	out := map[string]goBenchmark{}
	for line := range strings.SplitSeq(r.goBench, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(f[0], "Benchmark"), "-")
		var b goBenchmark
		for i := 1; i+1 < len(f); i++ {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				b.ns = v
			case "B/op":
				b.bytes = v
			case "allocs/op":
				b.allocs = v
			}
		}
		out[name] = b
	}
	return out
}

// renderWhy says, with this run's figures, why each missed target is
// missed.
func (r *report) renderWhy(p printer) {
	var missed []string
	for _, t := range r.targets() {
		if !t.met {
			missed = append(missed, t.name)
		}
	}
	if len(missed) == 0 {
		return
	}
	us := func(ph *phase) float64 { return micros(ph.perRequest(ph.ours)) }
	proc := func(ph *phase) float64 { return micros(ph.perRequest(ph.cpu)) }
	verify, claim, upsert := us(r.verify[0]), micros(r.redisBench.cpu), micros(r.pgbench.cpuPerTx())
	gb := r.goBenchmarks()
	p("## Why targets are missed")
	p("")
	p("Every request costs CPU on the same two cores, so throughput ratios are ratios of CPU per request. The")
	p("figures below are this run's (section \"Where a delivery's CPU goes\" has them side by side).")
	p("")
	dupShare := r.svc.dup[0].load.throughput() / r.verify[0].load.throughput()
	if dupShare < dupShareGoal {
		dupCeiling := serialCeiling(r.verify[0].load.throughput(), r.redisBench.rps)
		p("- **Duplicates (%s of chi+verify, goal %s).** A duplicate is verify plus one claim round trip. That round trip",
			pct(dupShare, ""), pct(dupShareGoal, ""))
		p("  alone costs %.0f µs of CPU here (redis-benchmark: client, Redis and the loopback TCP in between), against %.0f µs", claim, verify)
		p("  for a whole verify-ceiling request, so a service that added nothing else would reach 1/(1/verify + 1/claim) =")
		p("  %s of the ceiling: 75 %% is out of reach on this machine with any design that asks Redis, which the contract", pct(dupCeiling/r.verify[0].load.throughput(), ""))
		p("  requires (only Redis knows whether another replica confirmed the event). The service reached %s of that bound.", pct(r.svc.dup[0].load.throughput()/dupCeiling, ""))
		p("  Its own process spends %.0f µs per duplicate against the ceiling's %.0f: decoding the event (BenchmarkDecode,",
			proc(r.svc.dup[0]), proc(r.verify[0]))
		p("  %.0f µs), the go-redis call with its syscalls and goroutine hand-offs, the fingerprint (%.0f µs) and the Go", gb["Decode"].ns/1e3, gb["Fingerprint"].ns/1e3)
		p("  scheduler waking for the reply; see the profile below for the same split on first deliveries.")
	}
	firstShare := r.svc.first[0].load.throughput() / r.serial()
	if firstShare < firstShareGoal {
		p("- **First deliveries (%s of the serial ceiling, goal %s).** The serial ceiling counts verify (%.0f µs) and the",
			pct(firstShare, ""), pct(firstShareGoal, ""), verify)
		p("  upsert (%.0f µs, pgbench) but not the two claim round trips a first delivery must make (%.0f µs) nor the", upsert, 2*claim)
		p("  service's own client work: pgx and go-redis in Go, decoding, fingerprinting, and a goroutine parked and woken")
		p("  for each of its four round trips (HTTP, claim, upsert, confirm). A first delivery cost %.0f µs of CPU in all;", us(r.svc.first[0]))
		p("  the service process's share was %.0f µs, of which the profile below puts %.0f %% in the kernel and most of the", proc(r.svc.first[0]), r.kernelShare())
		p("  rest in the Go runtime (scheduling, allocation, GC) and encoding/json.")
	}
	if got := r.svc.first[1].load.percentile(.99); got >= firstP99Goal {
		p("- **p99 of first deliveries at %s req/s (%s ms, goal < %s ms).** A first delivery waits on four round trips in",
			rps(float64(r.o.rate)), ms(got), ms(firstP99Goal))
		p("  turn (HTTP, the claim in Redis, the upsert in Postgres, the confirm in Redis), each served by another process")
		p("  that must get one of the two cores, and its tail is the sum of theirs. The bare chi ceiling's p99 at this rate")
		p("  was %s ms.", ms(r.chi[1].load.percentile(.99)))
		if pr := r.pgbenchRate; pr != nil {
			verdict := "which is within the goal by itself"
			if pr.load.percentile(.99) >= firstP99Goal {
				verdict = "so the database alone misses the goal"
			}
			p("  The upsert alone, pgbench at the same rate, had p50 %s ms and p99 %s ms (p99.9 %s ms), %s.",
				ms(pr.load.percentile(.5)), ms(pr.load.percentile(.99)), ms(pr.load.percentile(.999)), verdict)
		}
		p("  %s of the machine went to other processes during the service's slices. Tuning the Go GC does not move this",
			pct(r.svc.first[1].others(r.machine.cpus), ""))
		p("  tail (see the notes on the changes below).")
	}
	if got := r.svc.dup[1].load.percentile(.99); got >= dupP99Goal {
		p("- **p99 of duplicates at %s req/s (%s ms, goal < %s ms).** A duplicate's answer needs three processes to run in",
			rps(float64(r.o.rate)), ms(got), ms(dupP99Goal))
		p("  turn on two cores (load generator, service, Redis, then the service again); the ceilings, with one hop fewer,")
		p("  had p99s of %s ms (chi) and %s ms (chi + verify) at the same rate. At this rate the service process spent %.0f µs",
			ms(r.chi[1].load.percentile(.99)), ms(r.verify[1].load.percentile(.99)), micros(r.svc.dup[1].perRequest(r.svc.dup[1].cpu)))
		p("  of CPU per duplicate against %.0f µs at saturation: most of a request's cost at moderate load is waking", micros(r.svc.dup[0].perRequest(r.svc.dup[0].cpu)))
		p("  threads up, and each wake-up is a chance to wait for a core (%s of the machine went to other processes",
			pct(r.svc.dup[1].others(r.machine.cpus), ""))
		p("  during the service's slices, %s during chi's).", pct(r.chi[1].others(r.machine.cpus), ""))
	}
	if r.peakRSS >= peakRSSGoalKiB {
		p("- **Peak RSS (%s).** VmHWM includes the Go runtime, the binary's mapped text and every pool's buffers.", mib(r.peakRSS))
	}
	p("")
}

func (r *report) kernelShare() float64 {
	if r.profile == nil {
		return 0
	}
	return 100 * r.profile.kernelShare
}

// renderChanges records the performance changes made and rejected, with
// this run's figures.
func (r *report) renderChanges(p printer) {
	gb := r.goBenchmarks()
	if len(gb) == 0 {
		return
	}
	p("## Changes made, and not made, on these measurements")
	p("")
	rb, pb := gb["ReadBody"], gb["ReadPooledBody"]
	p("- **Made: the Stripe handler reads its body into a pooled buffer** (`claim.ReadPooledBody`, released once the")
	p("  delivery is answered). `claim.ReadBody` allocated a fresh buffer of the body's size plus 512 bytes for every")
	p("  delivery: BenchmarkReadBody %.0f ns and %.0f B per 3 KiB body, BenchmarkReadPooledBody %.0f ns and %.0f B.", rb.ns, rb.bytes, pb.ns, pb.bytes)
	p("  In the service it was a third of all a delivery allocated: this harness measured 13,151, 10,861 and 8,699 bytes")
	p("  per first delivery, duplicate and rejected delivery before the change, and %.0f, %.0f and %.0f in this run; the GC",
		r.svc.first[0].metrics["go_memstats_alloc_bytes_total"]/float64(max(r.svc.first[0].load.requests, 1)),
		r.svc.dup[0].metrics["go_memstats_alloc_bytes_total"]/float64(max(r.svc.dup[0].load.requests, 1)),
		r.svc.rejected[0].metrics["go_memstats_alloc_bytes_total"]/float64(max(r.svc.rejected[0].load.requests, 1)))
	p("  cycles fall with it (%.2f per 1,000 first deliveries in this run, 2.50 before).",
		1000*r.svc.first[0].metrics["go_gc_duration_seconds_count"]/float64(max(r.svc.first[0].load.requests, 1)))
	d, v := gb["Decode"], gb["Valid"]
	p("- **Not made: a fast path that claims before decoding.** A duplicate needs only the event id before the claim")
	p("  answers, but an unparseable event must be refused before any claim, so such a path must still run json.Valid")
	p("  first: BenchmarkValid %.0f µs against BenchmarkDecode %.0f µs. It would save a duplicate at most %.0f µs, and cost",
		v.ns/1e3, d.ns/1e3, (d.ns-v.ns)/1e3)
	p("  every first delivery %.0f µs more (it still needs the typed decode once the claim is taken; encoding/json", v.ns/1e3)
	p("  validates again inside Unmarshal). A structurally incomplete subscription event (valid JSON, no customer)")
	p("  would also take a claim before being refused. The event is decoded exactly once, after verification.")
	p("- **Not made, measured with this harness while deciding (not re-measured by each run):**")
	p("  - *GC tuning* (`-service-env GOGC=200`, `-service-env GOGC=off,GOMEMLIMIT=24MiB`): first-delivery p99 at")
	p("    1,000 req/s 7.9 and 8.5 ms against 6.4 ms with the defaults in the same session, peak RSS 36.6 and 33.5 MiB")
	p("    against 30.5: fewer collections do not shorten the tail, and they cost the RSS target.")
	p("  - *pgx pool size* (`-pool-sizes 4,8,16,32,64`, 3 interleaved rounds): durable Postgres 857, 1,506, 1,688,")
	p("    1,635 and 1,291 first deliveries/s; fast Postgres 3,083, 2,801, 2,374, 2,456 and 2,401. With commits that")
	p("    wait for the disk, 16 is the best of these, so DATABASE_MAX_CONNS keeps its default; without (fast")
	p("    settings), fewer backends win because Postgres shares the two cores with everything else. The size to")
	p("    choose follows what the database can commit in parallel, not the number of deliveries in flight.")
	p("- **Already right, checked here:** one Redis round trip to claim and one to confirm, one for a duplicate")
	p("  (the commandstats above); one Postgres statement per first delivery, none for a duplicate; no log line at")
	p("  all below the configured level.")
	p("")
}

// commands renders Redis command counts per delivery, leaving out the
// round trips.
func commands(c counters) string {
	var parts []string
	for _, k := range c.sortedKeys() {
		if k != "round trips" && c[k] >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, c[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func statements(c counters) string {
	var parts []string
	var total float64
	for _, k := range c.sortedKeys() {
		total += c[k]
		if c[k] >= 0.005 {
			parts = append(parts, fmt.Sprintf("%.2f `%s`", c[k], k))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return fmt.Sprintf("%.2f: %s", total, strings.Join(parts, "; "))
}

func pct(x float64, prefix string) string { return fmt.Sprintf("%s%.0f %%", prefix, 100*x) }

func rps(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	if len(s) > 3 {
		s = s[:len(s)-3] + "," + s[len(s)-3:]
	}
	return s
}

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }
