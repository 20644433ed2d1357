// Package entitlements keeps what Stripe says each customer may use: the
// subscriptions and their items, the customer's active features, and the
// checkout sessions that link an app's user to a customer. Each row moves
// only forward in Stripe event time.
package entitlements

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Event identifies the Stripe event that reported a Subscription.
type Event struct {
	ID      string
	Created time.Time // Stripe's created: one-second resolution
	// Creation marks a customer.subscription.created event, which never
	// succeeds another.
	Creation bool
	// Before returns the subscription as it was just before the event:
	// the event's object with data.previous_attributes laid over it. Only a
	// same-second tie calls it. Nil: unknown, so never a successor.
	Before func() (Subscription, error)
}

// Fetch reads a subscription from Stripe, to settle an unordered event.
type Fetch func(ctx context.Context, subscriptionID string) (Subscription, error)

// Store writes entitlements to Postgres.
type Store struct {
	pool      *pgxpool.Pool
	stale     prometheus.Counter
	unordered prometheus.Counter
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool, reg prometheus.Registerer) *Store {
	stale := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "entitlements_stale_events_total",
		Help: "Events the event-time guard refused (older than the stored one, or after a terminal status).",
	})
	unordered := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "entitlements_unordered_events_total",
		Help: "Same-second events neither successor nor provably older, kept out because no STRIPE_API_KEY was set to settle them.",
	})
	reg.MustRegister(stale, unordered)
	return &Store{pool: pool, stale: stale, unordered: unordered}
}

var errTODO = errors.New("not implemented yet")

// Apply stores sub as reported by ev, unless the guard refuses it. fetch,
// when not nil, settles an unordered same-second event by reading the
// subscription from Stripe; nil keeps the stored row and counts it.
func (s *Store) Apply(ctx context.Context, sub Subscription, ev Event, fetch Fetch) (Result, error) {
	return Result{}, errTODO
}

// ApplySnapshot stores sub as read from Stripe's API by a listing that
// began at takenAt. A stored event from takenAt's second or later is kept:
// it may postdate the read, while anything older is in the snapshot.
func (s *Store) ApplySnapshot(ctx context.Context, sub Subscription, takenAt time.Time) (Result, error) {
	return Result{}, errTODO
}
