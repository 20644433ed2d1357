package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// UsableLogEvery spaces the error lines of a failing probe: readiness and
// scrapes probe, and an operator needs the reason, not a flood.
const UsableLogEvery = time.Minute

// UsableFresh is how long a probe's answer stands for the
// webhook_claim_store_usable gauge. /metrics is on the public listener
// when METRICS_ADDR is empty, and each scrape ran the claim script on
// every primary: a flood of scrapes was a flood of Redis calls. A scrape
// now probes at most once per UsableFresh (readiness, which probes on
// every call, keeps the answer fresh in between): far under any scrape
// interval worth having, so the gauge is as current as before.
const UsableFresh = 5 * time.Second

// Usable tells readiness and the webhook_claim_store_usable gauge whether a
// claim works now: it runs the claim script on this host's probe keys
// (Store.Probe: every primary's, on a cluster). Readiness probes on every
// call, so its answer is never older than the question; the gauge takes
// the last answer while it is under UsableFresh old. Calls that arrive
// while a probe runs share its answer, so a flood of either costs one probe
// at a time. There is no goroutine to own: readiness and scrapes drive it.
type Usable struct {
	store  *Store
	name   string // the probe key's last segment: this host's name
	logger *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	lastLog time.Time    // of the last error line
	running *usableProbe // the probe under way, nil when none
	at      time.Time    // when the last probe ended; zero before the first
	last    error        // its answer
}

// usableProbe is one probe's answer, ready when done is closed.
type usableProbe struct {
	done chan struct{}
	err  error
}

// NewUsable probes store under this host's name.
func NewUsable(store *Store, logger *slog.Logger) *Usable {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "unknown-host"
	}
	return &Usable{store: store, name: name, logger: logger, now: time.Now}
}

// Check runs the probe, or waits for the one already under way. A failure
// is logged at error, with its reason, at most once per UsableLogEvery;
// without REDIS_URL there is nothing to log (startup warned once). On a
// cluster the error is a *ShardsError when some primaries work and others
// do not.
func (p *Usable) Check(ctx context.Context) error {
	p.mu.Lock()
	if pr := p.running; pr != nil {
		p.mu.Unlock()
		select {
		case <-pr.done:
			return pr.err
		case <-ctx.Done():
			return fmt.Errorf("wait for the claim probe under way: %w", ctx.Err())
		}
	}
	pr := &usableProbe{done: make(chan struct{})}
	p.running = pr
	p.mu.Unlock()

	// Shared with whoever waits: the caller going away must not fail it
	// for the others. The probe bounds itself by REDIS_TIMEOUT.
	err := p.store.Probe(context.WithoutCancel(ctx), p.name)
	p.mu.Lock()
	pr.err, p.running, p.at, p.last = err, nil, p.now(), err
	due := err != nil && !errors.Is(err, ErrNoRedis) && p.now().Sub(p.lastLog) >= UsableLogEvery
	if due {
		p.lastLog = p.now()
	}
	p.mu.Unlock()
	close(pr.done)
	if due {
		p.logger.Error("claim store unusable: deliveries run degraded (fail open) or are refused (fail closed) until a claim works",
			"err", err, "probe_key", p.store.ProbeKey(p.name))
	}
	return err
}

// recent is the last probe's answer while it is under UsableFresh old, else
// a probe's (Check).
func (p *Usable) recent(ctx context.Context) error {
	p.mu.Lock()
	if p.running == nil && !p.at.IsZero() && p.now().Sub(p.at) < UsableFresh {
		err := p.last
		p.mu.Unlock()
		return err
	}
	p.mu.Unlock()
	return p.Check(ctx)
}

// Gauge is webhook_claim_store_usable: the last probe's answer, probed
// anew at a scrape when it is UsableFresh old.
func (p *Usable) Gauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "webhook_claim_store_usable",
		Help: "1 when the claim script runs on this replica's probe keys under REDIS_KEY_PREFIX (on a cluster, one in every primary's slots; probed by readiness, and by a scrape when the last probe is over 5 s old), 0 when it fails on any or REDIS_URL is empty.",
	}, func() float64 {
		if p.recent(context.Background()) != nil {
			return 0
		}
		return 1
	})
}
