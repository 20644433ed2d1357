// Package sweep runs what each provider produced since the last pass
// through the same claim and handler as a webhook delivery, on a schedule,
// one replica at a time (internal/leader): a delivery the webhooks missed
// lands within one interval with nobody acting. A swept item that no
// webhook had delivered is counted as recovered: it means the webhooks are
// failing, and someone should look. The provider's own part, listing and
// running each item, is a Pass of the package that owns that provider.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/leader"
)

// Counts is what one pass did.
type Counts struct {
	// Listed items of the window; Recovered those no webhook had
	// delivered; Delivered those a webhook had (one claim or queue
	// lookup each, nothing else).
	Listed, Recovered, Delivered int
	// Stopped is why the pass stopped before the end of its window, ""
	// when it reached it.
	Stopped Stop
}

// Stop is why a pass stopped listing before its window's end, spelled as
// the webhook_sweep_stopped_total reason label. A provider's list that
// never ends (has_more forever, the same page again, dates that do not
// parse) must not hold the pass, or the leader, for ever.
type Stop string

const (
	StopMaxPages Stop = "max_pages" // SWEEP_MAX_PAGES pages read
	StopPageSeen Stop = "page_seen" // a page this pass had already read
	StopBadDate  Stop = "bad_date"  // an item whose creation time does not parse
)

// ErrStopped is the error of a pass that stopped before its window's end:
// what it did not list is listed again by the next pass.
var ErrStopped = errors.New("sweep stopped before the end of its window")

// Pass lists a provider's items created at or after from and runs each
// through the claim, as a webhook delivery of it would run.
type Pass func(ctx context.Context, from time.Time) (Counts, error)

// Source is one provider's sweep.
type Source struct {
	Provider string // the provider label: stripe, resend
	Pass     Pass
	// Horizon is how long the provider keeps what a pass lists (Stripe:
	// 30 days of events); 0 when it says no such thing.
	Horizon time.Duration
}

// Metrics are the sweeps' metrics, one series per provider.
type Metrics struct {
	recovered   *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	interval    *prometheus.GaugeVec
	stopped     *prometheus.CounterVec
}

// NewMetrics registers the sweeps' metrics on reg, with a series for each
// provider, swept or not: a provider's interval stays 0 until Job sweeps
// it, and the staleness alert reads only swept providers.
func NewMetrics(reg prometheus.Registerer, providers ...string) *Metrics {
	m := &Metrics{
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_sweep_recovered_total",
			Help: "Items a sweep found that no webhook had delivered, run through the claim by the sweep: the provider's webhooks are failing.",
		}, []string{"provider"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "webhook_sweep_last_success_timestamp_seconds",
			Help: "When the provider's last successful sweep ended (any replica's), in Unix seconds; 0 before the first.",
		}, []string{"provider"}),
		interval: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "webhook_sweep_interval_seconds",
			Help: "SWEEP_INTERVAL in seconds for each swept provider; 0 for a provider not swept.",
		}, []string{"provider"}),
		stopped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_sweep_stopped_total",
			Help: "Sweep passes that stopped before the end of their window, by reason (max_pages, page_seen, bad_date).",
		}, []string{"provider", "reason"}),
	}
	for _, p := range providers {
		m.recovered.WithLabelValues(p)
		m.lastSuccess.WithLabelValues(p)
		m.interval.WithLabelValues(p)
		for _, r := range []Stop{StopMaxPages, StopPageSeen, StopBadDate} { // from 0
			m.stopped.WithLabelValues(p, string(r))
		}
	}
	reg.MustRegister(m.recovered, m.lastSuccess, m.interval, m.stopped)
	return m
}

// Config is how sources are swept.
type Config struct {
	Interval time.Duration
	// Overlap is how far before the last pass's start a pass lists again,
	// for items the provider lists late.
	Overlap time.Duration
	// HorizonMargin: a position older than a source's horizon less this
	// is warned about, while the gap can still be swept.
	HorizonMargin time.Duration
	Metrics       *Metrics
	Logger        *slog.Logger
}

// Job is src's sweep as a scheduled job named sweep_<provider>. Its first
// pass ever lists one interval back (plus the overlap); each later one
// from the last successful pass's start, less the overlap.
func Job(src Source, cfg Config) leader.Job {
	m := cfg.Metrics
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m.recovered.WithLabelValues(src.Provider) // exported from 0
	m.interval.WithLabelValues(src.Provider).Set(cfg.Interval.Seconds())
	logger := cfg.Logger.With("job", "sweep", "provider", src.Provider)
	return leader.Job{
		Name:     "sweep_" + src.Provider,
		Interval: cfg.Interval,
		Run: func(ctx context.Context, since time.Time) (any, error) {
			from := Window(since, time.Now(), cfg.Interval, cfg.Overlap)
			if src.Horizon > 0 {
				from = checkHorizon(logger, src, from, cfg.HorizonMargin)
			}
			start := time.Now()
			n, err := src.Pass(ctx, from)
			m.recovered.WithLabelValues(src.Provider).Add(float64(n.Recovered))
			if n.Stopped != "" {
				m.stopped.WithLabelValues(src.Provider, string(n.Stopped)).Inc()
				logger.Warn("sweep stopped before the end of its window: the provider's list did not end as it should; the next pass lists it again",
					"reason", string(n.Stopped), "listed", n.Listed, "from", from)
			}
			if n.Recovered > 0 {
				logger.Warn("sweep recovered items no webhook delivered: check the provider's webhook deliveries and the endpoint's secret",
					"recovered", n.Recovered, "listed", n.Listed)
			}
			if err != nil {
				return nil, fmt.Errorf("sweep %s from %s: %w", src.Provider, from.Format(time.RFC3339), err)
			}
			logger.Info("sweep done", "from", from, "listed", n.Listed, "recovered", n.Recovered,
				"delivered", n.Delivered, "duration_ms", time.Since(start).Milliseconds())
			return n, nil
		},
		Succeeded: func(at time.Time, _ []byte) {
			m.lastSuccess.WithLabelValues(src.Provider).Set(float64(at.Unix()))
		},
	}
}

// Window is where a pass begins: the last successful pass's start less
// the overlap, or, with none yet, one interval and the overlap back.
func Window(since, now time.Time, interval, overlap time.Duration) time.Time {
	if since.IsZero() {
		return now.Add(-interval - overlap)
	}
	return since.Add(-overlap)
}

// checkHorizon warns when from is near the provider's horizon, and moves
// it inside the horizon when it is past it: what lies beyond is gone, and
// only a full resync (stripe sync) can bring the tables back.
func checkHorizon(logger *slog.Logger, src Source, from time.Time, margin time.Duration) time.Time {
	age := time.Since(from)
	switch {
	case age >= src.Horizon:
		inside := time.Now().Add(-src.Horizon + time.Hour)
		logger.Error("sweep position is past the provider's horizon: what happened before it cannot be swept; run stripe sync, then stripe verify",
			"position", from, "horizon_hours", src.Horizon.Hours(), "sweeping_from", inside)
		return inside
	case age >= src.Horizon-margin:
		logger.Warn("sweep position is near the provider's horizon: fix the sweep before what it has not swept becomes unrecoverable",
			"position", from, "horizon_hours", src.Horizon.Hours())
	}
	return from
}
