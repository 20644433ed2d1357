package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// The feed's and the ledger's rows keep the trace of the delivery that
// wrote them (changes.traceparent, webhook_events.trace_id) without a
// parameter in every store's statement: the writing transaction sets
// munchable.traceparent, transaction-local, before its statements, and
// AppendChangeCTE and RecordCTE read it. Only a sampled delivery sets it;
// otherwise it is unset (or empty once set in the session), which the
// fragments store as NULL, and nothing is sent.
const setTraceSQL = `SELECT set_config('munchable.traceparent', $1, true)`

// traceparentSQL is the setting as the fragments read it: NULL when unset.
const traceparentSQL = `nullif(current_setting('munchable.traceparent', true), '')`

// batchSender is a pool, a connection or a transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// SendBatch sends b on q. When ctx's span is sampled it first sets the
// trace for the batch's implicit (or q's explicit) transaction, in the
// same round trip, and reads that result itself: the caller reads b's
// results as it queued them. A failure of the setting aborts the
// transaction, so the caller's first read reports it.
func SendBatch(ctx context.Context, q batchSender, b *pgx.Batch) pgx.BatchResults {
	tp := tracing.Traceparent(ctx)
	if tp == "" {
		return q.SendBatch(ctx, b)
	}
	set := &pgx.Batch{}
	set.Queue(setTraceSQL, tp)
	set.QueuedQueries = append(set.QueuedQueries, b.QueuedQueries...)
	br := q.SendBatch(ctx, set)
	_, _ = br.Exec()
	return br
}

// SetTrace sets the trace for the rest of tx, when ctx's span is sampled
// (one round trip, then; none otherwise).
func SetTrace(ctx context.Context, tx pgx.Tx) error {
	tp := tracing.Traceparent(ctx)
	if tp == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, setTraceSQL, tp); err != nil {
		return fmt.Errorf("set trace: %w", err)
	}
	return nil
}
