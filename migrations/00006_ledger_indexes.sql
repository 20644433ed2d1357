-- +goose Up
-- The ledger's outcome index holds only the events an operator looks for
-- by outcome: failed and dead ones (events list --outcome, the runbook's
-- poison-event entry). Nearly every event ends applied, unchanged or stale,
-- and each paid an index entry here that no query needed: a list of those
-- goes by webhook_events_first_seen and filters. docs/PERFORMANCE.md has
-- the measurements.
DROP INDEX webhook_events_outcome;
CREATE INDEX webhook_events_unsettled ON webhook_events (outcome, first_seen_at)
    WHERE outcome IN ('failed', 'dead');

-- +goose Down
DROP INDEX webhook_events_unsettled;
CREATE INDEX webhook_events_outcome ON webhook_events (outcome, first_seen_at);
