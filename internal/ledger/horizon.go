package ledger

import (
	"context"
	"fmt"
	"time"
)

// horizonLagSQL reads the read horizon (the oldest transaction still
// running, below which the feed is readable: ReadSQL) and the snapshot's
// xmax (one past the latest transaction that completed). Below xmax and
// at or above xmin are transactions that completed and are not readable
// yet: while xmin is below xmax, the feed is held back. (xmin equals xmax
// when nothing runs, and also when the one transaction running is the
// latest: then nothing waits behind it.)
const horizonLagSQL = `SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text FROM pg_current_snapshot() s`

// HorizonWatch measures how long the read horizon has been held back by
// one open transaction: the feed is frozen behind it (a consumer reads
// nothing committed after it began), which otherwise looks like a quiet
// feed. It needs no privilege (pg_stat_activity hides other users'
// transactions): it samples the horizon, and a horizon that stays on one
// running transaction, with completed ones waiting behind it, from sample
// to sample has been held since the first sample that saw it so. The figure is late by at most one sampling interval.
type HorizonWatch struct {
	horizon string
	since   time.Time
}

// Sample reads the horizon on q and returns how long it has been held.
func (w *HorizonWatch) Sample(ctx context.Context, q queryRower, now time.Time) (time.Duration, error) {
	var xmin, xmax string
	if err := q.QueryRow(ctx, horizonLagSQL).Scan(&xmin, &xmax); err != nil {
		return 0, fmt.Errorf("read horizon: %w", err)
	}
	if xmin == xmax {
		w.horizon = ""
		return 0, nil
	}
	if xmin != w.horizon {
		w.horizon, w.since = xmin, now
	}
	return now.Sub(w.since), nil
}
