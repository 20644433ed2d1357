package claim

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// UsableLogEvery spaces the error lines of a failing probe: readiness and
// every scrape probe, and an operator needs the reason, not a flood.
const UsableLogEvery = time.Minute

// Usable tells readiness and the webhook_claim_store_usable gauge whether a
// claim works now: it runs the claim script on this host's probe keys
// (Store.Probe: every primary's, on a cluster), on every call, so the
// answer is never older than the question. There is no goroutine to own:
// readiness and scrapes drive it.
type Usable struct {
	store  *Store
	name   string // the probe key's last segment: this host's name
	logger *slog.Logger

	mu      sync.Mutex
	lastLog time.Time // of the last error line
}

// NewUsable probes store under this host's name.
func NewUsable(store *Store, logger *slog.Logger) *Usable {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "unknown-host"
	}
	return &Usable{store: store, name: name, logger: logger}
}

// Check runs the probe. A failure is logged at error, with its reason, at
// most once per UsableLogEvery; without REDIS_URL there is nothing to log
// (startup warned once). On a cluster the error is a *ShardsError when
// some primaries work and others do not.
func (p *Usable) Check(ctx context.Context) error {
	err := p.store.Probe(ctx, p.name)
	if err == nil || errors.Is(err, ErrNoRedis) {
		return err
	}
	p.mu.Lock()
	due := time.Since(p.lastLog) >= UsableLogEvery
	if due {
		p.lastLog = time.Now()
	}
	p.mu.Unlock()
	if due {
		p.logger.Error("claim store unusable: deliveries run degraded (fail open) or are refused (fail closed) until a claim works",
			"err", err, "probe_key", p.store.ProbeKey(p.name))
	}
	return err
}

// Gauge is webhook_claim_store_usable, probed at each scrape.
func (p *Usable) Gauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "webhook_claim_store_usable",
		Help: "1 when the claim script runs on this replica's probe keys under REDIS_KEY_PREFIX (on a cluster, one in every primary's slots; probed at each scrape), 0 when it fails on any or REDIS_URL is empty.",
	}, func() float64 {
		// The probe bounds itself by REDIS_TIMEOUT.
		if p.Check(context.Background()) != nil {
			return 0
		}
		return 1
	})
}
