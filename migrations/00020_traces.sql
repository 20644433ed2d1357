-- +goose Up
-- Traces (internal/tracing): where a delivery's trace can be found again.
-- Both columns are nullable and written only when the delivery's trace is
-- sampled (never with tracing off), from the transaction-local setting
-- munchable.traceparent that the writing transaction sets (ledger.SendBatch).
-- The previous release neither reads nor writes them: its inserts leave
-- them NULL, and its reads name their columns (the feed's SELECT * inside
-- ReadSQL picks its columns by name outside).
--
-- changes.traceparent: the W3C traceparent of the delivery span that made
-- the change; the relay's span for the change continues that trace, and
-- the app's webhook and the forward carry it on.
ALTER TABLE changes ADD COLUMN traceparent text;

-- webhook_events.trace_id: the trace of the event's last traced attempt
-- that reached its store; events show prints it.
ALTER TABLE webhook_events ADD COLUMN trace_id text;

-- +goose Down
ALTER TABLE webhook_events DROP COLUMN trace_id;
ALTER TABLE changes DROP COLUMN traceparent;
