-- +goose NO TRANSACTION
-- +goose Up
-- customer_access at a million subscriptions (issue 37). The view found a
-- subscription's client_reference_id with a correlated subquery over
-- checkout_sessions, which had no index on stripe_subscription_id: every
-- lookup by customer scanned all of checkout_sessions once per row, and a
-- lookup by client_reference_id (a filter on the subquery's output, which
-- no index can serve) scanned every entitlements row and, for each, all of
-- checkout_sessions: 552 s at 100k subscriptions.
--
-- The session now comes in by a join: the subscription's latest complete
-- session is the complete one with no later complete one (the subquery's
-- ORDER BY last_event_created DESC, stripe_checkout_session_id, as an
-- anti-join), and both the join and the anti-join go by the new index on
-- stripe_subscription_id. A filter on client_reference_id is then a filter
-- on a joined table's column: Postgres turns the left join into an inner
-- one and starts from checkout_sessions_client_reference. The columns and
-- their meaning are unchanged, and nothing is written twice: the
-- alternative, a copy of client_reference_id on entitlements kept by the
-- writers, would cost every delivery a write and leave a race to get
-- right (a subscription and its session arriving together).
--
-- The index is built CONCURRENTLY, outside a transaction, so that checkout
-- writes go on during the build (seconds at a million rows). It was first
-- released as a plain CREATE INDEX in a transaction: a database that
-- applied that has the same index and view, and goose never runs a
-- recorded version again. Each statement can run twice: a try that stops
-- half way may leave an invalid index, which the next try drops and builds
-- anew (IF NOT EXISTS would keep it), and the view is replaced whole.
DROP INDEX CONCURRENTLY IF EXISTS checkout_sessions_subscription;
-- squawk-ignore prefer-robust-stmts
CREATE INDEX CONCURRENTLY checkout_sessions_subscription ON checkout_sessions (stripe_subscription_id);

CREATE OR REPLACE VIEW customer_access AS
SELECT
    e.stripe_customer_id,
    c.client_reference_id,
    e.stripe_subscription_id,
    e.status,
    e.status IN ('active', 'trialing')
        AND (e.access_ends_at IS NULL OR e.access_ends_at > now()) AS has_access,
    e.access_ends_at,
    coalesce((SELECT array_agg(i.price_lookup_key ORDER BY i.position)
              FROM entitlement_items i
              WHERE i.stripe_subscription_id = e.stripe_subscription_id
                AND i.price_lookup_key IS NOT NULL), '{}') AS price_lookup_keys,
    coalesce((SELECT f.lookup_keys FROM customer_features f
              WHERE f.stripe_customer_id = e.stripe_customer_id), '{}') AS features
FROM entitlements e
LEFT JOIN (
    SELECT s.stripe_subscription_id, s.client_reference_id
    FROM checkout_sessions s
    WHERE s.status = 'complete'
      AND NOT EXISTS (
          SELECT FROM checkout_sessions l
          WHERE l.stripe_subscription_id = s.stripe_subscription_id
            AND l.status = 'complete'
            AND (l.last_event_created > s.last_event_created
                 OR (l.last_event_created = s.last_event_created
                     AND l.stripe_checkout_session_id < s.stripe_checkout_session_id)))
) c ON c.stripe_subscription_id = e.stripe_subscription_id;

-- +goose Down
CREATE OR REPLACE VIEW customer_access AS
SELECT
    e.stripe_customer_id,
    (SELECT c.client_reference_id FROM checkout_sessions c
     WHERE c.stripe_subscription_id = e.stripe_subscription_id
       AND c.status = 'complete'
     ORDER BY c.last_event_created DESC, c.stripe_checkout_session_id
     LIMIT 1) AS client_reference_id,
    e.stripe_subscription_id,
    e.status,
    e.status IN ('active', 'trialing')
        AND (e.access_ends_at IS NULL OR e.access_ends_at > now()) AS has_access,
    e.access_ends_at,
    coalesce((SELECT array_agg(i.price_lookup_key ORDER BY i.position)
              FROM entitlement_items i
              WHERE i.stripe_subscription_id = e.stripe_subscription_id
                AND i.price_lookup_key IS NOT NULL), '{}') AS price_lookup_keys,
    coalesce((SELECT f.lookup_keys FROM customer_features f
              WHERE f.stripe_customer_id = e.stripe_customer_id), '{}') AS features
FROM entitlements e;
DROP INDEX CONCURRENTLY IF EXISTS checkout_sessions_subscription;
