-- +goose Up
-- The ledger: what happened to every event that reached the claim, kept
-- for EVENTS_RETENTION after the claim's done key has expired. A handled
-- event's row is written in the same transaction as its effect, so
-- 'applied' exists exactly when the effect committed; a failure is
-- recorded after the rollback, with the verified body kept for a retry by
-- hand.
CREATE TABLE webhook_events (
    id            bigserial   PRIMARY KEY,
    provider      text        NOT NULL,
    event_id      text        NOT NULL,
    event_type    text,
    -- The subscription, customer, checkout session or support message the
    -- event is about.
    subject       text,
    -- applied, unchanged, stale, unordered, ignored, failed, dead.
    outcome       text        NOT NULL,
    attempts      int         NOT NULL,
    first_seen_at timestamptz NOT NULL,
    finished_at   timestamptz,
    last_error    text,
    -- The verified body, only while the event is failed or dead.
    body          bytea,
    UNIQUE (provider, event_id)
);
CREATE INDEX webhook_events_outcome ON webhook_events (outcome, first_seen_at);
CREATE INDEX webhook_events_first_seen ON webhook_events (first_seen_at);

-- The change feed: one row per change to a row an app reads, appended in
-- the same transaction as the change. txid is the writing transaction's
-- id: a consumer reads only rows whose transaction no running transaction
-- can still precede (docs/APP.md), so a late commit is never skipped.
CREATE TABLE changes (
    id                 bigserial   PRIMARY KEY,
    txid               xid8        NOT NULL DEFAULT pg_current_xact_id(),
    at                 timestamptz NOT NULL,
    -- subscription, customer_features, checkout_session, support_message.
    kind               text        NOT NULL,
    subject            text        NOT NULL,
    stripe_customer_id text,
    event_id           text,
    -- The fields of the row that changed, before and after; before is
    -- null for a new row.
    before             jsonb,
    after              jsonb
);
CREATE INDEX changes_txid ON changes (txid, id);
CREATE INDEX changes_at ON changes (at);

-- The app's access question in one query: one row per subscription.
CREATE VIEW customer_access AS
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

-- +goose Down
DROP VIEW customer_access;
DROP TABLE changes;
DROP TABLE webhook_events;
