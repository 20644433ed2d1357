-- +goose Up
-- Traces (internal/tracing): where a delivery's trace can be found again,
-- one table per migration (00021 has webhook_events.trace_id): a file's
-- transaction holds each table's lock until it commits, so two tables in
-- one would make a delivery to the first wait for the second's lock too.
-- The column is nullable and written only when the delivery's trace is
-- sampled (never with tracing off), from the transaction-local setting
-- munchable.traceparent that the writing transaction sets (ledger.SendBatch).
-- The previous release neither reads nor writes it: its inserts leave it
-- NULL, and its reads name their columns (the feed's SELECT * inside
-- ReadSQL picks its columns by name outside).
--
-- changes.traceparent: the W3C traceparent of the delivery span that made
-- the change; the relay's span for the change continues that trace, and
-- the app's webhook and the forward carry it on.
ALTER TABLE changes ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE changes DROP COLUMN traceparent;
