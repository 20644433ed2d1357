package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A run without the durable stage or the Go benchmarks still renders every
// table it measured, and the ratios are taken against the right ceilings.
func TestRenderWithoutDurable(t *testing.T) {
	t.Parallel()
	ph := func(kind string, requests int, cpu time.Duration) *phase {
		return &phase{target: "t", kind: kind, load: loadResult{requests: requests, elapsed: time.Second, statuses: map[int]int{200: requests},
			lat: []time.Duration{time.Millisecond}}, cpu: cpu, byProc: counters{"generator": float64(cpu) / 4, "x": float64(cpu)}}
	}
	r := &report{o: options{rounds: 1, duration: time.Second, rate: 1000, rssConc: 64}, started: time.Now(),
		pgbench: pgbenchResult{tps: 4000}, peakRSS: 30 << 10}
	r.first = [2]*phase{ph("first", 1000, time.Second), ph("first", 1000, time.Second)}
	r.dup = [2]*phase{ph("duplicate", 3000, time.Second), ph("duplicate", 1000, time.Second)}
	r.rejected = [2]*phase{ph("rejected", 5000, time.Second), ph("rejected", 1000, time.Second)}
	r.chi = [2]*phase{ph("chi", 8000, time.Second), ph("chi", 1000, time.Second)}
	r.intake = [2]*phase{ph("intake", 4000, time.Second), ph("intake", 1000, time.Second)}
	var b strings.Builder
	r.render(&b)
	out := b.String()
	for _, want := range []string{
		"| done duplicates / intake ceiling | ≥ 75 % | 75 % (3,000 / 4,000 req/s) | met |",
		"| first deliveries / serial ceiling | ≥ 70 % | 50 % (1,000 / 2,000 req/s) | **missed** |",
		"| done duplicate | 333 | 0 | 0 | 83 | 417 |",
		"## Latency at a fixed 1,000 requests a second",
		"## Cost per delivery, at saturation",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "durable Postgres |") {
		t.Errorf("report shows durable rows for a run without them:\n%s", out)
	}
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
		fmt.Fprintf(w, "go_memstats_alloc_bytes_total %d\n", 1000*n)
		fmt.Fprintf(w, "webhook_deliveries_total{outcome=\"processed\",provider=\"stripe\"} %d\n", 100+min(n, 3))
	}))
	t.Cleanup(srv.Close)
	m, err := settledMetrics(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got := delivered(m); got != 103 {
		t.Errorf("delivered = %v after %d reads, want 103", got, reads.Load())
	}
}
