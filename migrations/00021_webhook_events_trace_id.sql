-- +goose Up
-- Traces, continued (00020 has changes.traceparent; one table per
-- migration, so that no delivery waits for two tables' locks).
-- webhook_events.trace_id: the trace of the event's last traced attempt
-- that reached its store; events show prints it. Nullable and written only
-- when the delivery's trace is sampled, from the same transaction-local
-- setting as changes.traceparent. The previous release neither reads nor
-- writes it: its inserts leave it NULL, and its reads name their columns.
ALTER TABLE webhook_events ADD COLUMN trace_id text;

-- +goose Down
ALTER TABLE webhook_events DROP COLUMN trace_id;
