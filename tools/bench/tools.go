package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pgbenchResult is one pgbench run of the service's upsert, or the mean of
// several.
type pgbenchResult struct {
	tps       float64
	latencyMS float64 // average
	failed    int64
	runs      int
	tx        int64         // transactions, all runs
	cpu       time.Duration // CPU of pgbench and Postgres, all runs
}

// cpuPerTx is the CPU per transaction of pgbench, Postgres and the kernel
// on their behalf.
func (r pgbenchResult) cpuPerTx() time.Duration {
	if r.tx == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.tx)
}

// add folds another run of the same length into r.
func (r *pgbenchResult) add(q pgbenchResult) {
	n := float64(r.runs)
	r.tps = (r.tps*n + q.tps) / (n + 1)
	r.latencyMS = (r.latencyMS*n + q.latencyMS) / (n + 1)
	r.failed += q.failed
	r.runs++
	r.tx += q.tx
	r.cpu += q.cpu
}

// The values pgbench binds for the parameters of the upsert, as the
// service binds them for the fixture (parameters 1 and 7, the subscription
// and event ids, are random per transaction so that each is a new row).
var pgbenchValues = []string{
	"-D", "p2=cus_QmunchableCust01",
	"-D", "p3=active",
	"-D", "p4=price_1QmunchableMonthly",
	"-D", "p5=2025-12-31 12:00:00+00",
	"-D", "p6=false",
	"-D", "p8=2025-12-01 12:00:00+00",
	"-D", "p9=evt_none", // no same-second successor: the fast path
	"-D", "p10=2026-01-15 12:00:00+00",
	"-D", "p11=2025-12-01 12:00:00+00",
	"-D", "p12=2026-01-15 12:00:00+00",
	"-D", "p13=2025-11-17 12:00:00+00",
	"-D", "p14=2025-12-01 12:00:00+00",
	"-D", "p15=void",
	"-D", "p16=2026-01-15 12:00:00+00",
	"-D", "p17=false",
	"-D", "p18={}",
	"-D", "p19={si_QmunchableItem01}",
	"-D", "p20={price_1QmunchableMonthly}",
	"-D", "p21={prod_QmunchablePlan}",
	"-D", "p22={base_monthly}",
	"-D", "p23={1}",
	"-D", "p24={2025-12-01 12:00:00+00}",
	"-D", "p25={2025-12-31 12:00:00+00}",
}

// pgbenchScript is the service's upsert with its $n parameters turned into
// pgbench variables (which pgbench -M prepared sends as parameters again,
// so the server sees the same statement).
func pgbenchScript(sql string) string {
	for i := 25; i >= 1; i-- {
		sql = strings.ReplaceAll(sql, "$"+strconv.Itoa(i), ":p"+strconv.Itoa(i))
	}
	return "\\set p1 random(1, 999999999999)\n\\set p7 random(1, 999999999999)\n" + strings.TrimSpace(sql) + ";\n"
}

var (
	reTPS     = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	reTx      = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	reLatency = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	reFailed  = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

func runPgbench(ctx context.Context, binDir, workDir string, port int, db, sql string, clients int, d time.Duration) (pgbenchResult, error) {
	out, err := pgbench(ctx, binDir, workDir, port, db, sql, clients, d)
	if err != nil {
		return pgbenchResult{}, err
	}
	return out.result, nil
}

// runPgbenchRate runs the upsert at a fixed rate for warmup + d, each
// transaction logged (-l), and returns the latencies of those that ended
// after the warm-up (which also covers pgbench opening its connections
// while its schedule has already started). pgbench measures latency from
// each transaction's scheduled start, so schedule lag counts, as in the
// harness's own fixed-rate runs.
//
// kept is the share of all transactions that were measured, to apportion
// the run's CPU.
func runPgbenchRate(ctx context.Context, binDir, workDir string, port int, db, sql string, clients, rate int, warmup, d time.Duration) (res loadResult, kept float64, err error) {
	logs := filepath.Join(workDir, "pgbench-log")
	if err := os.RemoveAll(logs); err != nil {
		return loadResult{}, 0, err
	}
	if err := os.Mkdir(logs, 0o755); err != nil {
		return loadResult{}, 0, err
	}
	total := (warmup + d + time.Second - 1).Truncate(time.Second) // pgbench counts whole seconds
	out, err := pgbench(ctx, binDir, logs, port, db, sql, clients, total, "-R", strconv.Itoa(rate), "-l", "--log-prefix", filepath.Join(logs, "tx"))
	if err != nil {
		return loadResult{}, 0, err
	}
	files, err := filepath.Glob(filepath.Join(logs, "tx.*"))
	if err != nil {
		return loadResult{}, 0, err
	}
	type tx struct {
		end time.Time
		lat time.Duration
	}
	var txs []tx
	var first time.Time
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			return loadResult{}, 0, err
		}
		// client_id transaction_no latency_us script_no end_epoch_s end_us
		for line := range strings.SplitSeq(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 {
				continue
			}
			us, err1 := strconv.ParseInt(f[2], 10, 64)
			sec, err2 := strconv.ParseInt(f[4], 10, 64)
			frac, err3 := strconv.ParseInt(f[5], 10, 64)
			if errors.Join(err1, err2, err3) != nil {
				continue
			}
			t := tx{end: time.Unix(sec, frac*1000), lat: time.Duration(us) * time.Microsecond}
			if first.IsZero() || t.end.Before(first) {
				first = t.end
			}
			txs = append(txs, t)
		}
	}
	res = loadResult{statuses: map[int]int{}}
	var last time.Time
	for _, t := range txs {
		if t.end.Before(first.Add(warmup)) {
			continue
		}
		res.lat = append(res.lat, t.lat)
		if t.end.After(last) {
			last = t.end
		}
	}
	slices.Sort(res.lat)
	res.requests = len(res.lat)
	res.statuses[200] = res.requests
	res.elapsed = last.Sub(first.Add(warmup))
	res.errors = int(out.result.failed)
	return res, float64(res.requests) / float64(max(len(txs), 1)), nil
}

type pgbenchOutput struct {
	result pgbenchResult
}

func pgbench(ctx context.Context, binDir, workDir string, port int, db, sql string, clients int, d time.Duration, extra ...string) (pgbenchOutput, error) {
	script := filepath.Join(workDir, "upsert.pgbench")
	if err := os.WriteFile(script, []byte(pgbenchScript(sql)), 0o644); err != nil {
		return pgbenchOutput{}, err
	}
	args := []string{
		"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres",
		"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script,
	}
	args = append(append(append(args, extra...), pgbenchValues...), db)
	before, err := treeCPU(os.Getpid())
	if err != nil {
		return pgbenchOutput{}, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pgbench"), args...)
	cmd.Dir = workDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return pgbenchOutput{}, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	after, err := treeCPU(os.Getpid())
	if err != nil {
		return pgbenchOutput{}, err
	}
	m := reTPS.FindSubmatch(out)
	if m == nil {
		return pgbenchOutput{}, fmt.Errorf("pgbench: no tps in\n%s", out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return pgbenchOutput{}, err
	}
	res := pgbenchResult{tps: tps, runs: 1, cpu: after - before}
	if m := reTx.FindSubmatch(out); m != nil {
		res.tx, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	if m := reLatency.FindSubmatch(out); m != nil {
		res.latencyMS, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := reFailed.FindSubmatch(out); m != nil {
		res.failed, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	return pgbenchOutput{result: res}, nil
}

// redisBenchResult is one redis-benchmark run of the claim script.
type redisBenchResult struct {
	rps      float64
	p50, p99 string        // ms
	cpu      time.Duration // CPU per call of redis-benchmark, Redis and the kernel on their behalf
}

// runRedisBenchmark runs EVALSHA of the loaded claim script on random keys
// (__rand_int__), each call a new claim as in a first delivery.
func runRedisBenchmark(ctx context.Context, addr, sha string, clients, requests int) (redisBenchResult, error) {
	host, port, _ := strings.Cut(addr, ":")
	value := "processing|0123456789abcdef01234567|1764590400000|0123456789abcdef0123456789abcdef"
	before, err := treeCPU(os.Getpid())
	if err != nil {
		return redisBenchResult{}, err
	}
	out, err := exec.CommandContext(ctx, "redis-benchmark",
		"-h", host, "-p", port, "-c", strconv.Itoa(clients), "-n", strconv.Itoa(requests),
		"-r", "100000000", "--csv",
		"EVALSHA", sha, "1", "webhook:stripe:bench___rand_int__", value, "120000",
	).Output()
	if err != nil {
		return redisBenchResult{}, fmt.Errorf("redis-benchmark: %w\n%s", err, out)
	}
	after, err := treeCPU(os.Getpid())
	if err != nil {
		return redisBenchResult{}, err
	}
	records, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil || len(records) < 2 || len(records[1]) < 7 {
		return redisBenchResult{}, fmt.Errorf("redis-benchmark: unexpected output\n%s", out)
	}
	rps, err := strconv.ParseFloat(records[1][1], 64)
	if err != nil {
		return redisBenchResult{}, err
	}
	return redisBenchResult{rps: rps, p50: records[1][4], p99: records[1][6], cpu: (after - before) / time.Duration(requests)}, nil
}

// perfProfile is a summary of `perf record -a` over a load run: where
// every core's time went by process, and the service's own share by kernel,
// Go package and symbol.
type perfProfile struct {
	byProcess, byPackage, bySymbol []share
	kernelShare                    float64 // of the service's samples
}

type share struct {
	name string
	pct  float64
}

// runPerf starts sampling every CPU for d; the returned function waits for
// the recording and summarises it for the process pid.
func runPerf(ctx context.Context, workDir string, d time.Duration, pid int) (func() (perfProfile, error), error) {
	data := filepath.Join(workDir, "perf.data")
	cmd := exec.CommandContext(ctx, "perf", "record", "-a", "-F", "499", "-o", data, "--", "sleep", strconv.Itoa(int(d.Seconds())))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	return func() (perfProfile, error) {
		if err := cmd.Wait(); err != nil {
			return perfProfile{}, fmt.Errorf("perf record: %w\n%s", err, stderr.String())
		}
		report := func(args ...string) ([][]string, error) {
			args = append([]string{"report", "-i", data, "--stdio", "--no-children", "--percentage", "absolute", "-t", "|", "--percent-limit", "0"}, args...)
			out, err := exec.CommandContext(ctx, "perf", args...).Output()
			if err != nil {
				return nil, fmt.Errorf("perf report: %w", err)
			}
			var rows [][]string
			for line := range strings.SplitSeq(string(out), "\n") {
				if f := strings.Split(line, "|"); len(f) > 1 && !strings.HasPrefix(strings.TrimSpace(line), "#") {
					rows = append(rows, f)
				}
			}
			return rows, nil
		}
		procs, err := report("--sort", "comm")
		if err != nil {
			return perfProfile{}, err
		}
		// --pid takes the process's threads, which is what a Go program is.
		service, err := report("--pid", strconv.Itoa(pid), "--sort", "dso,sym")
		if err != nil {
			return perfProfile{}, err
		}
		return summarisePerf(procs, service), nil
	}, nil
}

// summarisePerf reads perf report rows: "  1.23%|comm" for every process,
// and "  1.23%|dso|[.] symbol" for the service. Percentages are of all
// samples in both.
func summarisePerf(procRows, serviceRows [][]string) perfProfile {
	percent := func(s string) float64 {
		v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
		return v
	}
	procs, pkgs, syms := counters{}, counters{}, counters{}
	var total, service, kernel float64 // percentages of all samples
	for _, f := range procRows {
		if len(f) == 2 {
			procs[strings.TrimSpace(f[1])] += percent(f[0])
			total += percent(f[0])
		}
	}
	for _, f := range serviceRows {
		if len(f) != 3 {
			continue
		}
		pct, dso, sym := percent(f[0]), strings.TrimSpace(f[1]), strings.TrimSpace(f[2])
		service += pct
		if strings.HasPrefix(sym, "[k]") {
			kernel += pct
			pkgs["kernel (syscalls, loopback TCP, scheduling)"] += pct
			continue
		}
		name := strings.TrimSpace(strings.TrimPrefix(sym, "[.]"))
		pkgs[goPackage(name, dso)] += pct
		if !strings.HasPrefix(name, "0x") { // an address without a symbol: [vdso]
			syms[name] += pct
		}
	}
	return perfProfile{
		kernelShare: kernel / max(service, 1e-9),
		byProcess:   top(procs, total, 10),
		byPackage:   top(pkgs, service, 15),
		bySymbol:    top(syms, service, 20),
	}
}

// goPackage is the import path of a Go symbol such as
// "encoding/json.(*decodeState).object", or the dso for anything else.
func goPackage(sym, dso string) string {
	if i := strings.IndexByte(sym, '['); i >= 0 {
		sym = sym[:i] // type arguments may hold import paths
	}
	slash := strings.LastIndexByte(sym, '/')
	dot := strings.IndexByte(sym[slash+1:], '.')
	if dot < 0 || strings.HasPrefix(sym, "0x") {
		return dso
	}
	return sym[:slash+1+dot]
}

// top returns the n largest entries of c as shares of total.
func top(c counters, total float64, n int) []share {
	var out []share
	for _, k := range c.sortedKeys() {
		if len(out) == n {
			break
		}
		out = append(out, share{name: k, pct: 100 * c[k] / max(total, 1e-9)})
	}
	return out
}

// runGoBenchmarks runs the packages' Go benchmarks against the throwaway
// servers and returns their result lines.
func runGoBenchmarks(ctx context.Context, goBin, root string, env []string, benchtime string) (string, error) {
	cmd := exec.CommandContext(ctx, goBin, "test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", benchtime, "-count", "1",
		"./internal/stripehook", "./internal/claim", "./internal/entitlements")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var keep []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "ok") || strings.HasPrefix(line, "FAIL") || strings.Contains(line, "SKIP") {
			keep = append(keep, line)
		}
	}
	if err != nil {
		return strings.Join(keep, "\n"), fmt.Errorf("go test -bench: %w\n%s", err, out)
	}
	return strings.Join(keep, "\n"), nil
}
