-- +goose Up
-- The support queue, fed by inbound mail (source 'email') and the site's
-- support form (source 'web'). Both unique keys live here, at the store, so
-- that concurrent or repeated deliveries cannot race past a look-then-insert.
CREATE TABLE support_messages (
    id           bigserial   PRIMARY KEY,
    source       text        NOT NULL CHECK (source IN ('email', 'web')),
    external_id  text        NOT NULL,
    from_address text        NOT NULL,
    from_name    text,
    to_address   text,
    subject      text,
    text_body    text,
    html_body    text,
    message_id   text,
    -- sha256 of the sender, subject and bodies: pairs with message_id so the
    -- same mail under two Resend ids is one row, while a different mail that
    -- reuses a Message-ID is kept.
    content_hash bytea,
    received_at  timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source, external_id)
);

CREATE UNIQUE INDEX support_messages_email_message
    ON support_messages (message_id, content_hash)
    WHERE source = 'email' AND message_id IS NOT NULL;

CREATE INDEX support_messages_created ON support_messages (created_at);

-- +goose Down
DROP TABLE support_messages;
