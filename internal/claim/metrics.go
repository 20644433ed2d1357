package claim

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	deliveries      *prometheus.CounterVec
	rejections      *prometheus.CounterVec
	degraded        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	claimAge        *prometheus.HistogramVec
	mismatch        *prometheus.CounterVec
	confirmFailures *prometheus.CounterVec
	poison          *prometheus.CounterVec
}

// newMetrics creates the flow's metrics and registers them on reg, unless
// reg is nil.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_deliveries_total",
			Help: "Webhook deliveries by provider and outcome (rejected: signature or timestamp refused).",
		}, []string{"provider", "outcome"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_rejections_total",
			Help: "Webhook deliveries refused before the claim, by reason.",
		}, []string{"provider", "reason"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_claim_degraded_total",
			Help: "Deliveries that met no working claim store (Redis missing, failing or slow).",
		}, []string{"provider", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "webhook_handler_duration_seconds",
			Help:    "Time spent applying a delivery's effect.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"provider"}),
		claimAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "webhook_claim_age_seconds",
			Help: "Age of the processing claim a retry met (answered 409): how long deliveries hold claims, and how stuck ones look.",
			// Up to the default processing TTL (120 s); a claim older than the
			// handler deadline (30 s) has outlived its handler.
			Buckets: []float64{.1, .5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120},
		}, []string{"provider"}),
		mismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_id_body_mismatch_total",
			Help: "Deliveries whose event id was claimed before with a different body.",
		}, []string{"provider"}),
		confirmFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_claim_confirm_failures_total",
			Help: "Effects committed whose done marker could not be written.",
		}, []string{"provider"}),
		poison: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_poison_events_total",
			Help: "Events that failed POISON_AFTER attempts (each counted once).",
		}, []string{"provider"}),
	}
	if reg != nil {
		reg.MustRegister(m.deliveries, m.rejections, m.degraded, m.duration, m.claimAge, m.mismatch, m.confirmFailures, m.poison)
	}
	return m
}

// init creates every series of a provider at zero, so that rate() and
// alerts see the first increment.
func (m *metrics) init(provider string) {
	for _, o := range outcomes {
		m.deliveries.WithLabelValues(provider, string(o))
	}
	for _, r := range rejectionReasons {
		m.rejections.WithLabelValues(provider, r)
	}
	m.degraded.WithLabelValues(provider, reasonNoRedis)
	m.degraded.WithLabelValues(provider, reasonRedisError)
	m.duration.WithLabelValues(provider)
	m.claimAge.WithLabelValues(provider)
	m.mismatch.WithLabelValues(provider)
	m.confirmFailures.WithLabelValues(provider)
	m.poison.WithLabelValues(provider)
}
