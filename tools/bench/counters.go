package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// counters is a set of named cumulative counters read before and after a
// measured run; the difference, divided by the run's requests, is the cost
// per delivery.
type counters map[string]float64

// Keys of a snapshot besides the service's metrics, which keep their
// names.
const (
	roundTrips   = "redis round trips"
	pgStatements = "postgres statements"
	pgPlans      = "postgres plans"
	targetCPU    = "target CPU ns" // the target process's own
	allCPU       = "all CPU ns"    // see ourCPU
	loadCPU      = "load CPU ns"   // this process's own: the load generator
)

// redisRoundTrips reads the replies Redis has written: one per round trip
// of an unpipelined client, the INFO that reads them included.
func redisRoundTrips(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO: %w", err)
	}
	_, n, _ := strings.Cut(info, "\r\ntotal_writes_processed:")
	n, _, _ = strings.Cut(n, "\r\n")
	return strconv.ParseFloat(n, 64)
}

// statements reads how many statements pg_stat_statements has counted in
// database db, and how many plans it built for them. conn is to another
// database, so that reading does not count.
func statements(ctx context.Context, conn *pgx.Conn, db string) (calls, plans float64, err error) {
	const q = `
SELECT coalesce(sum(s.calls), 0), coalesce(sum(s.plans), 0)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1`
	err = conn.QueryRow(ctx, q, db).Scan(&calls, &plans)
	return calls, plans, err
}

// settledMetrics reads the service's metrics until two reads 10 ms apart
// count the same deliveries (for at most a second). The service counts a
// delivery just after answering it, so the last answers of a run can be
// counted after the load generator has seen them, in the next run's window.
func settledMetrics(url string) (counters, error) {
	var last counters
	for range 100 {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
		if err != nil {
			return nil, err
		}
		m, err := parseMetrics(resp.Body)
		resp.Body.Close()
		if err != nil || last != nil && delivered(m) == delivered(last) {
			return m, err
		}
		last = m
		time.Sleep(10 * time.Millisecond)
	}
	return last, nil
}

// parseMetrics keeps the samples of the allocation, GC and delivery
// counters from the Prometheus text format, keyed by the sample's name and
// labels as written.
func parseMetrics(r io.Reader) (counters, error) {
	c := counters{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		switch name {
		case "go_memstats_alloc_bytes_total", "go_memstats_mallocs_total", "go_gc_duration_seconds_count", "webhook_deliveries_total":
			i := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
			c[line[:i]] = v
		}
	}
	return c, sc.Err()
}

// delivered is the service's count of deliveries, whatever their outcome.
func delivered(c counters) float64 {
	var n float64
	for k, v := range c {
		if strings.HasPrefix(k, "webhook_deliveries_total{") {
			n += v
		}
	}
	return n
}

// clockTick is the unit of the CPU times in /proc/PID/stat: USER_HZ, 100
// on every Linux configuration Go supports.
const clockTick = 10 * time.Millisecond

// procStat reads a process's parent, its own CPU time (user + system) and
// that of its children it has reaped.
func procStat(pid int) (ppid int, own, reaped time.Duration, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name may hold spaces and parentheses; the fields after
	// its closing one do not.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	var n [4]int64 // utime stime cutime cstime, numbers in every kernel
	for i := range n {
		n[i], _ = strconv.ParseInt(f[11+i], 10, 64)
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, time.Duration(n[0]+n[1]) * clockTick, time.Duration(n[2]+n[3]) * clockTick, nil
}

// ourCPU is the CPU time of this process and every process below it, the
// exited ones included (their time is in their parents' once reaped):
// the load generator, the service, the ceilings, Postgres with its
// backends, Redis and pgbench, and the kernel's work on their behalf;
// but not process not and what runs below it (the app's receiver, which
// stands in for another machine; 0: none).
func ourCPU(not int) (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	children := map[int][]int{}
	cpu := map[int]time.Duration{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, own, reaped, err := procStat(pid)
		if err != nil {
			continue // gone meanwhile
		}
		children[ppid] = append(children[ppid], pid)
		cpu[pid] = own + reaped
	}
	var sum time.Duration
	for queue := []int{os.Getpid()}; len(queue) > 0; queue = queue[1:] {
		if queue[0] == not {
			continue
		}
		sum += cpu[queue[0]]
		queue = append(queue, children[queue[0]]...)
	}
	return sum, nil
}

// peakRSS returns a process's VmHWM (peak resident set) in KiB.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	_, v, ok := strings.Cut(string(b), "\nVmHWM:")
	if err != nil || !ok {
		return 0, fmt.Errorf("/proc/%d/status: no VmHWM: %v", pid, err)
	}
	return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
}
