package relay

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// A consumer starts when the first replica configured with its
// destination starts, not when the relay's leader first runs it: a
// replica takes deliveries from its first second, possibly while another
// replica (one without the destination, such as the previous release in
// a rolling deploy) leads the relay, and what it takes must not fall
// behind a start recorded later.
//
// The start is a position in the feed's (txid, id) order: the
// registering transaction's own transaction id. A change is after it
// when its transaction wrote its first row after the registration did
// (Postgres hands out ids in that order), so every change this replica
// accepts once Register has returned is delivered, and every change
// committed before Register began is not. A change another replica was
// writing while Register ran counts as before it if it had begun
// writing first, even if it commits a moment later: the feed's order is
// by transaction id, and so is the start.
const (
	startSQL = `SELECT pg_current_xact_id()::text`
	// addConsumerSQL leaves a consumer that already has a row as it is:
	// later replicas and restarts never move its cursor.
	addConsumerSQL = `
INSERT INTO feed_consumers (name, cursor, updated_at, floor, enabled)
SELECT n, $2, now(), $3::text::xid8, true FROM unnest($1::text[]) n
ON CONFLICT (name) DO NOTHING
RETURNING name`
	// reenableSQL marks a known consumer enabled again: a relay leader
	// without it (the previous release, mid-rollout) marked it not, and
	// while a configured replica runs, retention should hold its changes
	// for it. Its cursor stays where it was.
	reenableSQL = `UPDATE feed_consumers SET enabled = true WHERE name = ANY($1::text[]) AND NOT enabled RETURNING name`
)

// Register records the start of each consumer r has that feed_consumers
// does not know yet (its cursor at the end of the feed, enabled), and
// marks the known ones enabled, their cursors untouched. serve calls it
// before its listener accepts anything, so that every change the replica
// accepts is after its consumers' start, whichever replica leads the
// relay and whenever it gets to them.
func (r *Relay) Register(ctx context.Context) error {
	names := r.names()
	if len(names) == 0 {
		return nil
	}
	var added, reenabled []string
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		if added, err = addConsumers(ctx, tx, names); err != nil {
			return err
		}
		reenabled, err = collectNames(tx.Query(ctx, reenableSQL, names))
		return err
	})
	if err != nil {
		return fmt.Errorf("relay: register consumers: %w", err)
	}
	for _, n := range names {
		switch {
		case slices.Contains(added, n):
			r.logger.Info("relay consumer starts now: changes from here on are delivered", "consumer", n)
		case slices.Contains(reenabled, n):
			r.logger.Info("relay consumer enabled again: it goes on from its cursor", "consumer", n)
		}
	}
	return nil
}

// addConsumers gives each of names that has no row yet its start in tx,
// and returns those it added.
func addConsumers(ctx context.Context, tx pgx.Tx, names []string) ([]string, error) {
	var s string
	if err := tx.QueryRow(ctx, startSQL).Scan(&s); err != nil {
		return nil, err
	}
	txid, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("start of the feed %q: %w", s, err)
	}
	start := ledger.Cursor{Lo: txid}
	return collectNames(tx.Query(ctx, addConsumerSQL, names, start.String(), fmt.Sprint(start.Floor())))
}

func collectNames(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
