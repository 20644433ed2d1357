-- +goose Up
-- What the ledger and the feed cost a delivery. First, the change feed's
-- diff, as functions rather than as expressions inside each writing
-- statement. Postgres builds every node and expression of a
-- statement's plan each time it runs it, used or not, and the diff's
-- (the old row's JSON, its items, the comparison) tripled what the ledger
-- and the feed cost a first delivery (docs/PERFORMANCE.md, issue 23). A
-- function is built only when it is called, and a statement calls these
-- only when there is an old row to compare with.

-- ledger_change is a change's two halves.
CREATE TYPE ledger_change AS (before jsonb, after jsonb);

-- ledger_diff(a, b): the keys of b whose values differ in a, as they were
-- in a (before) and are in b (after); before is null when a is (a new
-- row), after is null when nothing differs.
-- +goose StatementBegin
CREATE FUNCTION ledger_diff(a jsonb, b jsonb) RETURNS ledger_change
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    c ledger_change;
BEGIN
    SELECT jsonb_object_agg(e.key, a -> e.key) FILTER (WHERE a IS NOT NULL),
           jsonb_object_agg(e.key, e.value)
    INTO c.before, c.after
    FROM jsonb_each(b) e
    WHERE e.value IS DISTINCT FROM a -> e.key;
    RETURN c;
END
$$;
-- +goose StatementEnd

-- subscription_state(id): a subscription as the feed describes it, the
-- row without its bookkeeping (updated_at, last_event_*) and its items in
-- order, or null when there is none. The service builds the same shape
-- for the state an event writes (internal/entitlements, stateJSON), with
-- timestamps in UTC, so this reads them in UTC whatever the session's
-- TimeZone. STABLE: called from a writing statement, it reads the
-- statement's snapshot, the row as it was before the statement.
-- +goose StatementBegin
CREATE FUNCTION subscription_state(id text) RETURNS jsonb
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

-- Every first delivery draws a webhook_events id, and nextval takes the
-- sequence's one page exclusively: under make bench that page was one of
-- the buffers the deliveries queued on (LWLock BufferContent waits, about
-- as many samples as on CPU). A backend now draws 64 ids at a time. Nothing
-- orders by this id alone (events list orders by first_seen_at), so ids
-- out of insertion order across connections, and gaps, cost nothing. The
-- changes id keeps drawing one at a time: the feed's order rests on it.
ALTER SEQUENCE webhook_events_id_seq CACHE 64;

-- +goose Down
ALTER SEQUENCE webhook_events_id_seq CACHE 1;
DROP FUNCTION subscription_state(text);
DROP FUNCTION ledger_diff(jsonb, jsonb);
DROP TYPE ledger_change;
