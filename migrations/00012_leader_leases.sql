-- +goose Up
-- Leases (internal/leader): one replica at a time runs each named job (a
-- sweep, verify, the relay) while it holds the job's row here. A lease is
-- taken and renewed over the service's pool and judged by Postgres's
-- clock, never the holder's: it is held while expires_at is in the
-- future. token is the fencing token: it grows by one at every
-- acquisition, and a holder's writes check, in their own transaction,
-- that their token is still the row's and unexpired. holder names the
-- replica (host and pid), for people reading the table.
CREATE TABLE leader_leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    token      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);

-- The lease token of the run that recorded a job's last success (0: a run
-- recorded before leases).
ALTER TABLE scheduled_jobs ADD COLUMN token bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE scheduled_jobs DROP COLUMN token;
DROP TABLE leader_leases;
