-- +goose Up
-- A gap: the stored row's event said it came from a state other than the
-- one stored before it (data.previous_attributes), so at least one change
-- of the object is missing before it. gap_to is the state that event said
-- it came from; gap_from the state stored before it, null when there was
-- none (an update was the first event seen). Both null: no known gap. A
-- same-second event that fits the gap is the missing predecessor, not a
-- successor (internal/entitlements, order.go). Subscriptions keep states
-- as subscription_state spells them; features as sorted lookup keys.
-- gap_from = gap_to: more than one change is missing, which one gap
-- cannot place; no same-second event is then a successor.
-- creation: the row was written by customer.subscription.created, which
-- precedes every other event of its subscription, so an event of its
-- second is newer, not unordered.
-- Nullable, or a constant default: adding them rewrites no row.
ALTER TABLE entitlements
    ADD COLUMN gap_from jsonb,
    ADD COLUMN gap_to   jsonb,
    ADD COLUMN creation boolean NOT NULL DEFAULT false;
ALTER TABLE customer_features
    ADD COLUMN gap_from text[],
    ADD COLUMN gap_to   text[];

-- +goose Down
ALTER TABLE customer_features
    DROP COLUMN gap_from,
    DROP COLUMN gap_to;
ALTER TABLE entitlements
    DROP COLUMN gap_from,
    DROP COLUMN gap_to,
    DROP COLUMN creation;
