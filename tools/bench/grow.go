package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// growSQL adds subscriptions $1 to $2 (numbers) with what a delivered
// subscription leaves behind, shaped like the rows the service writes:
// the subscription and its item, its complete checkout session (the app's
// user as client_reference_id) and every fourth an expired one before it,
// every other customer's features, three ledger rows and three changes.
// The changes' transactions are real (growXidsSQL burns them first, from
// $3 on): a transaction every three rows, as deliveries write them, so
// that the feed's txids and ids run as they do in production. Times are
// spread over the last days, inside any retention.
var growSQL = []string{`
INSERT INTO entitlements (stripe_subscription_id, stripe_customer_id, status, price_id,
    current_period_end, cancel_at_period_end, last_event_id, last_event_created, updated_at,
    trial_start, trial_end, access_ends_at, livemode, metadata)
SELECT 'sub_scale_' || g, 'cus_scale_' || (g / 2),
       CASE WHEN g % 10 = 0 THEN 'canceled' ELSE 'active' END, 'price_scale_' || (g % 5),
       now() + interval '20 days', g % 10 = 0, 'evt_scale_' || g || '_2', now() - interval '1 day',
       now(), now() - interval '40 days', now() - interval '26 days',
       CASE WHEN g % 10 = 0 THEN now() - interval '1 day' END, true, '{"plan": "pro"}'
FROM generate_series($1::bigint, $2::bigint) g`, `
INSERT INTO entitlement_items (stripe_subscription_id, stripe_item_id, price_id, product_id,
    price_lookup_key, quantity, current_period_start, current_period_end, position)
SELECT 'sub_scale_' || g, 'si_scale_' || g, 'price_scale_' || (g % 5), 'prod_scale',
       'plan_' || (g % 5), 1, now() - interval '10 days', now() + interval '20 days', 0
FROM generate_series($1::bigint, $2::bigint) g`, `
INSERT INTO checkout_sessions (stripe_checkout_session_id, client_reference_id,
    stripe_customer_id, stripe_subscription_id, mode, status, payment_status, customer_email,
    metadata, last_event_id, last_event_created, updated_at)
SELECT s.id, 'user_' || g, 'cus_scale_' || (g / 2), s.sub, 'subscription', s.status, s.paid,
       'user' || g || '@example.com', '{}', 'evt_scale_' || g || '_1', now() - s.age, now()
FROM generate_series($1::bigint, $2::bigint) g
CROSS JOIN LATERAL (VALUES
    ('cs_scale_' || g, 'sub_scale_' || g, 'complete', 'paid', interval '2 days', true),
    ('cs_scale_' || g || '_x', NULL, 'expired', 'unpaid', interval '3 days', g % 4 = 0)
) AS s(id, sub, status, paid, age, keep)
WHERE s.keep`, `
INSERT INTO customer_features (stripe_customer_id, lookup_keys, complete, last_event_id,
    last_event_created, updated_at)
SELECT 'cus_scale_' || (g / 2), ARRAY['plan_' || (g % 5)], true, 'evt_scale_' || g || '_f',
       now() - interval '1 day', now()
FROM generate_series($1::bigint, $2::bigint) g
WHERE g % 2 = 0`, `
INSERT INTO webhook_events (provider, event_id, event_type, subject, outcome, attempts,
    first_seen_at, finished_at)
SELECT 'stripe', 'evt_scale_' || g || '_' || k.n, k.type, k.subject, 'applied', 1,
       now() - ($2::bigint - g) * interval '1 second', now() - ($2::bigint - g) * interval '1 second'
FROM generate_series($1::bigint, $2::bigint) g
CROSS JOIN LATERAL (VALUES
    (0, 'customer.subscription.created', 'sub_scale_' || g),
    (1, 'checkout.session.completed', 'cs_scale_' || g),
    (2, 'customer.subscription.updated', 'sub_scale_' || g)
) AS k(n, type, subject)`, `
INSERT INTO changes (txid, at, kind, subject, stripe_customer_id, event_id, before, after)
SELECT ($3::bigint + g - $1::bigint)::text::xid8, now() - ($2::bigint - g) * interval '1 second',
       k.kind, k.subject, 'cus_scale_' || (g / 2), 'evt_scale_' || g || '_' || k.n, k.before, k.after
FROM generate_series($1::bigint, $2::bigint) g
CROSS JOIN LATERAL (VALUES
    (0, 'subscription', 'sub_scale_' || g, NULL::jsonb,
     jsonb_build_object('stripe_subscription_id', 'sub_scale_' || g, 'status', 'trialing',
                        'price_id', 'price_scale_' || (g % 5), 'cancel_at_period_end', false)),
    (1, 'checkout_session', 'cs_scale_' || g, NULL,
     jsonb_build_object('stripe_checkout_session_id', 'cs_scale_' || g, 'status', 'complete',
                        'client_reference_id', 'user_' || g)),
    (2, 'subscription', 'sub_scale_' || g, '{"status": "trialing"}', '{"status": "active"}')
) AS k(n, kind, subject, before, after)
ORDER BY g, k.n`}

// growXidsSQL commits $1 transactions that each take an id: the txids of
// the changes growSQL adds. Without synchronous commit, a hundred
// thousand a second.
const growXidsSQL = `DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`

// grow adds subscriptions from+1 to to, then vacuums and analyzes what it
// grew and checkpoints, so that what is measured next starts from a
// settled database.
func grow(ctx context.Context, conn *pgx.Conn, from, to int) error {
	if to > from {
		if err := add(ctx, conn, from, to); err != nil {
			return err
		}
	}
	for _, sql := range []string{`VACUUM ANALYZE`, `CHECKPOINT`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// add runs growSQL for subscriptions from+1 to to.
func add(ctx context.Context, conn *pgx.Conn, from, to int) error {
	var x0 int64
	if err := conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&x0); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		return err
	}
	// DO with COMMIT needs the simple protocol's implicit transaction.
	if _, err := conn.Exec(ctx, fmt.Sprintf(growXidsSQL, to-from), pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("burn txids: %w", err)
	}
	for _, sql := range growSQL {
		args := []any{from + 1, to}
		if strings.Contains(sql, "$3") {
			args = append(args, x0+1)
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("grow: %w\n%s", err, sql)
		}
	}
	_, err := conn.Exec(ctx, `RESET synchronous_commit`)
	return err
}
