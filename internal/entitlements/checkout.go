package entitlements

import (
	"context"
	"fmt"
	"time"
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
const checkoutSQL = `
WITH up AS (
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
RETURNING 1
)
SELECT EXISTS (SELECT FROM up), s.last_event_id
FROM (SELECT) AS one LEFT JOIN checkout_sessions s ON s.stripe_checkout_session_id = $1`

// ApplyCheckout upserts the session as reported by the event eventID
// created at created.
func (s *Store) ApplyCheckout(ctx context.Context, cs CheckoutSession, eventID string, created time.Time) (Result, error) {
	metadata, err := metadataJSON(cs.Metadata)
	if err != nil {
		return Result{}, err
	}
	var w written
	err = s.pool.QueryRow(ctx, checkoutSQL, cs.ID, nullString(cs.ClientReferenceID),
		nullString(cs.CustomerID), nullString(cs.SubscriptionID), cs.Mode, cs.Status,
		nullString(cs.PaymentStatus), nullString(cs.CustomerEmail), metadata, eventID, created).
		Scan(&w.applied, &w.storedID)
	if err != nil {
		return Result{}, fmt.Errorf("write checkout session %s from %s: %w", cs.ID, eventID, err)
	}
	// The statement settles same-second events itself: what it did not
	// write is stale.
	if res, ok := s.fast(w, eventID, created); ok {
		return res, nil
	}
	s.stale.Inc()
	return Result{Verdict: Stale, StoredEventID: deref(w.storedID)}, nil
}
