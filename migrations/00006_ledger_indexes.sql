-- +goose NO TRANSACTION
-- +goose Up
-- The ledger's outcome index holds only the events an operator looks for
-- by outcome: failed and dead ones (events list --outcome, the runbook's
-- poison-event entry). Nearly every event ends applied, unchanged or stale,
-- and each paid an index entry here that no query needed: a list of those
-- goes by webhook_events_first_seen and filters. docs/PERFORMANCE.md has
-- the measurements.
--
-- Built and dropped CONCURRENTLY, outside a transaction, so that deliveries
-- keep writing webhook_events meanwhile (first written as a plain DROP and
-- CREATE in a transaction; a database that applied that has the same
-- indexes, and goose never runs a recorded version again). A try that
-- stops half way can leave an invalid index behind, which IF NOT EXISTS
-- would keep: the runner's next try drops it first and builds it anew.
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_unsettled;
-- squawk-ignore prefer-robust-stmts
CREATE INDEX CONCURRENTLY webhook_events_unsettled ON webhook_events (outcome, first_seen_at)
    WHERE outcome IN ('failed', 'dead');
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_outcome;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_outcome;
CREATE INDEX CONCURRENTLY webhook_events_outcome ON webhook_events (outcome, first_seen_at);
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_unsettled;
