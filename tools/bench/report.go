package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// write renders the tables to o.out (or stdout for "-").
func (h *harness) write(r interface{ render(io.Writer) }, stdout io.Writer) error {
	if h.o.out == "-" {
		r.render(stdout)
		return nil
	}
	var b strings.Builder
	r.render(&b)
	h.logf("writing %s; the run took %s", h.o.out, time.Since(h.started).Round(time.Second))
	return os.WriteFile(h.o.out, []byte(b.String()), 0o644)
}

// table writes a Markdown table, its columns after the first aligned
// right.
func table(w io.Writer, header []string, rows [][]string) {
	fmt.Fprintf(w, "| %s |\n| --- |%s\n", strings.Join(header, " | "), strings.Repeat(" ---: |", len(header)-1))
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
}

func (r *report) render(w io.Writer) {
	fmt.Fprintf(w, "# Latest bench run\n\nWritten by `make bench` (tools/bench) on %s in %s; do not edit: run it again. "+
		"docs/PERFORMANCE.md says what each figure measures and how to read it.\n\n",
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	fmt.Fprintf(w, "%d CPUs, %s; %s, Redis as internal/dbtest starts it; %d in flight at saturation, %d req/s fixed rate, "+
		"%d interleaved rounds of %s per target, %s warm-up each; event %d bytes.\n\n",
		runtime.NumCPU(), runtime.Version(), r.o.postgres(), r.o.concurrency, r.o.rate, r.o.rounds, r.o.duration/time.Duration(r.o.rounds), r.o.warmup, r.eventBytes)

	// The serial ceiling is the intake and the upsert done one after the
	// other on the same machine.
	intake := r.runs[0][intakeCeiling].throughput()
	ser := 1 / (1/intake + 1/r.upsert.tps())
	fmt.Fprint(w, "## Targets\n\n")
	table(w, []string{"target", "goal", "result", ""}, r.targets(intake, ser))

	for i, title := range []string{"Throughput at saturation", fmt.Sprintf("Latency at a fixed %s requests a second", rps(float64(r.o.rate)))} {
		fmt.Fprintf(w, "## %s\n\n", title)
		header := []string{"case", "req/s", "/ ceiling", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "process CPU µs/req", "all our CPU µs/req"}
		var rows [][]string
		for j, l := range r.runs[i] {
			share := ""
			if ceiling := []float64{ser, intake, intake, 0, 0}[j]; ceiling > 0 {
				share = pct(l.throughput() / ceiling)
			}
			rows = append(rows, []string{label(j), rps(l.throughput()), share, ms(l.percentile(.5)), ms(l.percentile(.99)),
				ms(l.percentile(.999)), ms(l.percentile(1)), us(l.per(targetCPU)), us(l.per(allCPU))})
		}
		if i == 1 { // a fixed rate is no share of a ceiling
			header = slices.Delete(header, 2, 3)
			for k := range rows {
				rows[k] = slices.Delete(rows[k], 2, 3)
			}
		} else {
			rows = append(rows,
				[]string{"ceiling: pgbench, the upsert", rps(r.upsert.tps()), "", "", "", "", "", "", us(float64(r.upsert.cpuPerTx()))},
				[]string{"ceiling: serial, 1/(1/intake + 1/upsert)", rps(ser), "", "", "", "", "", "", ""})
		}
		table(w, header, rows)
	}

	fmt.Fprint(w, "## Cost per delivery, at saturation\n\n")
	var rows [][]string
	for j, p := range r.runs[0][:chiCeiling] {
		rows = append(rows, []string{label(j), fmt.Sprintf("%.2f", p.per(roundTrips)), fmt.Sprintf("%.2f", p.per(pgStatements)),
			fmt.Sprintf("%.2f", p.per(pgPlans)), fmt.Sprintf("%.0f", p.per("go_memstats_alloc_bytes_total")), fmt.Sprintf("%.1f", p.per("go_memstats_mallocs_total")),
			fmt.Sprintf("%.2f", 1000*p.per("go_gc_duration_seconds_count"))})
	}
	table(w, []string{"case", "Redis round trips", "Postgres statements", "Postgres plans", "bytes allocated", "objects allocated", "GCs per 1,000"}, rows)

	fmt.Fprintf(w, "Peak RSS of the service (VmHWM), after %d duplicates in flight: %s.\n\n", rssConcurrency, mib(r.peakRSS))
}

// label names a load in the tables.
func label(kind int) string {
	return [loads]string{
		firsts:        "service: first deliveries",
		duplicates:    "service: done duplicates",
		rejections:    "service: rejected signatures (400)",
		chiCeiling:    "ceiling: chi, read body, 200",
		intakeCeiling: "ceiling: intake, verify + decode, 200",
	}[kind]
}

// targets are the rows of the goals docs/PERFORMANCE.md explains, each
// goal written beside the test of it.
func (r *report) targets(intake, ser float64) [][]string {
	sat, fixed := r.runs[0], r.runs[1]
	dup, first := sat[duplicates].throughput(), sat[firsts].throughput()
	tripsFirst, tripsDup := sat[firsts].per(roundTrips), sat[duplicates].per(roundTrips)
	p99First, p99Dup := fixed[firsts].percentile(.99), fixed[duplicates].percentile(.99)
	at := "p99 at " + rps(float64(r.o.rate)) + " req/s, "
	return [][]string{
		goal("done duplicates / intake ceiling", "≥ 75 %", share(dup, intake), dup >= 0.75*intake),
		goal("first deliveries / serial ceiling", "≥ 70 %", share(first, ser), first >= 0.70*ser),
		goal("Redis round trips per first delivery", "2", fmt.Sprintf("%.2f", tripsFirst), math.Abs(tripsFirst-2) < 0.01),
		goal("Redis round trips per duplicate", "1", fmt.Sprintf("%.2f", tripsDup), math.Abs(tripsDup-1) < 0.01),
		goal(at+"first deliveries", "< 3.00 ms", ms(p99First)+" ms", p99First < 3*time.Millisecond),
		goal(at+"done duplicates", "< 2.00 ms", ms(p99Dup)+" ms", p99Dup < 2*time.Millisecond),
		goal(fmt.Sprintf("peak RSS after %d duplicates in flight", rssConcurrency), "< 32 MiB", mib(r.peakRSS), r.peakRSS < 32<<10),
	}
}

func goal(name, goal, result string, met bool) []string {
	if met {
		return []string{name, goal, result, "met"}
	}
	return []string{name, goal, result, "**missed**"}
}

// share renders a throughput against its ceiling.
func share(got, ceiling float64) string {
	return fmt.Sprintf("%s (%s / %s req/s)", pct(got/ceiling), rps(got), rps(ceiling))
}

func pct(f float64) string { return fmt.Sprintf("%.0f %%", 100*f) }

// us renders nanoseconds as microseconds.
func us(ns float64) string { return fmt.Sprintf("%.0f", ns/1e3) }

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// rps renders a rate with a thousands separator.
func rps(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
