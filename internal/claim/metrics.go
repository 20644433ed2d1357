package claim

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	deliveries      *prometheus.CounterVec
	degraded        *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	mismatch        *prometheus.CounterVec
	confirmFailures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_deliveries_total",
			Help: "Webhook deliveries by provider and outcome.",
		}, []string{"provider", "outcome"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_claim_degraded_total",
			Help: "Deliveries that met no working claim store (Redis missing, failing or slow).",
		}, []string{"provider", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "webhook_handler_duration_seconds",
			Help:    "Time spent applying a delivery's effect.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"provider"}),
		mismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_id_body_mismatch_total",
			Help: "Deliveries whose event id was claimed before with a different body.",
		}, []string{"provider"}),
		confirmFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_claim_confirm_failures_total",
			Help: "Effects committed whose done marker could not be written.",
		}, []string{"provider"}),
	}
	reg.MustRegister(m.deliveries, m.degraded, m.duration, m.mismatch, m.confirmFailures)
	return m
}

// init creates every series of a provider at zero, so that rate() and
// alerts see the first increment.
func (m *metrics) init(provider string) {
	for _, r := range []Result{Processed, Duplicate, Progressing, Failed, Unavailable, Rejected, Ignored} {
		m.deliveries.WithLabelValues(provider, string(r))
	}
	m.degraded.WithLabelValues(provider, ReasonNoRedis)
	m.degraded.WithLabelValues(provider, ReasonRedisError)
	m.duration.WithLabelValues(provider)
	m.mismatch.WithLabelValues(provider)
	m.confirmFailures.WithLabelValues(provider)
}
