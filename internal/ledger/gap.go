package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// ErrCursorExpired: retention has deleted changes the cursor had not read.
// Reading on from it would skip them silently.
var ErrCursorExpired = errors.New("cursor is older than the oldest change kept (EVENTS_RETENTION deleted changes it had not read)")

// gapSQL compares a cursor's floor with the highest txid retention has
// deleted (migration 00013's changes_trimmed, NULL while nothing was).
// A deleted change at or above the floor may be one the cursor had not
// read. (A cursor in the middle of a window may have read it after all:
// the check is on the safe side, and only a consumer as old as the
// retention meets it.)
const gapSQL = `SELECT coalesce(through_txid >= $1::text::xid8, false) FROM changes_trimmed`

// queryRower is what CheckCursor runs on: a pool, a connection or a
// transaction.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckCursor returns an error wrapping ErrCursorExpired when retention
// has deleted a change that c may not have read, nil when reading on from
// c misses nothing. The zero cursor (the start of whatever is kept) is
// never expired.
func CheckCursor(ctx context.Context, q queryRower, c Cursor) error {
	if c == (Cursor{}) {
		return nil
	}
	var expired bool
	if err := q.QueryRow(ctx, gapSQL, strconv.FormatUint(c.Floor(), 10)).Scan(&expired); err != nil {
		return fmt.Errorf("check cursor: %w", err)
	}
	if expired {
		return fmt.Errorf("cursor %s: %w", c, ErrCursorExpired)
	}
	return nil
}
