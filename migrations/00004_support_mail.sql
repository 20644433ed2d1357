-- +goose Up
-- What an agent needs to act on an inbound mail: who to answer, which
-- conversation it belongs to, whether the sender is who it claims to be,
-- and what it attached. Every new column allows NULL, so rows of the first
-- release (and the form's rows) stay valid.
ALTER TABLE support_messages
    ADD COLUMN reply_to             text,
    ADD COLUMN in_reply_to          text,
    ADD COLUMN message_references   text[],
    -- The id of the conversation's first message; a message that starts a
    -- conversation (every form message) holds its own id.
    ADD COLUMN thread_id            bigint,
    -- Resend's authentication verdicts, as Resend reports them.
    ADD COLUMN auth_spf             text,
    ADD COLUMN auth_dkim            text,
    ADD COLUMN auth_dmarc           text,
    -- true when DMARC passed, false when it failed, NULL otherwise: only
    -- true makes from_address trustworthy.
    ADD COLUMN sender_authenticated boolean;

-- Rows queued before threads existed each start their own.
UPDATE support_messages SET thread_id = id WHERE thread_id IS NULL;

-- A thread's messages, in order. The thread lookup itself (message_id =
-- ANY(...) for source 'email') uses support_messages_email_message, whose
-- leading column is message_id.
-- Not CONCURRENTLY (squawk's lint): this file also adds columns and fills
-- thread_id, which must commit together with the index, and every
-- database that has run it since its release did so in one transaction.
-- Only a database of the first release (no thread_id) runs it now.
-- squawk-ignore require-concurrent-index-creation
CREATE INDEX support_messages_thread ON support_messages (thread_id, id);

CREATE TABLE support_attachments (
    id                  bigserial PRIMARY KEY,
    support_message_id  bigint    NOT NULL REFERENCES support_messages (id) ON DELETE CASCADE,
    -- Resend's attachment id.
    external_id         text      NOT NULL,
    filename            text,
    content_type        text,
    content_disposition text,
    -- Matches a cid: reference in the message's html_body.
    content_id          text,
    size                bigint,
    -- NULL when not stored; no_content_reason says why ('too_large',
    -- 'not_found', 'gone', 'no_download_url').
    content             bytea,
    sha256              bytea,
    no_content_reason   text,
    UNIQUE (support_message_id, external_id)
);

-- Attachments are mostly images, PDFs and archives, compressed already:
-- storing them out of line without pglz spares Postgres a compression pass
-- that gains nothing.
ALTER TABLE support_attachments ALTER COLUMN content SET STORAGE EXTERNAL;

-- +goose Down
DROP TABLE support_attachments;
DROP INDEX support_messages_thread;
ALTER TABLE support_messages
    DROP COLUMN reply_to,
    DROP COLUMN in_reply_to,
    DROP COLUMN message_references,
    DROP COLUMN thread_id,
    DROP COLUMN auth_spf,
    DROP COLUMN auth_dkim,
    DROP COLUMN auth_dmarc,
    DROP COLUMN sender_authenticated;
