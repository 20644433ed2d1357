package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// trimBatch is how many rows one DELETE removes: small enough that each
// statement holds its locks and its share of the disk for milliseconds,
// so deliveries running beside it keep their latency.
const trimBatch = 1000

// trimLockSQL lets one replica trim at a time. The lock is a transaction
// lock taken per batch, so it can never outlive a connection handed back
// to the pool, and a replica that finds it held skips its pass: the
// holder is doing the work. The key is this service's own: hashtext of
// the tables' names.
const trimLockSQL = `SELECT pg_try_advisory_xact_lock(hashtext('webhook_events'), hashtext('changes'))`

// trimSQL trims one batch of table: of the trimBatch rows after id $3, in
// the primary key's order, those whose time column is before $1. It
// reports how many rows the batch read, how many of them were old, and its
// last id. Ids follow time: changes draws its ids one at a time, and a
// webhook_events id is drawn at most a connection's lifetime before its
// row is written (the sequence hands each backend 64 at a time). So a walk
// from the oldest id, skipping the young rows it meets, is done at the
// first batch with no old row. A walk by id, resuming after the last one,
// reads each row once: a walk in time order would read through the dead
// entries of every batch before it, and the time columns' BRIN indexes
// give no order (migration 00009).
func trimSQL(table, at string) string {
	return `
WITH batch AS (
    SELECT id, ` + at + ` < $1 AS old FROM ` + table + `
    WHERE id > $3 ORDER BY id LIMIT $2
), gone AS (
    DELETE FROM ` + table + ` WHERE id IN (SELECT id FROM batch WHERE old)
)
SELECT count(*), count(*) FILTER (WHERE old), coalesce(max(id), 0) FROM batch`
}

// errLockHeld: another replica is trimming.
var errLockHeld = errors.New("another replica holds the trim lock")

// Trim deletes the rows of webhook_events and changes older than
// retention, walking each table by id trimBatch rows at a time, pausing
// between batches as long as the batch took (so it takes at most about
// half of one core), and returns how many it deleted. It returns early,
// with no error, when another replica is trimming.
func (l *Ledger) Trim(ctx context.Context, retention time.Duration) (events, changes int64, err error) {
	cutoff := time.Now().Add(-retention)
	for _, t := range []struct {
		sql string
		n   *int64
	}{{trimSQL("webhook_events", "first_seen_at"), &events}, {trimSQL("changes", "at"), &changes}} {
		var after int64
		for {
			start := time.Now()
			read, old, last, err := l.trimBatch(ctx, t.sql, cutoff, after)
			*t.n += old
			if errors.Is(err, errLockHeld) {
				return events, changes, nil
			}
			if err != nil {
				return events, changes, err
			}
			if read < trimBatch || old == 0 {
				break
			}
			after = last
			select {
			case <-ctx.Done():
				return events, changes, ctx.Err()
			case <-time.After(time.Since(start)):
			}
		}
	}
	return events, changes, nil
}

func (l *Ledger) trimBatch(ctx context.Context, sql string, cutoff time.Time, after int64) (read, old, last int64, err error) {
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var got bool
		if err := tx.QueryRow(ctx, trimLockSQL).Scan(&got); err != nil {
			return err
		}
		if !got {
			return errLockHeld
		}
		return tx.QueryRow(ctx, sql, cutoff, trimBatch, after).Scan(&read, &old, &last)
	})
	if err != nil && !errors.Is(err, errLockHeld) {
		return 0, 0, 0, fmt.Errorf("trim ledger: %w", err)
	}
	return read, old, last, err
}

// RunRetention trims every interval until ctx ends, and returns then: the
// caller owns the goroutine and waits for it. retention 0 keeps every row
// (it returns at once).
func (l *Ledger) RunRetention(ctx context.Context, retention, interval time.Duration, logger *slog.Logger) {
	if retention <= 0 {
		return
	}
	for {
		start := time.Now()
		events, changes, err := l.Trim(ctx, retention)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logger.Error("ledger retention failed", "err", err)
		case events+changes > 0:
			logger.Info("ledger retention", "events_deleted", events, "changes_deleted", changes,
				"took_ms", time.Since(start).Milliseconds())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
