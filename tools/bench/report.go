package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The performance targets, explained in docs/PERFORMANCE.md.
const (
	dupShareGoal   = 0.75 // duplicates vs the intake ceiling
	firstShareGoal = 0.70 // first deliveries vs the serial ceiling
	firstP99Goal   = 3 * time.Millisecond
	dupP99Goal     = 2 * time.Millisecond
	peakRSSGoalKiB = 32 << 10
)

// write renders the tables to o.out (or stdout for "-").
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
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	h.logf("wrote %s; the run took %s", path, r.took.Round(time.Second))
	return nil
}

// table writes a Markdown table; a header cell starting with ">" is a
// right-aligned column.
func table(w io.Writer, header []string, rows [][]string) {
	var align []string
	for i, c := range header {
		if strings.HasPrefix(c, ">") {
			header[i], c = c[1:], "---:"
		} else {
			c = "---"
		}
		align = append(align, c)
	}
	fmt.Fprintf(w, "| %s |\n| %s |\n", strings.Join(header, " | "), strings.Join(align, " | "))
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
}

// serial is the throughput of the intake and the upsert done one after the
// other on the same machine: 1/(1/intake + 1/upsert).
func serial(intake, upsert float64) float64 {
	if intake <= 0 || upsert <= 0 {
		return 0
	}
	return 1 / (1/intake + 1/upsert)
}

func (r *report) render(w io.Writer) {
	fmt.Fprintf(w, "# Latest bench run\n\nWritten by `make bench` (tools/bench) on %s in %s; do not edit: run it again. "+
		"docs/PERFORMANCE.md says what each figure measures and how to read it.\n\n",
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	fmt.Fprintf(w, "%d CPUs; Go %s, Postgres %s, Redis %s; %d in flight at saturation, %d req/s fixed rate, "+
		"%d interleaved rounds of %s per target, %s warm-up each; event %d bytes.\n\n",
		runtime.NumCPU(), r.goVersion, r.pgVersion, r.redisVersion, r.o.concurrency, r.o.rate,
		r.o.rounds, r.o.duration/time.Duration(r.o.rounds), r.o.warmup, r.eventBytes)
	fmt.Fprintf(w, "Fast Postgres: %s. Durable: %s.\n\n", strings.Join(r.fastSettings, ", "), strings.Join(r.durableSettings, ", "))

	intake := r.intake[0].load.throughput()
	ser := serial(intake, r.pgbench.tps)
	fmt.Fprint(w, "## Targets\n\n")
	table(w, []string{"target", "goal", "result", ""}, r.targets(intake, ser))

	fmt.Fprint(w, "## Throughput at saturation\n\n")
	var rows [][]string
	for _, c := range []struct {
		name    string
		p       *phase
		ceiling float64
	}{
		{"service: first deliveries", r.first[0], ser},
		{"service: done duplicates", r.dup[0], intake},
		{"service: rejected signatures (400)", r.rejected[0], intake},
		{"ceiling: chi, read body, 200", r.chi[0], 0},
		{"ceiling: intake, verify + decode, 200", r.intake[0], 0},
	} {
		share := ""
		if c.ceiling > 0 {
			share = pct(c.p.load.throughput() / c.ceiling)
		}
		rows = append(rows, []string{c.name, rps(c.p.load.throughput()), share, ms(c.p.load.percentile(.5)), ms(c.p.load.percentile(.99)),
			us(c.p.perRequest(c.p.cpu)), us(c.p.perRequest(c.p.ours()))})
	}
	rows = append(rows,
		[]string{"ceiling: pgbench, the upsert", rps(r.pgbench.tps), "", "", "", "", us(r.pgbench.cpuPerTx())},
		[]string{"ceiling: serial, 1/(1/intake + 1/upsert)", rps(ser), "", "", "", "", ""},
		[]string{"redis-benchmark, the claim script", rps(r.redisBench.rps), "", r.redisBench.p50, r.redisBench.p99, "", us(r.redisBench.cpu)})
	table(w, []string{"case", ">req/s", ">/ ceiling", ">p50 ms", ">p99 ms", ">process CPU µs/req", ">all our CPU µs/req"}, rows)

	fmt.Fprint(w, "### CPU per request by process, at saturation (µs)\n\n")
	table(w, []string{"case", ">service or ceiling", ">redis-server", ">postgres", ">load generator", ">all"}, rowsOf(func(p *phase) []string {
		per := p.byProc.perRequest(max(p.load.requests, 1))
		// What is left is the target's own process, whatever its name.
		target := per.sum() - per["redis-server"] - per["postgres"] - per["generator"]
		return []string{f0(micros(time.Duration(target))), f0(micros(time.Duration(per["redis-server"]))),
			f0(micros(time.Duration(per["postgres"]))), f0(micros(time.Duration(per["generator"]))), f0(micros(time.Duration(per.sum())))}
	}, named{"first delivery", r.first[0]}, named{"done duplicate", r.dup[0]}, named{"rejected", r.rejected[0]},
		named{"chi ceiling", r.chi[0]}, named{"intake ceiling", r.intake[0]}))

	fmt.Fprintf(w, "## Latency at a fixed %s requests a second\n\n", rps(float64(r.o.rate)))
	table(w, []string{"case", ">req/s", ">p50 ms", ">p99 ms", ">p99.9 ms", ">max ms", ">all our CPU µs/req"}, rowsOf(func(p *phase) []string {
		l := p.load
		return []string{rps(l.throughput()), ms(l.percentile(.5)), ms(l.percentile(.99)), ms(l.percentile(.999)),
			ms(l.percentile(1)), us(p.perRequest(p.ours()))}
	}, named{"service: first deliveries", r.first[1]}, named{"service: first deliveries, durable Postgres", r.durable[1]},
		named{"service: done duplicates", r.dup[1]}, named{"service: rejected signatures", r.rejected[1]},
		named{"ceiling: chi", r.chi[1]}, named{"ceiling: intake", r.intake[1]}))

	fmt.Fprint(w, "## Cost per delivery, at saturation\n\n")
	table(w, []string{"case", ">Redis round trips", "Redis commands", "Postgres statements", ">bytes allocated", ">objects allocated", ">GCs per 1,000"}, rowsOf(func(p *phase) []string {
		m := p.metrics.perRequest(max(p.load.requests, 1))
		return []string{fmt.Sprintf("%.2f", p.redisPer()["round trips"]), commands(p.redisPer()), commands(p.pgPer()),
			f0(m["go_memstats_alloc_bytes_total"]), fmt.Sprintf("%.1f", m["go_memstats_mallocs_total"]),
			fmt.Sprintf("%.2f", 1000*m["go_gc_duration_seconds_count"])}
	}, named{"first delivery", r.first[0]}, named{"first delivery, durable Postgres", r.durable[0]},
		named{"done duplicate", r.dup[0]}, named{"rejected signature", r.rejected[0]}))

	fmt.Fprintf(w, "Peak RSS of the service (VmHWM), after %d duplicates in flight: %s.\n\n", r.o.rssConc, mib(r.peakRSS))
	if r.durable[0] != nil {
		fmt.Fprint(w, "## First deliveries on a durable Postgres\n\n")
		d := r.durable[0]
		dser := serial(intake, r.pgbenchDurable.tps)
		table(w, []string{"", ">fast Postgres", ">durable Postgres"}, [][]string{
			{"first deliveries, req/s at saturation", rps(r.first[0].load.throughput()), rps(d.load.throughput())},
			{"pgbench upsert, tps", rps(r.pgbench.tps), rps(r.pgbenchDurable.tps)},
			{"serial ceiling", rps(ser), rps(dser)},
			{"first deliveries / serial ceiling", pct(r.first[0].load.throughput() / ser), pct(d.load.throughput() / dser)},
			{"all our CPU µs per delivery", us(r.first[0].perRequest(r.first[0].ours())), us(d.perRequest(d.ours()))},
			{"peak RSS of the service", mib(r.peakRSS), mib(r.peakRSSDurable)},
		})
	}
	var notes []string
	for _, p := range []*phase{r.first[0], r.first[1], r.dup[0], r.dup[1], r.rejected[0], r.rejected[1], r.chi[0], r.chi[1], r.intake[0], r.intake[1], r.durable[0], r.durable[1]} {
		if p != nil {
			for _, n := range p.notes {
				notes = append(notes, "- "+p.target+" "+p.kind+": "+n)
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "## Anomalies\n\n%s\n\n", strings.Join(notes, "\n"))
	}
	if r.goBench != "" {
		fmt.Fprintf(w, "## Go benchmarks\n\n`go test -bench . -benchmem -benchtime %s` in internal/stripehook, internal/claim and internal/entitlements:\n\n```\n%s\n```\n",
			r.o.benchtime, r.goBench)
	}
}

// named is a table row's label and the run it shows.
type named struct {
	name string
	p    *phase
}

// rowsOf renders one row per run that happened: its label, then cells(p).
func rowsOf(cells func(*phase) []string, runs ...named) [][]string {
	var rows [][]string
	for _, n := range runs {
		if n.p != nil {
			rows = append(rows, append([]string{n.name}, cells(n.p)...))
		}
	}
	return rows
}

func (r *report) targets(intake, ser float64) [][]string {
	var rows [][]string
	add := func(name, goal, result string, met bool) {
		mark := "met"
		if !met {
			mark = "**missed**"
		}
		rows = append(rows, []string{name, goal, result, mark})
	}
	share := r.dup[0].load.throughput() / intake
	add("done duplicates / intake ceiling", "≥ "+pct(dupShareGoal), fmt.Sprintf("%s (%s / %s req/s)", pct(share), rps(r.dup[0].load.throughput()), rps(intake)), share >= dupShareGoal)
	share = r.first[0].load.throughput() / ser
	add("first deliveries / serial ceiling", "≥ "+pct(firstShareGoal), fmt.Sprintf("%s (%s / %s req/s)", pct(share), rps(r.first[0].load.throughput()), rps(ser)), share >= firstShareGoal)
	for _, c := range []struct {
		name string
		p    *phase
		want float64
	}{{"first delivery", r.first[0], 2}, {"duplicate", r.dup[0], 1}} {
		got := c.p.redisPer()["round trips"]
		add("Redis round trips per "+c.name, f0(c.want), fmt.Sprintf("%.2f", got), got > c.want-0.01 && got < c.want+0.01)
	}
	for _, c := range []struct {
		name string
		p    *phase
		goal time.Duration
	}{{"first deliveries", r.first[1], firstP99Goal}, {"done duplicates", r.dup[1], dupP99Goal}} {
		got := c.p.load.percentile(.99)
		add(fmt.Sprintf("p99 at %s req/s, %s", rps(float64(r.o.rate)), c.name), "< "+ms(c.goal)+" ms", ms(got)+" ms", got < c.goal)
	}
	add(fmt.Sprintf("peak RSS after %d duplicates in flight", r.o.rssConc), "< 32 MiB", mib(r.peakRSS), r.peakRSS < peakRSSGoalKiB)
	return rows
}

// commands lists counters as "NAME n.nn, ...", largest first, leaving out
// the round-trip count.
func commands(c counters) string {
	var parts []string
	for _, k := range c.sortedKeys() {
		if k != "round trips" {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, c[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 0, 64) + " %" }

func f0(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) }

func us(d time.Duration) string { return f0(micros(d)) }

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// rps renders a rate with a thousands separator.
func rps(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
