// Package entitlements keeps what each Stripe subscription entitles its
// customer to, moved only forward in Stripe event time.
package entitlements

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Entitlement is one subscription's state as an event reports it.
type Entitlement struct {
	SubscriptionID    string
	CustomerID        string
	Status            string
	PriceID           string    // "" when the subscription has no priced item
	CurrentPeriodEnd  time.Time // zero when unknown
	CancelAtPeriodEnd bool
}

// Event identifies the Stripe event that reported an Entitlement.
type Event struct {
	ID      string
	Created time.Time // Stripe's created: one-second resolution
	// PreviousStatus is data.previous_attributes.status, "" when the event
	// did not change the status.
	PreviousStatus string
}

// Store writes entitlements to Postgres.
type Store struct {
	pool  *pgxpool.Pool
	stale prometheus.Counter
}

// NewStore returns a Store on pool. A nil reg leaves its metric
// unregistered.
func NewStore(pool *pgxpool.Pool, reg prometheus.Registerer) *Store {
	stale := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "entitlements_stale_events_total",
		Help: "Subscription events the event-time guard refused (older, tied without succession, or after a terminal status).",
	})
	if reg != nil {
		reg.MustRegister(stale)
	}
	return &Store{pool: pool, stale: stale}
}

// ApplySQL is the statement Apply runs, for tools/bench to run under
// pgbench as the database's ceiling: the compiler sees the dependency.
const ApplySQL = applySQL

// applySQL is the whole guard in one statement, so no concurrent delivery
// can slip between a read and a write. The stored row is replaced only when:
//   - the incoming event is the one that wrote it (a replay rewrites the
//     same state, and reports success rather than staleness); or
//   - the stored status is not terminal (Stripe never revives a canceled or
//     incomplete_expired subscription), and
//   - the event is newer, or, since created has one-second resolution, it
//     shares the stored event's second and is its successor: its
//     previous_attributes.status is the stored status.
const applySQL = `
INSERT INTO entitlements AS e (
    stripe_subscription_id, stripe_customer_id, status, price_id,
    current_period_end, cancel_at_period_end, last_event_id,
    last_event_created, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())
ON CONFLICT (stripe_subscription_id) DO UPDATE SET
    stripe_customer_id   = EXCLUDED.stripe_customer_id,
    status               = EXCLUDED.status,
    price_id             = EXCLUDED.price_id,
    current_period_end   = EXCLUDED.current_period_end,
    cancel_at_period_end = EXCLUDED.cancel_at_period_end,
    last_event_id        = EXCLUDED.last_event_id,
    last_event_created   = EXCLUDED.last_event_created,
    updated_at           = EXCLUDED.updated_at
WHERE e.last_event_id = EXCLUDED.last_event_id
   OR (e.status NOT IN ('canceled', 'incomplete_expired')
       AND (e.last_event_created < EXCLUDED.last_event_created
            OR (e.last_event_created = EXCLUDED.last_event_created
                AND e.status = $9::text)))`

// Apply writes ent as reported by ev unless the guard refuses it, and
// reports whether it was written. A refusal is not an error: the stored
// state is newer, and the event is acknowledged.
func (s *Store) Apply(ctx context.Context, ent Entitlement, ev Event) (bool, error) {
	tag, err := s.pool.Exec(ctx, applySQL,
		ent.SubscriptionID, ent.CustomerID, ent.Status, nullString(ent.PriceID),
		nullTime(ent.CurrentPeriodEnd), ent.CancelAtPeriodEnd, ev.ID,
		ev.Created, nullString(ev.PreviousStatus))
	if err != nil {
		return false, fmt.Errorf("apply %s to %s: %w", ev.ID, ent.SubscriptionID, err)
	}
	if tag.RowsAffected() == 0 {
		s.stale.Inc()
		return false, nil
	}
	return true, nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
