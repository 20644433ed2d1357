package entitlements

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// CheckoutSession is a Checkout Session in the shape this service stores.
type CheckoutSession struct {
	ID                string
	ClientReferenceID string
	CustomerID        string
	SubscriptionID    string
	Mode              string
	Status            string // open, complete, expired
	PaymentStatus     string // paid, unpaid, no_payment_required
	CustomerEmail     string
	Metadata          map[string]string
}

// checkoutSQL upserts a session. complete and expired are terminal for
// status (https://docs.stripe.com/api/checkout/sessions/object#checkout_session_object-status):
// once stored, a later event cannot change it, while a newer event still
// moves payment_status (checkout.session.async_payment_succeeded turns a
// complete, unpaid session paid). A same-second event is admitted only
// when it moves the session forward: open to complete or expired, or
// unpaid to paid. Ids an event leaves null keep what an earlier one said.
// The last SELECT reads the row as it was before the statement, which
// tells a replay of the stored event from a new one.
//
// The ledger and the feed ride along as in applySQL: $12 and $13 are the
// ledger row's event id and type; the change's event is $10.
const checkoutSQL = `
WITH old(j) AS (
    SELECT to_jsonb(s) - '{updated_at,last_event_id,last_event_created}'::text[]
    FROM checkout_sessions s WHERE s.stripe_checkout_session_id = $1
), up AS (
INSERT INTO checkout_sessions AS c (stripe_checkout_session_id,
    client_reference_id, stripe_customer_id, stripe_subscription_id, mode,
    status, payment_status, customer_email, metadata, last_event_id,
    last_event_created, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
ON CONFLICT (stripe_checkout_session_id) DO UPDATE SET
    client_reference_id    = coalesce(EXCLUDED.client_reference_id, c.client_reference_id),
    stripe_customer_id     = coalesce(EXCLUDED.stripe_customer_id, c.stripe_customer_id),
    stripe_subscription_id = coalesce(EXCLUDED.stripe_subscription_id, c.stripe_subscription_id),
    mode                   = EXCLUDED.mode,
    status                 = CASE WHEN c.status IN ('complete', 'expired') THEN c.status ELSE EXCLUDED.status END,
    payment_status         = EXCLUDED.payment_status,
    customer_email         = coalesce(EXCLUDED.customer_email, c.customer_email),
    metadata               = EXCLUDED.metadata,
    last_event_id          = EXCLUDED.last_event_id,
    last_event_created     = EXCLUDED.last_event_created,
    updated_at             = EXCLUDED.updated_at
WHERE c.last_event_id = EXCLUDED.last_event_id
   OR c.last_event_created < EXCLUDED.last_event_created
   OR (c.last_event_created = EXCLUDED.last_event_created
       AND ((c.status = 'open' AND EXCLUDED.status <> 'open')
            OR (c.payment_status = 'unpaid' AND EXCLUDED.payment_status IN ('paid', 'no_payment_required'))))
RETURNING c.*
), new(kind, subject, customer, event_id, j) AS (
    SELECT '` + ledger.KindCheckoutSession + `', u.stripe_checkout_session_id, u.stripe_customer_id, $10::text,
        to_jsonb(u) - '{updated_at,last_event_id,last_event_created}'::text[]
    FROM up u
), judged(provider, event_id, event_type, subject, outcome) AS (
    SELECT 'stripe', $12::text, $13::text, $1::text, CASE
        WHEN EXISTS (SELECT FROM up) THEN
            CASE WHEN s.last_event_id = $10 THEN 'unchanged' ELSE 'applied' END
        ELSE 'stale'
        END
    FROM (SELECT) AS one LEFT JOIN checkout_sessions s ON s.stripe_checkout_session_id = $1
),` + ledger.AppendCTE + `,` + ledger.RecordCTE + `
SELECT EXISTS (SELECT FROM up), s.last_event_id
FROM (SELECT) AS one LEFT JOIN checkout_sessions s ON s.stripe_checkout_session_id = $1`

// lockCheckoutSQL serialises the writes of one session, as lockSQL does a
// subscription's, for the feed's before and order.
const lockCheckoutSQL = `SELECT pg_advisory_xact_lock(hashtext('checkout_sessions'), hashtext($1))`

// ApplyCheckout upserts the session as reported by ev (its ID, Type and
// Created), after the session's lock, in one batch.
func (s *Store) ApplyCheckout(ctx context.Context, cs CheckoutSession, ev Event) (Result, error) {
	metadata, err := metadataJSON(cs.Metadata)
	if err != nil {
		return Result{}, err
	}
	entry := ev.entry()
	b := &pgx.Batch{}
	b.Queue(lockCheckoutSQL, cs.ID)
	b.Queue(checkoutSQL, cs.ID, nullString(cs.ClientReferenceID),
		nullString(cs.CustomerID), nullString(cs.SubscriptionID), cs.Mode, cs.Status,
		nullString(cs.PaymentStatus), nullString(cs.CustomerEmail), metadata, ev.ID, ev.Created,
		entryID(entry), entryType(entry))
	br := ledger.SendBatch(ctx, s.pool, b)
	var w written
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&w.applied, &w.storedID)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("write checkout session %s from %s: %w", cs.ID, ev.ID, err)
	}
	// The statement settles same-second events itself: what it did not
	// write is stale.
	if res, ok := s.fast(w, ev.ID, ev.Created); ok {
		return res, nil
	}
	s.stale.Inc()
	return Result{Verdict: Stale, StoredEventID: deref(w.storedID)}, nil
}
