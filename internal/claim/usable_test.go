package claim

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// probeCounter counts the claim-script calls a client sends on probe
// keys, as Redis receives them (a hook on the real client, not a mock).
type probeCounter struct{ n atomic.Int64 }

func (c *probeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *probeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *probeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if (name == "evalsha" || name == "eval") && strings.Contains(cmd.String(), ":probe:") {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// TestUsableGaugeProbesOncePerInterval: however many scrapes (at once or
// one after another), the gauge probes Redis at most once per UsableFresh;
// readiness (Check) probes on every call and its answer serves the scrapes
// that follow. On main each scrape ran the probe: 200 scrapes, 200
// probes.
func TestUsableGaugeProbesOncePerInterval(t *testing.T) {
	t.Parallel()
	rdb, prefix := dbtest.Redis(t)
	var probes probeCounter
	rdb.AddHook(&probes)
	p := NewUsable(NewStore(rdb, StoreConfig{Prefix: prefix, Timeout: time.Second}), slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	p.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Gauge())

	scrape := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				mfs, err := reg.Gather()
				if err != nil {
					t.Error(err)
					return
				}
				if v := mfs[0].GetMetric()[0].GetGauge().GetValue(); v != 1 {
					t.Errorf("webhook_claim_store_usable = %v, want 1", v)
				}
			})
		}
		wg.Wait()
	}
	wantProbes := func(what string, want int64) {
		t.Helper()
		if got := probes.n.Swap(0); got != want {
			t.Errorf("%s: %d probes reached Redis, want %d", what, got, want)
		}
	}

	// The first probe loads the script (EVALSHA, then EVAL): not counted.
	if err := p.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	probes.n.Store(0)
	scrape(100)
	wantProbes("100 scrapes at once after readiness probed", 0)
	advance(UsableFresh)
	scrape(100)
	wantProbes("100 scrapes at once, the last probe stale", 1)
	for range 100 {
		scrape(1)
	}
	wantProbes("100 scrapes one after another within the interval", 0)
	for range 3 {
		advance(UsableFresh)
		scrape(1)
		scrape(1)
	}
	wantProbes("two scrapes in each of 3 intervals", 3)
	for range 3 {
		if err := p.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wantProbes("readiness 3 times", 3)
}

// TestUsableGaugeSeesFailure: the gauge turns 0 once Redis stops working,
// within UsableFresh, and at once after readiness saw it.
func TestUsableGaugeSeesFailure(t *testing.T) {
	t.Parallel()
	rdb, prefix := dbtest.Redis(t)
	p := NewUsable(NewStore(rdb, StoreConfig{Prefix: prefix, Timeout: time.Second}), slog.New(slog.DiscardHandler))
	now := time.Unix(1_800_000_000, 0)
	p.now = func() time.Time { return now }
	if err := p.recent(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A store whose client is closed fails like a Redis gone.
	opts := *rdb.Options()
	closed := redis.NewClient(&opts)
	closed.Close()
	p.store = NewStore(closed, StoreConfig{Prefix: prefix, Timeout: time.Second})
	if err := p.recent(t.Context()); err != nil {
		t.Fatalf("within the interval: %v, want the last answer (nil)", err)
	}
	if err := p.Check(t.Context()); err == nil {
		t.Fatal("readiness: nil, want the probe's failure")
	}
	if err := p.recent(t.Context()); err == nil {
		t.Fatal("after readiness failed: nil, want its failure")
	}
	p.store = NewStore(rdb, StoreConfig{Prefix: prefix, Timeout: time.Second})
	now = now.Add(UsableFresh)
	if err := p.recent(t.Context()); err != nil {
		t.Fatalf("after the interval, Redis back: %v, want nil", err)
	}
}
