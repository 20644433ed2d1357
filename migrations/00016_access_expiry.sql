-- +goose NO TRANSACTION
-- +goose Up
-- access.changed when access ends on time (issue 46). A subscription whose
-- access_ends_at passes sends the customer's answer again, although no
-- event came. The relay's leader finds them by the window of ends since
-- its last pass: entitlements_access_ends holds only the subscriptions
-- whose ending can move an answer (their status gives access), so a pass
-- reads the window's rows, not the table. Built CONCURRENTLY: entitlements
-- is written by every delivery, and a plain CREATE INDEX would hold its
-- writes for the whole build. A try that stops half way (lock_timeout
-- ends the build's wait for an older transaction) leaves an invalid index
-- behind, which IF NOT EXISTS would keep for good: the runner's next try
-- drops it first and builds it anew.
DROP INDEX CONCURRENTLY IF EXISTS entitlements_access_ends;
-- squawk-ignore prefer-robust-stmts
CREATE INDEX CONCURRENTLY entitlements_access_ends ON entitlements (access_ends_at)
    WHERE status IN ('active', 'trialing') AND access_ends_at IS NOT NULL;

-- How far the leader has sent the ends of access, per consumer: no feed
-- row is written for an ending (nothing in the tables changed), so the
-- position is kept here. A new table: the previous release neither reads
-- nor writes it.
CREATE TABLE IF NOT EXISTS access_expiry (
    consumer   text        PRIMARY KEY,
    handled_to timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS access_expiry;
DROP INDEX CONCURRENTLY IF EXISTS entitlements_access_ends;
