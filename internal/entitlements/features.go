package entitlements

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
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

// featuresSQL replaces a customer's features under the same guard as a
// subscription (see applySQL), without terminal states: a customer's
// features can always change again.
const featuresSQL = `
WITH up AS (
    INSERT INTO customer_features AS f (stripe_customer_id, lookup_keys,
        complete, last_event_id, last_event_created, updated_at)
    VALUES ($1, $2, $3, $4, $5, now())
    ON CONFLICT (stripe_customer_id) DO UPDATE SET
        lookup_keys        = EXCLUDED.lookup_keys,
        complete           = EXCLUDED.complete,
        last_event_id      = EXCLUDED.last_event_id,
        last_event_created = EXCLUDED.last_event_created,
        updated_at         = EXCLUDED.updated_at
    WHERE f.last_event_id = EXCLUDED.last_event_id
       OR f.last_event_created < EXCLUDED.last_event_created
       OR f.last_event_id = $6::text
    RETURNING 1
)
SELECT EXISTS (SELECT FROM up), s.last_event_id, s.last_event_created
FROM (SELECT) AS one LEFT JOIN customer_features s ON s.stripe_customer_id = $1`

type features struct {
	customerID string
	keys       []string
	complete   bool
}

func writeFeatures(ctx context.Context, q querier, f features, eventID string, at time.Time, successorOf string) (written, error) {
	var w written
	err := q.QueryRow(ctx, featuresSQL, f.customerID, sortedKeys(f.keys), f.complete, eventID, at, nullString(successorOf)).
		Scan(&w.applied, &w.storedID, &w.storedCreated)
	if err != nil {
		return written{}, fmt.Errorf("write features of %s from %s: %w", f.customerID, eventID, err)
	}
	return w, nil
}

// sortedKeys is the stored form of a feature list: sorted, distinct, and
// never null.
func sortedKeys(keys []string) []string {
	out := append([]string{}, keys...)
	slices.Sort(out)
	return slices.Compact(out)
}

// ApplyFeatureEvent replaces the customer's features with lookupKeys as
// reported by ev, guarded by event time per customer. complete is false
// when the event's list was truncated and could not be fetched in full.
// list, when not nil, settles an unordered same-second event by listing
// the customer's active entitlements; nil keeps the stored row and counts
// it.
func (s *Store) ApplyFeatureEvent(ctx context.Context, customerID string, lookupKeys []string, complete bool, ev FeatureEvent, list ListFeatures) (Result, error) {
	f := features{customerID, lookupKeys, complete}
	w, err := writeFeatures(ctx, s.pool, f, ev.ID, ev.Created, "")
	if err != nil {
		return Result{}, err
	}
	if w.applied {
		return Result{Applied: true, StoredEventID: deref(w.storedID)}, nil
	}
	if w.storedCreated != nil && w.storedCreated.After(ev.Created) {
		s.stale.Inc()
		return Result{Stale: true, StoredEventID: deref(w.storedID)}, nil
	}
	return s.featuresTie(ctx, f, ev, list)
}

const readFeaturesSQL = `
SELECT lookup_keys, complete, last_event_id, last_event_created
FROM customer_features WHERE stripe_customer_id = $1
FOR UPDATE`

// featuresTie is applyTie for a customer's features.
func (s *Store) featuresTie(ctx context.Context, f features, ev FeatureEvent, list ListFeatures) (Result, error) {
	return s.settle(ctx, ev.ID, func(ctx context.Context, tx pgx.Tx) (tie, error) {
		var st features
		var storedID string
		var storedAt time.Time
		err := tx.QueryRow(ctx, readFeaturesSQL, f.customerID).Scan(&st.keys, &st.complete, &storedID, &storedAt)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return tie{}, fmt.Errorf("read features of %s: %w", f.customerID, err)
		}
		found := err == nil
		t := tie{verdict: admit, result: Result{StoredEventID: storedID}}
		t.admit = func(ctx context.Context, tx pgx.Tx) error {
			_, err := writeFeatures(ctx, tx, f, ev.ID, ev.Created, storedID)
			return err
		}
		if list != nil {
			t.revalidate = func(ctx context.Context, tx pgx.Tx) error {
				keys, err := list(ctx, f.customerID)
				if err != nil {
					return fmt.Errorf("revalidate features of %s for %s: %w", f.customerID, ev.ID, err)
				}
				_, err = writeFeatures(ctx, tx, features{f.customerID, keys, true}, revalidatedID(ev.ID), ev.Created, storedID)
				return err
			}
		}
		if found {
			var before func() ([]Field, error)
			if ev.HasPrevious {
				before = func() ([]Field, error) {
					return featureDiff(st, features{f.customerID, ev.Previous, st.complete}), nil
				}
			}
			t.verdict, t.result.Differs = order(storedID == ev.ID, false, storedAt, ev.Created, false,
				func() []Field { return featureDiff(st, f) }, before)
		}
		return t, nil
	})
}

// featureDiff names the stored fields on which two feature rows differ.
func featureDiff(a, b features) []Field {
	var out []Field
	if !slices.Equal(sortedKeys(a.keys), sortedKeys(b.keys)) {
		out = append(out, "lookup_keys")
	}
	if a.complete != b.complete {
		out = append(out, "complete")
	}
	return out
}

// ApplyFeatures stores a snapshot of the customer's active entitlements
// read from Stripe at at (stripe sync), with ApplySnapshot's tie rule: a
// stored event from at's second or later is kept. Like a subscription
// snapshot, the row records the snapshot as its event.
func (s *Store) ApplyFeatures(ctx context.Context, customerID string, lookupKeys []string, complete bool, at time.Time) (Result, error) {
	at = at.UTC().Truncate(time.Second)
	w, err := writeFeatures(ctx, s.pool, features{customerID, lookupKeys, complete}, snapshotID(at), at, "")
	if err != nil {
		return Result{}, err
	}
	return s.snapshotResult(w), nil
}
