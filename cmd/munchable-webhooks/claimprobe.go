package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

// claimProbeLogEvery spaces the error lines of a failing probe: readiness
// and every scrape probe, and an operator needs the reason, not a flood.
const claimProbeLogEvery = time.Minute

// claimProbe tells readiness and the webhook_claim_store_usable gauge
// whether a claim works now: it runs the claim script on this host's probe
// key (claim.Store.Probe), on every call, so the answer is never older than
// the question. There is no goroutine to own: readiness and scrapes drive
// it.
type claimProbe struct {
	store  *claim.Store
	name   string // the probe key's last segment: this host's name
	logger *slog.Logger

	mu      sync.Mutex
	lastLog time.Time // of the last error line
}

func newClaimProbe(store *claim.Store, logger *slog.Logger) *claimProbe {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "unknown-host"
	}
	return &claimProbe{store: store, name: name, logger: logger}
}

// check runs the probe. A failure is logged at error, with its reason, at
// most once per claimProbeLogEvery; without REDIS_URL there is nothing to
// log (startup warned once).
func (p *claimProbe) check(ctx context.Context) error {
	err := p.store.Probe(ctx, p.name)
	if err == nil || errors.Is(err, claim.ErrNoRedis) {
		return err
	}
	p.mu.Lock()
	due := time.Since(p.lastLog) >= claimProbeLogEvery
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

// gauge is webhook_claim_store_usable, probed at each scrape.
func (p *claimProbe) gauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "webhook_claim_store_usable",
		Help: "1 when the claim script runs on this replica's probe key under REDIS_KEY_PREFIX (probed at each scrape), 0 when it fails or REDIS_URL is empty.",
	}, func() float64 {
		// The probe bounds itself by REDIS_TIMEOUT.
		if p.check(context.Background()) != nil {
			return 0
		}
		return 1
	})
}
