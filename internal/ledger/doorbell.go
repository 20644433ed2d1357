package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BellInterval is how often a replica's Doorbell looks for changes that
// have become readable: the most a consumer waiting on LISTEN waits past a
// change's commit, about.
const BellInterval = 100 * time.Millisecond

// bellSQL finds the changes the consumer query (ReadSQL) can read now and
// could not at the last look: those whose transactions are below the
// horizon now and were not at $1, the horizon then. It returns the horizon
// and the newest such change's id, NULL when there is none. It must read
// only that range of the index on (txid, id): written as a plain max(id)
// with the horizon inline, Postgres walked the primary key backwards and
// took a snapshot per row (21 ms a look under make bench, and the whole
// table whenever the range was empty). The horizon is taken once (h), and
// OFFSET 0 keeps max from turning into that backward walk.
// TestDoorbellPlan holds the plan to the range.
const bellSQL = `
WITH h AS MATERIALIZED (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS hi)
SELECT (SELECT hi FROM h)::text,
       (SELECT max(s.id) FROM (
            SELECT c.id FROM changes c
            WHERE c.txid >= $1::text::xid8 AND c.txid < (SELECT hi FROM h)
            OFFSET 0) s)`

const horizonSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`

// Doorbell rings Channel, with the newest change's id, when changes have
// become readable: after their transactions committed, and once no older
// transaction still running can add a row before them. The writing
// transactions do not ring it themselves. A NOTIFY takes a cluster-wide
// lock from its transaction's pre-commit to its end (async.c), and the
// try-lock that let one delivery at a time ring was itself a lock every
// delivery took: against the build before the ledger, first deliveries
// cost 69 % more CPU with the bell in their transactions and 9 % more
// without it (one run each, docs/PERFORMANCE.md). A bell rung by each
// replica at most every BellInterval costs nothing per delivery, and a
// rollback still never rings. Consumers treat it as a doorbell either way: the consumer
// query is the truth (docs/APP.md).
//
// A Doorbell is one goroutine's: Ring keeps where it last looked.
type Doorbell struct {
	pool *pgxpool.Pool
	lo   string // the horizon at the last look
}

// NewDoorbell returns a Doorbell on pool.
func NewDoorbell(pool *pgxpool.Pool) *Doorbell { return &Doorbell{pool: pool} }

// Ring looks once, and rings if changes have become readable since the
// last look; the first look only sets where the next one starts. It
// returns the id it rang with, 0 for none.
func (d *Doorbell) Ring(ctx context.Context) (int64, error) {
	if d.lo == "" {
		if err := d.pool.QueryRow(ctx, horizonSQL).Scan(&d.lo); err != nil {
			return 0, fmt.Errorf("doorbell: %w", err)
		}
		return 0, nil
	}
	var hi string
	var newest *int64
	if err := d.pool.QueryRow(ctx, bellSQL, d.lo).Scan(&hi, &newest); err != nil {
		return 0, fmt.Errorf("doorbell: %w", err)
	}
	d.lo = hi
	if newest == nil {
		return 0, nil
	}
	if _, err := d.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel, strconv.FormatInt(*newest, 10)); err != nil {
		return 0, fmt.Errorf("doorbell: %w", err)
	}
	return *newest, nil
}

// Run rings every BellInterval until ctx ends. A failed look is logged and
// tried again at the next tick: a consumer that misses a bell reads at its
// next poll.
func (d *Doorbell) Run(ctx context.Context, logger *slog.Logger) {
	t := time.NewTicker(BellInterval)
	defer t.Stop()
	for {
		if _, err := d.Ring(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("change feed doorbell failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
