package entitlements

import (
	"context"
	"time"
)

// FeatureEvent is an entitlements.active_entitlement_summary.updated event.
type FeatureEvent struct {
	ID      string
	Created time.Time
	// Previous are the lookup keys data.previous_attributes.entitlements
	// named; HasPrevious is false when it named none.
	Previous    []string
	HasPrevious bool
}

// ListFeatures reads a customer's active entitlements (lookup keys) from
// Stripe: the full list, for a truncated or unordered summary.
type ListFeatures func(ctx context.Context, customerID string) ([]string, error)

// ApplyFeatureEvent replaces the customer's features with lookupKeys as
// reported by ev, guarded by event time per customer. complete is false
// when the event's list was truncated and could not be fetched in full.
func (s *Store) ApplyFeatureEvent(ctx context.Context, customerID string, lookupKeys []string, complete bool, ev FeatureEvent, list ListFeatures) (Result, error) {
	return Result{}, errTODO
}

// ApplyFeatures stores a snapshot of the customer's active entitlements
// read from Stripe at at (stripe sync). The same tie rule as
// ApplySnapshot: a stored event from at's second or later is kept.
// eventID is recorded as the row's last_event_id.
func (s *Store) ApplyFeatures(ctx context.Context, customerID string, lookupKeys []string, complete bool, at time.Time, eventID string) (Result, error) {
	return Result{}, errTODO
}
