package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
func pgbenchValues() []string {
	return []string{
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

func pgbench(ctx context.Context, binDir, workDir string, port int, db, sql string, clients int, d time.Duration, extra ...string) (pgbenchResult, error) {
	script := filepath.Join(workDir, "upsert.pgbench")
	if err := os.WriteFile(script, []byte(pgbenchScript(sql)), 0o644); err != nil {
		return pgbenchResult{}, err
	}
	args := []string{
		"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres",
		"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script,
	}
	args = append(append(append(args, extra...), pgbenchValues()...), db)
	before, err := ourCPU()
	if err != nil {
		return pgbenchResult{}, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pgbench"), args...)
	cmd.Dir = workDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	after, err := ourCPU()
	if err != nil {
		return pgbenchResult{}, err
	}
	field := func(re string) []byte {
		if m := regexp.MustCompile(`(?m)^` + re).FindSubmatch(out); m != nil {
			return m[1]
		}
		return nil
	}
	m := field(`tps = ([0-9.]+)`)
	if m == nil {
		return pgbenchResult{}, fmt.Errorf("pgbench: no tps in\n%s", out)
	}
	tps, err := strconv.ParseFloat(string(m), 64)
	if err != nil {
		return pgbenchResult{}, err
	}
	res := pgbenchResult{tps: tps, runs: 1, cpu: after - before}
	res.tx, _ = strconv.ParseInt(string(field(`number of transactions actually processed: ([0-9]+)`)), 10, 64)
	res.latencyMS, _ = strconv.ParseFloat(string(field(`latency average = ([0-9.]+) ms`)), 64)
	res.failed, _ = strconv.ParseInt(string(field(`number of failed transactions: ([0-9]+)`)), 10, 64)
	return res, nil
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
	before, err := ourCPU()
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
	after, err := ourCPU()
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
