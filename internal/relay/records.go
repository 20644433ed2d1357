package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// storedChange is a change as relay_deliveries keeps it: the feed's row
// without its cursor (a position, not part of the change).
type storedChange struct {
	ID               int64           `json:"id"`
	At               time.Time       `json:"at"`
	Kind             string          `json:"kind"`
	Subject          string          `json:"subject"`
	StripeCustomerID *string         `json:"stripe_customer_id"`
	EventID          *string         `json:"event_id"`
	Before           json.RawMessage `json:"before"`
	After            json.RawMessage `json:"after"`
	// Traceparent is the change's (ledger.Change), so that a retry, by
	// the schedule or by hand, continues the same trace.
	Traceparent string `json:"traceparent,omitempty"`
}

func marshalChange(ch ledger.Change) ([]byte, error) {
	return json.Marshal(storedChange{ch.ID, ch.At, ch.Kind, ch.Subject, ch.StripeCustomerID, ch.EventID, ch.Before, ch.After, ch.Traceparent})
}

func unmarshalChange(b []byte) (ledger.Change, error) {
	var s storedChange
	if err := json.Unmarshal(b, &s); err != nil {
		return ledger.Change{}, fmt.Errorf("stored change: %w", err)
	}
	return ledger.Change{ID: s.ID, At: s.At, Kind: s.Kind, Subject: s.Subject,
		StripeCustomerID: s.StripeCustomerID, EventID: s.EventID, Before: s.Before, After: s.After,
		Traceparent: s.Traceparent}, nil
}

// Delivery is one row of relay_deliveries, as relay list prints it.
type Delivery struct {
	Consumer      string     `json:"consumer"`
	ChangeID      int64      `json:"change_id"`
	Subject       string     `json:"subject"`
	State         State      `json:"state"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	LastError     *string    `json:"last_error"`
	Result        *string    `json:"result"`
	DeliveredAt   *time.Time `json:"delivered_at"`
	CreatedAt     time.Time  `json:"created_at"`
}

const deliveryColumns = `consumer, change_id, subject, state, attempts, next_attempt_at, last_error, result, delivered_at, created_at`

func scanDelivery(row pgx.CollectableRow) (Delivery, error) {
	var d Delivery
	err := row.Scan(&d.Consumer, &d.ChangeID, &d.Subject, &d.State, &d.Attempts, &d.NextAttemptAt,
		&d.LastError, &d.Result, &d.DeliveredAt, &d.CreatedAt)
	return d, err
}

// listSQL: $1 and $2 are NULL for any consumer, any state.
const listSQL = `SELECT ` + deliveryColumns + ` FROM relay_deliveries
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR state = $2)
ORDER BY consumer, change_id`

// List calls each for every delivery of consumer in state (each "" for
// any), by consumer and change.
func List(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, consumer string, state State, each func(Delivery) error) error {
	rows, err := q.Query(ctx, listSQL, nullable(consumer), nullable(string(state)))
	if err != nil {
		return fmt.Errorf("list deliveries: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return fmt.Errorf("list deliveries: %w", err)
		}
		if err := each(d); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list deliveries: %w", err)
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (r *Relay) get(ctx context.Context, consumer string, changeID int64) (Delivery, error) {
	rows, err := r.pool.Query(ctx, getSQL, consumer, changeID)
	if err != nil {
		return Delivery{}, fmt.Errorf("delivery %s %d: %w", consumer, changeID, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDelivery)
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, fmt.Errorf("delivery %s %d: %w", consumer, changeID, ErrNoDelivery)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("delivery %s %d: %w", consumer, changeID, err)
	}
	return d, nil
}

// metrics are the relay's; every replica exports them from 0.
type metrics struct {
	deliveries    *prometheus.CounterVec
	gaps          *prometheus.CounterVec
	oldestPending *prometheus.GaugeVec
	dead          *prometheus.GaugeVec
	horizonLag    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, consumers []string) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_deliveries_total",
			Help: "Delivery attempts the relay recorded, by consumer and outcome (delivered, failed, dead, skipped).",
		}, []string{"consumer", "outcome"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_gaps_total",
			Help: "Times a consumer's cursor was older than the oldest change kept: retention deleted changes it had not passed.",
		}, []string{"consumer"}),
		oldestPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_oldest_pending_seconds",
			Help: "Age of the consumer's oldest delivery not yet delivered, dead or skipped (0: none).",
		}, []string{"consumer"}),
		dead: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_dead_deliveries",
			Help: "Deliveries of the consumer that are dead: given up on until relay retry runs them again.",
		}, []string{"consumer"}),
		horizonLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "changes_horizon_lag_seconds",
			Help: "How long the change feed's read horizon has been held back by one open transaction (0: not held).",
		}),
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	reg.MustRegister(m.deliveries, m.gaps, m.oldestPending, m.dead, m.horizonLag)
	for _, c := range consumers {
		for _, s := range []State{Delivered, Failed, Dead, Skipped} {
			m.deliveries.WithLabelValues(c, string(s))
		}
		m.gaps.WithLabelValues(c)
		m.oldestPending.WithLabelValues(c)
		m.dead.WithLabelValues(c)
	}
	return m
}

// oldestSQL is the age of each consumer's oldest open delivery, from when
// the relay took it, and how many of its deliveries are dead (a count of
// relay_deliveries_state's entries).
const oldestSQL = `
SELECT c, coalesce(extract(epoch FROM now() - min(d.created_at)), 0)::float8,
    (SELECT count(*) FROM relay_deliveries x WHERE x.consumer = c AND x.state = 'dead')::float8
FROM unnest($1::text[]) c
LEFT JOIN relay_deliveries d ON d.consumer = c AND d.state IN ('pending', 'failed')
GROUP BY c`

// Observe sets the relay's gauges every interval until ctx ends. Every
// replica runs it, leader or not, so the gauges never depend on which one
// is scraped.
func (r *Relay) Observe(ctx context.Context, interval time.Duration) {
	var watch ledger.HorizonWatch
	for {
		if err := r.observe(ctx, &watch); err != nil && ctx.Err() == nil {
			r.logger.Warn("relay gauges not updated", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (r *Relay) observe(ctx context.Context, watch *ledger.HorizonWatch) error {
	lag, err := watch.Sample(ctx, r.pool, r.now())
	if err != nil {
		return err
	}
	r.metrics.horizonLag.Set(lag.Seconds())
	rows, err := r.pool.Query(ctx, oldestSQL, r.names())
	if err != nil {
		return fmt.Errorf("oldest pending: %w", err)
	}
	var name string
	var age, dead float64
	_, err = pgx.ForEachRow(rows, []any{&name, &age, &dead}, func() error {
		r.metrics.oldestPending.WithLabelValues(name).Set(age)
		r.metrics.dead.WithLabelValues(name).Set(dead)
		return nil
	})
	if err != nil {
		return fmt.Errorf("oldest pending: %w", err)
	}
	return nil
}
