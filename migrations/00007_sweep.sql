-- +goose Up
-- Jobs that one replica at a time runs on a schedule (internal/leader):
-- stripe verify and the sweeps. started_at is when the last successful
-- run began: a sweep's position, from which its next pass lists (less an
-- overlap); succeeded_at is when it ended, and result what it found
-- (verify: the drifted rows by kind), both exported by every replica.
CREATE TABLE scheduled_jobs (
    name         text        PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    succeeded_at timestamptz NOT NULL,
    result       jsonb       NOT NULL
);

-- +goose Down
DROP TABLE scheduled_jobs;
