-- +goose Up
-- Everything a Stripe subscription says about access, not just its status:
-- every new column has a default or allows null, so rows written before
-- this migration stay valid (the next event for them fills the rest in).
ALTER TABLE entitlements
    ADD COLUMN cancel_at        timestamptz,
    ADD COLUMN canceled_at      timestamptz,
    ADD COLUMN ended_at         timestamptz,
    ADD COLUMN trial_start      timestamptz,
    ADD COLUMN trial_end        timestamptz,
    ADD COLUMN pause_collection text,
    -- When access ends if nothing changes: ended_at, else cancel_at, else
    -- current_period_end when cancel_at_period_end; null: it renews.
    ADD COLUMN access_ends_at   timestamptz,
    ADD COLUMN livemode         boolean,
    ADD COLUMN metadata         jsonb NOT NULL DEFAULT '{}';

-- A subscription's items, replaced as a whole with each admitted event.
-- position keeps Stripe's order: price_id on entitlements is the first's.
CREATE TABLE entitlement_items (
    stripe_subscription_id text        NOT NULL REFERENCES entitlements ON DELETE CASCADE,
    stripe_item_id         text        NOT NULL,
    price_id               text        NOT NULL,
    product_id             text,
    price_lookup_key       text,
    quantity               bigint,
    current_period_start   timestamptz,
    current_period_end     timestamptz,
    position               integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (stripe_subscription_id, stripe_item_id)
);

-- The features (Stripe Entitlements lookup keys) each customer may use.
CREATE TABLE customer_features (
    stripe_customer_id text PRIMARY KEY,
    lookup_keys        text[]      NOT NULL,
    -- false: Stripe's list was truncated and could not be fetched whole.
    complete           boolean     NOT NULL,
    last_event_id      text        NOT NULL,
    last_event_created timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL
);

-- Checkout sessions: client_reference_id links the app's user to the
-- Stripe customer and subscription.
CREATE TABLE checkout_sessions (
    stripe_checkout_session_id text PRIMARY KEY,
    client_reference_id        text,
    stripe_customer_id         text,
    stripe_subscription_id     text,
    mode                       text        NOT NULL,
    status                     text        NOT NULL,
    payment_status             text,
    customer_email             text,
    metadata                   jsonb       NOT NULL DEFAULT '{}',
    last_event_id              text        NOT NULL,
    last_event_created         timestamptz NOT NULL,
    updated_at                 timestamptz NOT NULL
);

CREATE INDEX checkout_sessions_client_reference ON checkout_sessions (client_reference_id);
CREATE INDEX checkout_sessions_customer ON checkout_sessions (stripe_customer_id);

-- +goose Down
DROP TABLE checkout_sessions;
DROP TABLE customer_features;
DROP TABLE entitlement_items;
ALTER TABLE entitlements
    DROP COLUMN cancel_at,
    DROP COLUMN canceled_at,
    DROP COLUMN ended_at,
    DROP COLUMN trial_start,
    DROP COLUMN trial_end,
    DROP COLUMN pause_collection,
    DROP COLUMN access_ends_at,
    DROP COLUMN livemode,
    DROP COLUMN metadata;
