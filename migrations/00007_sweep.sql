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

-- stripe verify's census: the ids a walk saw, under its run id, so that
-- the stored rows Stripe did not list can be read back in batches
-- (internal/entitlements, Census). A walk deletes its rows when it ends;
-- rows a dead walk left are deleted a day later by the next.
CREATE TABLE drift_census (
    run     uuid        NOT NULL,
    kind    text        NOT NULL,
    id      text        NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run, kind, id)
);

-- +goose Down
DROP TABLE drift_census;
DROP TABLE scheduled_jobs;
