-- +goose Up
-- Releases side by side (docs/OPERATIONS.md, "Upgrades and rollbacks").

-- The contract steps: a migration that drops, renames or retypes what an
-- earlier release reads or writes inserts a row here, naming the lowest
-- schema version a build must expect to run on the database afterwards
-- (min_schema). A build whose own schema version is lower refuses to
-- serve, naming both (migrations.Verify), rather than failing on a missing
-- column mid-delivery. Empty until the first contract step.
CREATE TABLE schema_contracts (
    version    bigint PRIMARY KEY,
    min_schema bigint NOT NULL,
    removed    text   NOT NULL
);

-- Which release first recorded each event: the application_name of the
-- writing session, which serve sets to "munchable-webhooks <version>".
-- During a rolling deploy and after a rollback this says which release
-- handled what. Nullable and added without a default, so no row is
-- rewritten; the default, set apart, applies to new rows only. Releases
-- before this one set no application_name: their rows stay NULL.
-- Both statements take an ACCESS EXCLUSIVE lock on a table every delivery
-- writes, for a moment: the runner's lock_timeout bounds the wait.
ALTER TABLE webhook_events ADD COLUMN received_by text;
ALTER TABLE webhook_events
    ALTER COLUMN received_by SET DEFAULT nullif(current_setting('application_name'), '');

-- +goose Down
ALTER TABLE webhook_events DROP COLUMN received_by;
DROP TABLE schema_contracts;
