package stripesync

import (
	"context"
	"encoding/json"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/leader"
)

// VerifyMetrics are the gauges of the service's scheduled verify.
type VerifyMetrics struct {
	drift       *prometheus.GaugeVec
	lastSuccess prometheus.Gauge
}

// NewVerifyMetrics registers the scheduled verify's gauges on reg, with
// its interval (0: off), which the staleness alert reads.
func NewVerifyMetrics(reg prometheus.Registerer, interval time.Duration) *VerifyMetrics {
	m := &VerifyMetrics{
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stripe_drift_rows",
			Help: "Rows the last successful scheduled stripe verify found to differ from Stripe, by kind (subscription, subscription_items, customer_features).",
		}, []string{"kind"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stripe_verify_last_success_timestamp_seconds",
			Help: "When the last successful scheduled stripe verify ended (any replica's), in Unix seconds; 0 before the first.",
		}),
	}
	for _, k := range Kinds {
		m.drift.WithLabelValues(k)
	}
	every := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "stripe_verify_interval_seconds",
		Help: "VERIFY_INTERVAL in seconds; 0 when the scheduled verify is off (VERIFY_INTERVAL=0, or no STRIPE_API_KEY).",
	})
	every.Set(interval.Seconds())
	reg.MustRegister(m.drift, m.lastSuccess, every)
	return m
}

// VerifyJob is Verify as the service runs it on a schedule: without
// repair (a person decides that, with stripe verify --repair), its drift
// by kind kept with the run, so that every replica exports the last run's
// figures. cfg.Repair and cfg.Report are ignored; drift is logged as one
// warning.
func VerifyJob(cfg VerifyConfig, interval time.Duration, m *VerifyMetrics) leader.Job {
	cfg.Repair, cfg.Report = false, nil
	return leader.Job{
		Name:     "stripe_verify",
		Interval: interval,
		Run: func(ctx context.Context, _ time.Time) (any, error) {
			n, err := Verify(ctx, cfg)
			if err != nil {
				return nil, err
			}
			if n.Drifted() > 0 && cfg.Logger != nil {
				cfg.Logger.Warn("stripe verify found drift: run munchable-webhooks stripe verify to see the rows, --repair to mend them",
					"drifted", n.Drifted(), "summary", n.String())
			}
			return n.Drift, nil
		},
		Succeeded: func(at time.Time, result []byte) {
			m.lastSuccess.Set(float64(at.Unix()))
			var drift map[string]int
			_ = json.Unmarshal(result, &drift) // written by Run above
			for _, k := range Kinds {
				m.drift.WithLabelValues(k).Set(float64(drift[k]))
			}
		},
	}
}
