package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// trimBatch is how many rows one DELETE removes: small enough that each
// statement holds its locks and its share of the disk for milliseconds,
// so deliveries running beside it keep their latency.
const trimBatch = 1000

// Trim's pace by default. Unpaced, a pass over 900k expired rows of each
// table took 16 s and wrote 725 MB of WAL: more than max_wal_size lets
// through between checkpoints, so it forced one, and deliveries stalled
// for 60-123 ms 15-50 s later (issue 37). At 5,000 rows a second a pass
// wrote about 2 MB of WAL a second, which the checkpoints Postgres times
// itself absorb, but on 2 cores the deliveries' writes beside it had a p99
// 1.54 times their level before; at trimRate, 1.03 times (TestPacedTrimLatency,
// docs/PERFORMANCE.md). trimBudget bounds a pass: a larger backlog (a retention
// shortened, a service started on an old database) is worked off over
// several passes, RunRetention's interval apart, rather than in one long
// burst. At 1M rows every 10 minutes, that is about 140M rows a day,
// 1,600 a second: far above what deliveries add.
const (
	trimRate   = 2500
	trimBudget = 1_000_000
)

// TrimPace is how fast Trim deletes: at most Rate rows a second (0: no
// rate, only the pause after each batch as long as the batch took), and at
// most Budget rows a pass (0: no budget).
type TrimPace struct {
	Rate   int
	Budget int64
}

// SetTrimPace replaces the default pace (2,500 rows a second, 1M rows a
// pass), for a test or a benchmark that trims faster. Call it before the
// Ledger is shared.
func (l *Ledger) SetTrimPace(p TrimPace) { l.pace = p }

// trimLockSQL lets one replica trim at a time. The lock is a transaction
// lock taken per batch, so it can never outlive a connection handed back
// to the pool, and a replica that finds it held skips its pass: the
// holder is doing the work. The key is this service's own: hashtext of
// the tables' names.
const trimLockSQL = `SELECT pg_try_advisory_xact_lock(hashtext('webhook_events'), hashtext('changes'))`

// The trims go by the indexes on first_seen_at and at, in batches named
// by id: the oldest rows first, none twice. A change goes only once both
// the read horizon and every enabled consumer (feed_consumers) have
// passed it: its at is when its transaction began, so a transaction held
// open past the retention would otherwise commit a row that is already
// expired, and be deleted before anyone could read it; and a relay
// consumer that lags (Resend down for a day) must find its changes still
// there. What it deletes raises changes_trimmed's watermark, against
// which a cursor is checked for a gap (CheckCursor). An event's age runs from its
// last attempt: a dead event retried by hand on day 29, and failing
// again, keeps its row and the body a later retry needs for another
// retention period.
const (
	trimEventsSQL = `
DELETE FROM webhook_events WHERE id IN (
    SELECT id FROM webhook_events
    WHERE first_seen_at < $1 AND coalesce(finished_at, first_seen_at) < $1
    ORDER BY first_seen_at LIMIT $2)`
	trimChangesSQL = `
WITH doomed AS (
    SELECT id, txid FROM changes
    WHERE at < $1
      AND txid < pg_snapshot_xmin(pg_current_snapshot())
      AND txid < ALL (SELECT floor FROM feed_consumers WHERE enabled)
    ORDER BY at LIMIT $2
), marked AS (
    UPDATE changes_trimmed SET through_txid = greatest(through_txid, d.txid)
    FROM (SELECT txid FROM doomed ORDER BY txid DESC LIMIT 1) d
)
DELETE FROM changes WHERE id IN (SELECT id FROM doomed)`
)

// errLockHeld: another replica is trimming.
var errLockHeld = errors.New("another replica holds the trim lock")

// Trim deletes the rows of webhook_events and changes older than
// retention, trimBatch at a time, a batch of each table in turn, and
// returns how many it deleted. It paces itself (TrimPace): after each
// batch it pauses at least as long as the batch took (so it takes at most
// about half of one core), and longer if it is ahead of the rate; it stops
// once the pass's budget is spent, leaving the rest to the next pass. It
// returns early, with no error, when another replica is trimming.
func (l *Ledger) Trim(ctx context.Context, retention time.Duration) (events, changes int64, err error) {
	cutoff := time.Now().Add(-retention)
	tables := []struct {
		sql  string
		n    *int64
		done bool
	}{{trimEventsSQL, &events, false}, {trimChangesSQL, &changes, false}}
	start := time.Now()
	for {
		progress := false
		for i := range tables {
			t := &tables[i]
			if t.done {
				continue
			}
			if l.pace.Budget > 0 && events+changes >= l.pace.Budget {
				return events, changes, nil
			}
			began := time.Now()
			n, err := l.trimBatch(ctx, t.sql, cutoff)
			*t.n += n
			if errors.Is(err, errLockHeld) {
				return events, changes, nil
			}
			if err != nil {
				return events, changes, err
			}
			t.done = n < trimBatch
			progress = progress || !t.done
			if t.done {
				continue
			}
			pause := time.Since(began)
			if l.pace.Rate > 0 {
				due := start.Add(time.Duration(events+changes) * time.Second / time.Duration(l.pace.Rate))
				pause = max(pause, time.Until(due))
			}
			select {
			case <-ctx.Done():
				return events, changes, ctx.Err()
			case <-time.After(pause):
			}
		}
		if !progress {
			return events, changes, nil
		}
	}
}

func (l *Ledger) trimBatch(ctx context.Context, sql string, cutoff time.Time) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var got bool
		if err := tx.QueryRow(ctx, trimLockSQL).Scan(&got); err != nil {
			return err
		}
		if !got {
			return errLockHeld
		}
		tag, err := tx.Exec(ctx, sql, cutoff, trimBatch)
		n = tag.RowsAffected()
		return err
	})
	if err != nil && !errors.Is(err, errLockHeld) {
		return 0, fmt.Errorf("trim ledger: %w", err)
	}
	return n, err
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
		passCtx, end := tracing.Root(ctx, l.tracer, "ledger retention")
		events, changes, err := l.Trim(passCtx, retention)
		end(err)
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
