package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// The targets are judged against the right ceilings, and the tables show
// per-delivery costs from the counters.
func TestRender(t *testing.T) {
	t.Parallel()
	r := &report{o: options{rounds: 1, duration: time.Second, rate: 1000}, peakRSS: 33 << 10,
		upsert: pgbenchRun{tx: 4000, elapsed: time.Second, cpu: time.Second}}
	requests := [loads]int{1000, 3000, 5000, 8000, 4000}
	for i := range 2 {
		for k, n := range requests {
			r.runs[i][k] = result{requests: n, elapsed: time.Second, lat: []time.Duration{time.Millisecond}, c: counters{}}
		}
		r.runs[i][firsts].c = counters{roundTrips: 2000, pgStatements: 2000, pgPlans: 10, targetCPU: 3e8, allCPU: 6e8, "go_memstats_alloc_bytes_total": 17e6}
		r.runs[i][duplicates].c = counters{roundTrips: 3000}
	}
	var b strings.Builder
	r.render(&b)
	for _, want := range []string{
		"| done duplicates / intake ceiling | ≥ 75 % | 75 % (3,000 / 4,000 req/s) | met |",
		"| first deliveries / serial ceiling | ≥ 70 % | 50 % (1,000 / 2,000 req/s) | **missed** |",
		"| Redis round trips per first delivery | 2 | 2.00 | met |",
		"| Redis round trips per duplicate | 1 | 1.00 | met |",
		"| p99 at 1,000 req/s, done duplicates | < 2.00 ms | 1.00 ms | met |",
		"| peak RSS after 64 duplicates in flight | < 32 MiB | 33.0 MiB | **missed** |",
		"| service: first deliveries | 1,000 | 50 % | 1.00 | 1.00 | 1.00 | 1.00 | 300 | 600 |",
		"| ceiling: pgbench, the upsert | 4,000 |  |  |  |  |  |  | 250 |",
		"| service: first deliveries | 2.00 | 2.00 | 0.01 | 17000 | 0.0 | 0.00 |",
		"| service: rejected signatures (400) | 0.00 | 0.00 | 0.00 | 0 | 0.0 | 0.00 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// A comparison keeps the load generator's CPU out of a delivery's, and
// compares each round's two runs as well as the totals.
func TestRenderComparison(t *testing.T) {
	t.Parallel()
	c := &comparison{o: options{rounds: 3, duration: 3 * time.Second, rate: 1000, against: "../pre", durable: true}}
	run := func(requests int, all, load float64) result {
		return result{requests: requests, elapsed: time.Second, lat: []time.Duration{time.Millisecond},
			statuses: map[int]int{200: requests}, c: counters{allCPU: all, loadCPU: load, targetCPU: all / 2}}
	}
	for mode := range 2 {
		// Delivery CPU per request, this build against the other: 120 vs
		// 100 µs, 110 vs 100, 300 vs 200 (a round the machine slowed).
		c.rounds[mode] = [][2]result{
			{run(1000, 150e6, 30e6), run(1000, 130e6, 30e6)},
			{run(1000, 140e6, 30e6), run(1000, 130e6, 30e6)},
			{run(1000, 330e6, 30e6), run(1000, 230e6, 30e6)},
		}
	}
	renderedInBothModes(t, c, "Postgres durable (fsync, synchronous_commit and full_page_writes on)",
		"| this build | 1,000 | 1.00 | 1.00 | 103 | 177 | 207 | 0.00 | 0.00 | 0.00 |",
		"| ../pre | 1,000 | 1.00 | 1.00 | 82 | 133 | 163 | 0.00 | 0.00 | 0.00 |",
		"| change | +0 % | x1.00 | x1.00 | +27 % | +32 % | +27 % |  |  |  |",
		"Delivery CPU, this build's change round by round: median +20 %, from +10 % to +50 %.")
}

// renderedInBothModes checks that c's report says once, and each of
// rows at saturation and at the fixed rate.
func renderedInBothModes(t *testing.T, c *comparison, once string, rows ...string) {
	t.Helper()
	var b strings.Builder
	c.render(&b)
	for _, want := range rows {
		if strings.Count(b.String(), want) != 2 {
			t.Errorf("comparison lacks %q in both modes:\n%s", want, b.String())
		}
	}
	if !strings.Contains(b.String(), once) {
		t.Errorf("comparison does not say %q:\n%s", once, b.String())
	}
}

// With the app's webhook on, the relay's cost per webhook, measured as it
// caught up, is taken off the on build once per webhook its runs caused.
func TestRenderAppWebhook(t *testing.T) {
	t.Parallel()
	c := &comparison{o: options{rounds: 1, duration: time.Second, rate: 1000, appWebhook: true, against: "."}}
	run := func(all, load float64, relayed relayRun) result {
		return result{requests: 1000, elapsed: time.Second, lat: []time.Duration{time.Millisecond},
			statuses: map[int]int{200: 1000}, c: counters{allCPU: all, loadCPU: load, targetCPU: all / 2}, relay: relayed}
	}
	// 200 of the 1,000 webhooks sent as the relay caught up, for 50 µs of
	// process CPU and 100 µs of all a webhook.
	caughtUp := relayRun{sent: 1000, caughtUp: 200, catchUp: counters{targetCPU: 10e6, allCPU: 20e6}}
	for mode := range 2 {
		c.rounds[mode] = [][2]result{{run(230e6, 30e6, caughtUp), run(130e6, 30e6, relayRun{})}}
	}
	renderedInBothModes(t, c, "Written by `go run ./tools/bench -app-webhook`",
		"| app webhook on | 1,000 | 1.00 | 1.00 | 115 | 200 | 230 |",
		"| relay off | 1,000 | 1.00 | 1.00 | 65 | 100 | 130 |",
		"| change | +0 % | x1.00 | x1.00 | +77 % | +100 % | +77 % |  |  |  |",
		"| app webhook on, less the relay's work |  |  |  | 65 | 100 | 130 |  |  |  |",
		"| change, less the relay's work |  |  |  | +0 % | +0 % | +0 % |  |  |  |",
		"(200 of the 1000 webhooks the runs caused): 50 µs of process CPU and 100 µs of all our CPU a webhook",
		"round by round, their delivery CPU against the relay off: median +0 %, from +0 % to +0 %.")
}

// The service counts a delivery just after answering it: the harness reads
// its metrics until the count stops moving, so that the last answers of one
// run are not counted in the next.
func TestSettledMetricsWaitsForTrailingCounts(t *testing.T) {
	t.Parallel()
	var reads atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Counts still arriving for the first three reads, then settled;
		// the allocation counter moves on every read, as a scrape allocates.
		n := reads.Add(1)
		fmt.Fprintf(w, "# TYPE go_memstats_alloc_bytes_total counter\ngo_memstats_alloc_bytes_total %d\n", 1000*n)
		fmt.Fprintf(w, "webhook_deliveries_total{outcome=\"processed\",provider=\"stripe\"} %d\n", 100+min(n, 3))
	}))
	t.Cleanup(srv.Close)
	if m, err := settledMetrics(srv.URL); err != nil || delivered(m) != 103 {
		t.Errorf("delivered = %v, %v after %d reads, want 103", delivered(m), err, reads.Load())
	}
}

// The load generator's client reads each answer whole, keeps its
// connection, and opens a new one after the server closes it.
func TestClient(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch body, _ := io.ReadAll(r.Body); string(body) {
		case "bad":
			http.Error(w, "no", http.StatusBadRequest)
		case "close":
			w.Header().Set("Connection", "close")
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := client{addr: srv.Listener.Addr().String()}
	defer c.close()
	var got []int
	for _, body := range []string{"ok", "bad", "ok", "close", "ok"} {
		status, err := c.do(request([]byte(body), stripeSecret, time.Now()))
		got = append(got, status)
		if err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	if diff := cmp.Diff([]int{200, 400, 200, 200, 200}, got); diff != "" || conns.Load() != 2 {
		t.Errorf("statuses (-want +got):\n%s\n%d connections, want 2: one until the close, one after", diff, conns.Load())
	}
}

// pgbench binds every parameter of the service's upsert, and nothing else:
// a parameter added to entitlements.ApplySQL must be given a value here.
func TestPgbenchBindsEveryParameter(t *testing.T) {
	t.Parallel()
	script := pgbenchScript(entitlements.ApplySQL)
	if m := regexp.MustCompile(`\$[0-9]+`).FindString(script); m != "" {
		t.Errorf("script still holds %s:\n%s", m, script)
	}
	used, bound := map[string]bool{}, map[string]bool{"p1": true, "p7": true, "p26": true, "p27": true} // \set
	for _, m := range regexp.MustCompile(`:(p[0-9]+)\b`).FindAllStringSubmatch(script, -1) {
		used[m[1]] = true
	}
	for n := range upsertValues() {
		bound[fmt.Sprintf("p%d", n)] = true
	}
	if diff := cmp.Diff(used, bound); diff != "" {
		t.Errorf("parameters used (-) and bound (+):\n%s", diff)
	}
}

// What a run cost is the difference of the snapshots around it: Redis
// round trips without the INFO calls that counted them, and all our CPU
// with that of the processes that exited meanwhile, such as pgbench.
func TestSnapshotDelta(t *testing.T) {
	t.Parallel()
	h := &harness{rdb: redis.NewClient(&redis.Options{Addr: dbtest.StartRedis(t).Addr()})}
	t.Cleanup(func() { h.rdb.Close() })
	before, err := h.snapshot(t.Context(), target{pid: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	h.rdb.Set(t.Context(), "k", "v", time.Minute)
	h.rdb.Get(t.Context(), "k")
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	after, err := h.snapshot(t.Context(), target{pid: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	d := delta(before, after)
	if d[roundTrips] != 2 {
		t.Errorf("%v round trips, want 2", d[roundTrips])
	}
	// Other tests may add to it, never take away.
	if child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(); time.Duration(d[allCPU]) < child-2*clockTick {
		t.Errorf("all our CPU grew by %v while a child used %v", time.Duration(d[allCPU]), child)
	}
}
