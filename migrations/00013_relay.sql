-- +goose Up
-- The relay (internal/relay): the change feed delivered, once, to each
-- consumer (forward: support messages to the team's mailbox; app_webhook:
-- changes to the app).

-- Each consumer's position in the feed. cursor is the form changes tail
-- prints; floor is the cursor's floor (every change whose txid is below it
-- has been passed), which retention reads: it never deletes a change an
-- enabled consumer has not passed. A consumer no longer configured is
-- marked not enabled by the relay, and holds nothing back.
CREATE TABLE feed_consumers (
    name       text        PRIMARY KEY,
    cursor     text        NOT NULL,
    updated_at timestamptz NOT NULL,
    floor      xid8        NOT NULL,
    enabled    boolean     NOT NULL DEFAULT true
);

-- One row per consumer and change it takes. order_key is what its order
-- goes by: the change's subject, or what the consumer says (forward: the
-- support message's thread, so that a thread reaches the team in order).
-- change is the feed's row as
-- the relay read it, so that a delivery outlives the change's retention
-- (a retry by hand of a month-old dead delivery still has what to send).
-- created_at is when the relay took the change: relay_oldest_pending_seconds
-- runs from it.
CREATE TABLE relay_deliveries (
    consumer        text        NOT NULL,
    change_id       bigint      NOT NULL,
    subject         text        NOT NULL,
    order_key       text        NOT NULL,
    state           text        NOT NULL
        CHECK (state IN ('pending', 'delivered', 'failed', 'dead', 'skipped')),
    attempts        int         NOT NULL,
    next_attempt_at timestamptz,
    last_error      text,
    result          text,
    delivered_at    timestamptz,
    change          jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, change_id)
);

-- What is still to deliver: the relay's due query, its order check (an
-- older open delivery of the same order_key) and the oldest pending gauge
-- all read only these rows.
CREATE INDEX relay_deliveries_open ON relay_deliveries (consumer, order_key, change_id)
    WHERE state IN ('pending', 'failed');
CREATE INDEX relay_deliveries_state ON relay_deliveries (consumer, state, change_id);

-- Retention's watermark: the highest txid it ever deleted from changes
-- (NULL: none yet). A cursor whose floor is at or below it may have missed
-- a deleted change: changes tail --after exits 4, the relay counts a gap.
CREATE TABLE changes_trimmed (
    one          boolean PRIMARY KEY DEFAULT true CHECK (one),
    through_txid xid8
);
INSERT INTO changes_trimmed DEFAULT VALUES;

-- The mail's Auto-Submitted header (RFC 3834), as sent: the forward skips
-- a message with one other than "no" (an auto-reply, a bounce), so that
-- two auto-responders cannot loop through the team's mailbox.
ALTER TABLE support_messages ADD COLUMN auto_submitted text;

-- +goose Down
ALTER TABLE support_messages DROP COLUMN auto_submitted;
DROP TABLE changes_trimmed;
DROP TABLE relay_deliveries;
DROP TABLE feed_consumers;
