-- +goose Up
-- One row per Stripe subscription. last_event_created and last_event_id are
-- the guard's memory: the upsert in internal/entitlements compares an
-- incoming event against them so that state only moves forward.
CREATE TABLE entitlements (
    stripe_subscription_id text PRIMARY KEY,
    stripe_customer_id     text        NOT NULL,
    status                 text        NOT NULL,
    price_id               text,
    current_period_end     timestamptz,
    cancel_at_period_end   boolean     NOT NULL,
    last_event_id          text        NOT NULL,
    last_event_created     timestamptz NOT NULL,
    updated_at             timestamptz NOT NULL
);

CREATE INDEX entitlements_customer ON entitlements (stripe_customer_id);

-- +goose Down
DROP TABLE entitlements;
