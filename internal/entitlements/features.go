package entitlements

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// FeatureEvent is an entitlements.active_entitlement_summary.updated event.
type FeatureEvent struct {
	ID string
	// Type is the event's type, for its ledger row ("" for a test).
	Type    string
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
//
// The ledger and the feed ride along as in applySQL: $7 is the event behind
// the change, $8 and $9 the ledger row's event id and type (NULL: none).
// $10 is the keys the event says the customer had before it (NULL: it
// says nothing); with applySQL's gap rule, an admitted event whose $10 is
// not the stored list leaves gap_from (the stored keys; NULL for a new
// row) and gap_to ($10), which the feed does not follow.
const featuresSQL = `
WITH old(j) AS (
    SELECT to_jsonb(s) - '{updated_at,last_event_id,last_event_created,gap_from,gap_to}'::text[]
    FROM customer_features s WHERE s.stripe_customer_id = $1
), up AS (
    INSERT INTO customer_features AS f (stripe_customer_id, lookup_keys,
        complete, last_event_id, last_event_created, updated_at, gap_from, gap_to)
    VALUES ($1, $2, $3, $4, $5, now(), NULL, $10::text[])
    ON CONFLICT (stripe_customer_id) DO UPDATE SET
        lookup_keys        = EXCLUDED.lookup_keys,
        complete           = EXCLUDED.complete,
        last_event_id      = EXCLUDED.last_event_id,
        last_event_created = EXCLUDED.last_event_created,
        updated_at         = EXCLUDED.updated_at,
        gap_from           = CASE WHEN f.last_event_id = EXCLUDED.last_event_id THEN f.gap_from
                                  WHEN f.lookup_keys IS DISTINCT FROM EXCLUDED.gap_to
                                       AND EXCLUDED.gap_to IS NOT NULL THEN f.lookup_keys END,
        gap_to             = CASE WHEN f.last_event_id = EXCLUDED.last_event_id THEN f.gap_to
                                  WHEN f.lookup_keys IS DISTINCT FROM EXCLUDED.gap_to THEN EXCLUDED.gap_to END
    WHERE f.last_event_id = EXCLUDED.last_event_id
       OR f.last_event_created < EXCLUDED.last_event_created
       OR f.last_event_id = $6::text
    RETURNING f.*
), new(kind, subject, customer, event_id, j) AS (
    SELECT '` + ledger.KindCustomerFeatures + `', u.stripe_customer_id, u.stripe_customer_id, $7::text,
        to_jsonb(u) - '{updated_at,last_event_id,last_event_created,gap_from,gap_to}'::text[]
    FROM up u
), judged(provider, event_id, event_type, subject, outcome) AS (
    SELECT 'stripe', $8::text, $9::text, $1::text, CASE
        WHEN EXISTS (SELECT FROM up) THEN
            CASE WHEN s.last_event_id = $4 THEN 'unchanged' ELSE 'applied' END
        WHEN s.last_event_created > $5 THEN 'stale'
        END
    FROM (SELECT) AS one LEFT JOIN customer_features s ON s.stripe_customer_id = $1
),` + ledger.AppendCTE + `,` + ledger.RecordCTE + `
SELECT EXISTS (SELECT FROM up), s.last_event_id, s.last_event_created
FROM (SELECT) AS one LEFT JOIN customer_features s ON s.stripe_customer_id = $1`

// lockFeaturesSQL serialises the writes of one customer's features, as
// lockSQL does a subscription's: featuresSQL's snapshot, from which the
// feed's before is read, is then taken after the previous writer
// committed, and the feed's ids follow the commits.
const lockFeaturesSQL = `SELECT pg_advisory_xact_lock(hashtext('customer_features'), hashtext($1))`

// Features are a customer's active entitlements, by lookup key.
type Features struct {
	CustomerID string
	LookupKeys []string
	// Complete is false when the list was cut short and could not be
	// fetched in full.
	Complete bool
}

// writeFeatures runs featuresSQL after the customer's lock, in one batch
// (one round trip; one implicit transaction on the pool). cause and entry
// are write's; came is the keys the event says the customer had before
// it, nil when it says nothing.
func writeFeatures(ctx context.Context, q querier, f Features, eventID string, at time.Time, successorOf string, cause string, entry *ledger.Entry, came []string) (written, error) {
	var cameFrom []string // nil: NULL
	if came != nil {
		cameFrom = sortedKeys(came)
	}
	b := &pgx.Batch{}
	b.Queue(lockFeaturesSQL, f.CustomerID)
	b.Queue(featuresSQL, f.CustomerID, sortedKeys(f.LookupKeys), f.Complete, eventID, at,
		nullString(successorOf), cause, entryID(entry), entryType(entry), cameFrom)
	br := ledger.SendBatch(ctx, q, b)
	var w written
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&w.applied, &w.storedID, &w.storedCreated)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return written{}, fmt.Errorf("write features of %s from %s: %w", f.CustomerID, eventID, err)
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

// ApplyFeatures replaces the customer's features with f as reported by
// ev, guarded by event time per customer. list, when not nil, settles an
// unordered same-second event by listing the customer's active
// entitlements; nil keeps the stored row and counts it.
func (s *Store) ApplyFeatures(ctx context.Context, f Features, ev FeatureEvent, list ListFeatures) (Result, error) {
	entry := &ledger.Entry{Provider: provider, EventID: ev.ID, Type: ev.Type}
	w, err := writeFeatures(ctx, s.pool, f, ev.ID, ev.Created, "", ev.ID, entry, ev.cameFrom())
	if err != nil {
		return Result{}, err
	}
	if res, ok := s.fast(w, ev.ID, ev.Created); ok {
		return res, nil
	}
	return settle(ctx, s, featuresTie(f, ev, list))
}

const readFeaturesSQL = `
SELECT lookup_keys, complete, last_event_id, last_event_created, gap_from, gap_to
FROM customer_features WHERE stripe_customer_id = $1
FOR UPDATE`

// featuresTie is a feature event for settle. A customer's features have
// no terminal state: they can always change again.
func featuresTie(f Features, ev FeatureEvent, list ListFeatures) tie[Features] {
	t := tie[Features]{
		eventID: ev.ID,
		entry:   &ledger.Entry{Provider: provider, EventID: ev.ID, Type: ev.Type},
		subject: f.CustomerID,
		at:      ev.Created,
		read: func(ctx context.Context, tx pgx.Tx) (row[Features], bool, error) {
			// The customer's lock first, as every write of the row takes
			// it: before any write of this transaction (so its txid follows
			// the row's commit order, which the feed relies on), and before
			// the row lock (a writer holding the advisory lock and waiting
			// for the row would otherwise deadlock with this one).
			if _, err := tx.Exec(ctx, lockFeaturesSQL, f.CustomerID); err != nil {
				return row[Features]{}, false, fmt.Errorf("lock features of %s: %w", f.CustomerID, err)
			}
			st := row[Features]{state: Features{CustomerID: f.CustomerID}}
			var from, to *[]string
			err := tx.QueryRow(ctx, readFeaturesSQL, f.CustomerID).
				Scan(&st.state.LookupKeys, &st.state.Complete, &st.eventID, &st.storedAt, &from, &to)
			st.gapFrom, st.gapTo = keysState(f.CustomerID, from), keysState(f.CustomerID, to)
			if errors.Is(err, pgx.ErrNoRows) {
				return row[Features]{}, false, nil
			}
			if err != nil {
				return row[Features]{}, false, fmt.Errorf("read features of %s: %w", f.CustomerID, err)
			}
			return st, true, nil
		},
		after: func(stored Features) []Field { return featureDiff(stored, f) },
		state: f,
		// A gap is in the keys: completeness is not a change Stripe made.
		equal: func(a, b Features) bool { return slices.Equal(sortedKeys(a.LookupKeys), sortedKeys(b.LookupKeys)) },
		setGap: func(ctx context.Context, tx pgx.Tx, from, to *Features) error {
			var args [2][]string // nil: NULL
			for i, s := range []*Features{from, to} {
				if s != nil {
					args[i] = sortedKeys(s.LookupKeys)
				}
			}
			if _, err := tx.Exec(ctx, setFeaturesGapSQL, f.CustomerID, args[0], args[1]); err != nil {
				return fmt.Errorf("store the gap of features of %s: %w", f.CustomerID, err)
			}
			return nil
		},
		write: func(ctx context.Context, tx pgx.Tx, storedID string) error {
			_, err := writeFeatures(ctx, tx, f, ev.ID, ev.Created, storedID, ev.ID, nil, ev.cameFrom())
			return err
		},
	}
	if ev.HasPrevious {
		t.prior = func() (Features, error) {
			return Features{CustomerID: f.CustomerID, LookupKeys: ev.Previous, Complete: true}, nil
		}
		t.before = func(stored Features) ([]Field, error) {
			return featureDiff(stored, Features{CustomerID: f.CustomerID, LookupKeys: ev.Previous, Complete: stored.Complete}), nil
		}
	}
	if list != nil {
		t.fetch = func(ctx context.Context) (Features, error) {
			keys, err := list(ctx, f.CustomerID)
			if err != nil {
				return Features{}, fmt.Errorf("revalidate features of %s for %s: %w", f.CustomerID, ev.ID, err)
			}
			return Features{CustomerID: f.CustomerID, LookupKeys: keys, Complete: true}, nil
		}
		t.writeFetched = func(ctx context.Context, tx pgx.Tx, fetched Features, storedID string) error {
			_, err := writeFeatures(ctx, tx, fetched, revalidatedID(ev.ID), ev.Created, storedID, ev.ID, nil, nil)
			return err
		}
	}
	return t
}

// setFeaturesGapSQL stores a customer's features gap without touching
// the keys.
const setFeaturesGapSQL = `UPDATE customer_features SET gap_from = $2::text[], gap_to = $3::text[] WHERE stripe_customer_id = $1`

// keysState is a stored gap end as a feature row, nil for NULL.
func keysState(customer string, keys *[]string) *Features {
	if keys == nil {
		return nil
	}
	return &Features{CustomerID: customer, LookupKeys: *keys, Complete: true}
}

// cameFrom is the keys ev says the customer had before it, nil when it
// says nothing (never nil when it does: none is an empty list).
func (ev FeatureEvent) cameFrom() []string {
	if !ev.HasPrevious {
		return nil
	}
	return append([]string{}, ev.Previous...)
}

// featureDiff names the stored fields on which two feature rows differ.
func featureDiff(a, b Features) []Field {
	var out []Field
	if !slices.Equal(sortedKeys(a.LookupKeys), sortedKeys(b.LookupKeys)) {
		out = append(out, "lookup_keys")
	}
	if a.Complete != b.Complete {
		out = append(out, "complete")
	}
	return out
}

// SnapshotFeatures stores a snapshot of the customer's active
// entitlements read from Stripe at at (stripe sync), with
// SnapshotSubscription's tie rule: a stored event from at's second or
// later is kept. Like a subscription snapshot, the row records the
// snapshot as its event.
func (s *Store) SnapshotFeatures(ctx context.Context, f Features, at time.Time) (Result, error) {
	at = at.UTC().Truncate(time.Second)
	w, err := writeFeatures(ctx, s.pool, f, snapshotID(at), at, "", snapshotID(at), nil, nil)
	if err != nil {
		return Result{}, err
	}
	return s.snapshotResult(w), nil
}
