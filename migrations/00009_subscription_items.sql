-- +goose Up
-- subscription_items(id): a subscription's items in order, as the feed
-- describes them (the shape of internal/entitlements' itemState). The
-- feed's subscription_state and the service's reads of a stored
-- subscription (a same-second event's judgement, stripe verify) both use
-- it, so that the items' JSON is spelled once. Timestamps print in the
-- caller's time zone with its offset: subscription_state sets UTC, and the
-- service parses the offset.
-- +goose StatementBegin
CREATE FUNCTION subscription_items(id text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('id', i.stripe_item_id,
        'price_id', i.price_id, 'product_id', i.product_id,
        'price_lookup_key', i.price_lookup_key, 'quantity', i.quantity,
        'current_period_start', i.current_period_start,
        'current_period_end', i.current_period_end) ORDER BY i.position), '[]')
    FROM entitlement_items i
    WHERE i.stripe_subscription_id = id
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION subscription_state(id text) RETURNS jsonb
LANGUAGE plpgsql STABLE SET timezone = 'UTC' AS $$
BEGIN
    RETURN (
        SELECT jsonb_build_object(
            'stripe_subscription_id', s.stripe_subscription_id,
            'stripe_customer_id', s.stripe_customer_id, 'status', s.status,
            'price_id', s.price_id, 'current_period_end', s.current_period_end,
            'cancel_at_period_end', s.cancel_at_period_end, 'cancel_at', s.cancel_at,
            'canceled_at', s.canceled_at, 'ended_at', s.ended_at,
            'trial_start', s.trial_start, 'trial_end', s.trial_end,
            'pause_collection', s.pause_collection, 'access_ends_at', s.access_ends_at,
            'livemode', s.livemode, 'metadata', s.metadata,
            'items', subscription_items(s.stripe_subscription_id))
        FROM entitlements s
        WHERE s.stripe_subscription_id = id);
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION subscription_state(id text) RETURNS jsonb
LANGUAGE plpgsql STABLE SET timezone = 'UTC' AS $$
BEGIN
    RETURN (
        SELECT jsonb_build_object(
            'stripe_subscription_id', s.stripe_subscription_id,
            'stripe_customer_id', s.stripe_customer_id, 'status', s.status,
            'price_id', s.price_id, 'current_period_end', s.current_period_end,
            'cancel_at_period_end', s.cancel_at_period_end, 'cancel_at', s.cancel_at,
            'canceled_at', s.canceled_at, 'ended_at', s.ended_at,
            'trial_start', s.trial_start, 'trial_end', s.trial_end,
            'pause_collection', s.pause_collection, 'access_ends_at', s.access_ends_at,
            'livemode', s.livemode, 'metadata', s.metadata,
            'items', coalesce((
                SELECT jsonb_agg(jsonb_build_object('id', i.stripe_item_id,
                    'price_id', i.price_id, 'product_id', i.product_id,
                    'price_lookup_key', i.price_lookup_key, 'quantity', i.quantity,
                    'current_period_start', i.current_period_start,
                    'current_period_end', i.current_period_end) ORDER BY i.position)
                FROM entitlement_items i
                WHERE i.stripe_subscription_id = s.stripe_subscription_id), '[]'))
        FROM entitlements s
        WHERE s.stripe_subscription_id = id);
END
$$;
-- +goose StatementEnd
DROP FUNCTION subscription_items(text);
