package relay

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

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
// (Postgres hands out ids in that order), so every change committed
// before Register began is before it. A transaction that had written
// before the registration and is still running is before it too, even
// though it commits later; so Register returns only once the read
// horizon has passed the start (every such transaction has ended), and
// every change committed after Register returns, by any replica, is
// after the start.
const (
	startSQL = `SELECT pg_current_xact_id()::text`
	// passedSQL: no transaction that took its id before $1 still runs
	// (the horizon the feed is read below has passed it).
	passedSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8`
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

// DefaultRegisterWait is Config.RegisterWait's default: how long
// Register waits for the transactions older than a new start to end. A
// transaction held open longer (in any database of the server:
// transaction ids are the server's) delays no start-up beyond it; what it
// commits then counts as before the start.
const DefaultRegisterWait = 5 * time.Second

// Register records the start of each consumer r has that feed_consumers
// does not know yet (its cursor at the end of the feed, enabled; for
// app_access, the start of its ends of access too), and marks the known
// ones enabled, their cursors untouched. serve calls it
// before its listener accepts anything, so that every change the replica
// accepts is after its consumers' start, whichever replica leads the
// relay and whenever it gets to them. It waits up to Config.RegisterWait
// for older transactions, and only when it recorded a start.
func (r *Relay) Register(ctx context.Context) error {
	names := r.names()
	if len(names) == 0 {
		return nil
	}
	var added, reenabled []string
	var start uint64
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		if added, start, err = addConsumers(ctx, tx, names); err != nil {
			return err
		}
		if err := startExpiry(ctx, tx, names); err != nil {
			return err
		}
		reenabled, err = collectNames(tx.Query(ctx, reenableSQL, names))
		return err
	})
	if err != nil {
		return fmt.Errorf("relay: register consumers: %w", err)
	}
	if len(added) > 0 {
		if err := r.waitPassed(ctx, start, r.registerWait); err != nil {
			return fmt.Errorf("relay: register consumers: %w", err)
		}
	}
	for _, n := range names {
		switch {
		case slices.Contains(added, n):
			r.logger.Info("relay consumer starts now: changes from here on are delivered", "consumer", n,
				"cursor", ledger.Cursor{Lo: start}.String())
		case slices.Contains(reenabled, n):
			r.logger.Info("relay consumer enabled again: it goes on from its cursor", "consumer", n)
		}
	}
	return nil
}

// waitPassed waits, up to wait, until no transaction that took its id
// before start still runs.
func (r *Relay) waitPassed(ctx context.Context, start uint64, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		var passed bool
		if err := r.pool.QueryRow(ctx, passedSQL, strconv.FormatUint(start, 10)).Scan(&passed); err != nil {
			return fmt.Errorf("wait for older transactions: %w", err)
		}
		if passed {
			return nil
		}
		if time.Now().After(deadline) {
			r.logger.Warn("relay consumer start: a transaction older than it is still running; a change it commits counts as before the start",
				"waited", wait.String())
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// addConsumers gives each of names that has no row yet its start in tx:
// it returns those it added and the start (tx's own transaction id).
func addConsumers(ctx context.Context, tx pgx.Tx, names []string) ([]string, uint64, error) {
	var s string
	if err := tx.QueryRow(ctx, startSQL).Scan(&s); err != nil {
		return nil, 0, err
	}
	txid, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("start of the feed %q: %w", s, err)
	}
	start := ledger.Cursor{Lo: txid}
	added, err := collectNames(tx.Query(ctx, addConsumerSQL, names, start.String(), fmt.Sprint(start.Floor())))
	return added, txid, err
}

// startExpiry records, when names has app_access, where its ends of
// access start (access_expiry, as of now) unless they already have a
// mark: with the consumer's start, so that an ending that passes before
// any relay leader with access runs its first pass is sent too.
func startExpiry(ctx context.Context, tx pgx.Tx, names []string) error {
	if !slices.Contains(names, AppAccessConsumer) {
		return nil
	}
	_, err := tx.Exec(ctx, expiryStartSQL, AppAccessConsumer)
	return err
}

func collectNames(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
