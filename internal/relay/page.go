package relay

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// A page of the feed goes straight from the read to the destination: a
// change is sent as the page read it, and its outcome is inserted once,
// final, in one statement for the page (or for what a flush interval
// finished), in the transaction that moves the cursor past the page. A
// change delivered at its first try costs one row and a share of one
// cursor update; the rows that live and change (attempts, next attempt,
// last error) are only those of what failed or must wait. Before, every
// change was inserted as pending, read back, sent, then updated: two
// tuples and a round trip more per change.
//
// Once: the cursor moves past a change only in the transaction that
// records its outcome, so a crash between send and record leaves the
// cursor before the change, and the next leader (this release or the
// previous one) sends it again with the same identity. Outcomes a flush
// recorded before the cursor moved have rows past the cursor: the next
// read skips them (pageStateSQL's taken), and the previous release's
// take leaves them as they are (its insert does nothing on conflict).
//
// Order: a change whose order key has an open (pending or failed)
// delivery is not sent; it is recorded pending and goes by the due query
// once the older ones are done, as every change went before. Within the
// page, the changes of one key go one after another, and the first that
// fails makes the rest of its key pending.

// pageStateSQL reads, for a page, the order keys ($2) that have an open
// delivery and the changes ($3) that already have a row. Each key is one
// probe of the open index (a subquery with LIMIT, which no plan turns into
// a scan of every open delivery, see dueSQL) and each change one of the
// primary key.
const pageStateSQL = `
SELECT 'open', k FROM unnest($2::text[]) k
WHERE (SELECT true FROM relay_deliveries o
       WHERE o.consumer = $1 AND o.order_key = k AND o.state IN ('pending', 'failed')
       LIMIT 1)
UNION ALL
SELECT 'taken', d.change_id::text FROM relay_deliveries d
WHERE d.consumer = $1 AND d.change_id = ANY($3::bigint[])`

// insertOutcomesSQL records outcomes, final or pending, one row each, in
// one statement. A change that has a row already keeps it (pageStateSQL
// left it out; this is only the last word on a race with no winner).
const insertOutcomesSQL = `
INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts,
    next_attempt_at, last_error, result, delivered_at, change)
SELECT $1, t.id, t.subject, t.key, t.state, t.attempts,
    CASE WHEN t.state = 'pending' THEN now() ELSE t.next END, t.last_error, t.result,
    CASE WHEN t.state = 'delivered' THEN now() END, t.change
FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::int[], $7::timestamptz[],
    $8::text[], $9::text[], $10::jsonb[])
    AS t(id, subject, key, state, attempts, next, last_error, result, change)
ON CONFLICT (consumer, change_id) DO NOTHING`

// moveSQL moves a consumer's cursor.
const moveSQL = `UPDATE feed_consumers SET cursor = $2, floor = $3::text::xid8, updated_at = now() WHERE name = $1`

// taken is a change of a page, with its order key and, once known, its
// outcome (pending: waits for an older change of its key).
type taken struct {
	delivery
	key     string
	pending bool
}

// idleMoveEvery is how often, at most, a page with nothing for its
// consumer (an empty page read only because the server's read horizon
// moved, or one of other kinds only) stores the cursor it moved. On a
// shared server the horizon moves with every transaction of any
// database, and storing each move cost a row version of feed_consumers
// a poll on an idle feed. The stored cursor lags the one in memory by
// this much at most: what it has not passed is read again, harmlessly,
// by a successor (nothing in it is for the consumer), and retention
// keeps a few seconds more.
const idleMoveEvery = 5 * time.Second

// take reads a page of the feed after cur, sends the changes c wants and
// records their outcomes, moving c's cursor past the page in the last
// transaction. It returns how many changes the page held, the cursor
// after them, and whether it stored that cursor: a page with nothing for
// c stores it only when lazy is false (see idleMoveEvery).
func (r *Relay) take(ctx context.Context, fence Fence, c Consumer, cur ledger.Cursor, lazy bool) (int, ledger.Cursor, bool, error) {
	page, next, err := ledger.Read(ctx, r.pool, cur, r.batch)
	if err != nil {
		return 0, cur, false, err
	}
	if next.String() == cur.String() {
		return 0, cur, false, nil // nothing new, not even the horizon
	}
	var items []*taken
	for _, ch := range page {
		if c.takes(ch) {
			items = append(items, &taken{delivery: delivery{change: ch}, key: c.orderKey(ch)})
		}
	}
	if len(items) == 0 && lazy {
		return len(page), next, false, nil // nothing to record: the cursor is stored later
	}
	// The fence is checked before anything is sent, in the transaction
	// that reads what the page must wait for.
	var open map[string]bool
	if len(items) > 0 {
		err := r.inTx(ctx, fence, func(tx pgx.Tx) error {
			o, have, err := r.pageState(ctx, tx, c.Name, items)
			open = o
			items = slices.DeleteFunc(items, func(t *taken) bool { return have[t.change.ID] })
			return err
		})
		if err != nil {
			return 0, cur, false, fmt.Errorf("relay %s: take changes: %w", c.Name, err)
		}
	}
	if err := r.sendPage(ctx, fence, c, items, open, next); err != nil {
		return 0, cur, false, err
	}
	return len(page), next, true, nil
}

// pageState runs pageStateSQL for items.
func (r *Relay) pageState(ctx context.Context, tx pgx.Tx, consumer string, items []*taken) (open map[string]bool, have map[int64]bool, err error) {
	var keys []string
	ids := make([]int64, len(items))
	for i, t := range items {
		ids[i] = t.change.ID
		if !slices.Contains(keys, t.key) {
			keys = append(keys, t.key)
		}
	}
	rows, err := tx.Query(ctx, pageStateSQL, r.batchArgs(consumer, keys, ids)...)
	if err != nil {
		return nil, nil, fmt.Errorf("page state: %w", err)
	}
	open, have = map[string]bool{}, map[int64]bool{}
	var what, v string
	_, err = pgx.ForEachRow(rows, []any{&what, &v}, func() error {
		if what == "open" {
			open[v] = true
			return nil
		}
		id, err := strconv.ParseInt(v, 10, 64)
		have[id] = true
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("page state: %w", err)
	}
	return open, have, nil
}

// sendPage sends items, one chain per order key (Parallel chains at
// once), and records their outcomes as they come, one statement for all
// those done within a flush interval; the last records the rest and moves
// the cursor to next. Cut short (ctx ended, a record failed), what is not
// recorded is sent again from the cursor, which has not moved.
func (r *Relay) sendPage(ctx context.Context, fence Fence, c Consumer, items []*taken, open map[string]bool, next ledger.Cursor) error {
	var chains [][]*taken
	at := map[string]int{}
	var outcomes []*taken
	for _, t := range items {
		if open[t.key] {
			t.pending = true
			outcomes = append(outcomes, t)
			continue
		}
		i, ok := at[t.key]
		if !ok {
			i = len(chains)
			at[t.key] = i
			chains = append(chains, nil)
		}
		chains[i] = append(chains[i], t)
	}
	return r.sendAndRecord(ctx, c, chains, func(outcomes []*taken, last bool) error {
		if len(outcomes) == 0 && !last {
			return nil
		}
		err := r.inTx(ctx, fence, func(tx pgx.Tx) error {
			if err := r.insertOutcomes(ctx, tx, c.Name, outcomes); err != nil {
				return err
			}
			if !last {
				return nil
			}
			_, err := tx.Exec(ctx, moveSQL, c.Name, next.String(), fmt.Sprint(next.Floor()))
			return err
		})
		if err != nil {
			return fmt.Errorf("relay %s: record deliveries: %w", c.Name, err)
		}
		r.noteAll(ctx, c.Name, outcomes)
		return nil
	}, outcomes...)
}

// flushEvery is how often sendAndRecord records the outcomes it has.
const flushEvery = time.Second

// sendAndRecord sends chains (sendChains) without holding a connection
// while they wait on the far side, and has record write the outcomes as
// they come (those given first, then every flush interval's), and once
// more, last, when every chain is done: a slow or rate-limited
// destination's first outcomes are on record (and visible) long before
// the batch's last. Cut short (ctx ended, a record failed), what is not
// recorded is not recorded: it runs again.
func (r *Relay) sendAndRecord(ctx context.Context, c Consumer, chains [][]*taken, record func(outcomes []*taken, last bool) error, outcomes ...*taken) error {
	actx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan *taken)
	go func() {
		r.sendChains(actx, c, chains, done)
		close(done)
	}()
	flush := func(last bool) error {
		if ctx.Err() != nil {
			return nil // cut short: what is not recorded runs again
		}
		err := record(outcomes, last)
		outcomes = outcomes[:0]
		return err
	}
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case t, ok := <-done:
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return flush(true)
			}
			if actx.Err() == nil {
				outcomes = append(outcomes, t)
			}
		case <-tick.C:
			if err := flush(false); err != nil {
				stop() // the chains not begun are not begun; those running end
				for range done {
				}
				return err
			}
		}
	}
}

// sendChains sends each chain's changes in order, Parallel chains at a
// time, and each outcome on done as it comes. A change that fails (to be
// retried) ends its chain: the rest go on done as pending. Once ctx ends
// it starts no more.
func (r *Relay) sendChains(ctx context.Context, c Consumer, chains [][]*taken, done chan<- *taken) {
	sem := make(chan struct{}, max(c.Parallel, 1))
	var wg sync.WaitGroup
	for _, chain := range chains {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			for i, t := range chain {
				actx, cancel := context.WithTimeout(ctx, r.timeout)
				actx, span := r.span(actx, c, t.change)
				t.span = span.SpanContext()
				t.result, t.err = c.Destination.Deliver(actx, t.change)
				endSpan(span, t.result, t.err)
				cancel()
				if ctx.Err() != nil {
					return // not recorded: sent again from the cursor
				}
				done <- t
				if r.outcome(&t.delivery, r.now()).state == Failed {
					for _, rest := range chain[i+1:] {
						rest.pending = true
						done <- rest
					}
					return
				}
			}
		})
	}
	wg.Wait()
}

// insertOutcomes runs insertOutcomesSQL for outcomes.
func (r *Relay) insertOutcomes(ctx context.Context, tx pgx.Tx, consumer string, outcomes []*taken) error {
	if len(outcomes) == 0 {
		return nil
	}
	n := len(outcomes)
	ids, attempts := make([]int64, n), make([]int32, n)
	// The bodies go as text: in the exec and simple protocol modes that a
	// transaction pooler needs, pgx would send [][]byte as bytea[], which
	// does not cast to jsonb[].
	subjects, keys, states, bodies := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	nexts, lastErrors, results := make([]*time.Time, n), make([]*string, n), make([]*string, n)
	now := r.now()
	for i, t := range outcomes {
		ids[i], subjects[i], keys[i] = t.change.ID, t.change.Subject, t.key
		if t.pending {
			states[i] = string(Pending)
		} else {
			t.out = r.outcome(&t.delivery, now)
		}
		// The change is kept for what may be sent again (relay retry, the
		// due query); a delivered or skipped one never is, by this release
		// or the previous, so its row keeps no copy.
		bodies[i] = "{}"
		if t.pending || (t.out.state != Delivered && t.out.state != Skipped) {
			body, err := marshalChange(t.change)
			if err != nil {
				return err
			}
			bodies[i] = string(body)
		}
		if t.pending {
			continue
		}
		o := t.out
		states[i], attempts[i], nexts[i] = string(o.state), 1, o.next
		if o.lastError != "" {
			lastErrors[i] = &o.lastError
		}
		if t.result != "" {
			results[i] = &t.result
		}
	}
	_, err := tx.Exec(ctx, insertOutcomesSQL, r.batchArgs(consumer, ids, subjects, keys, states, attempts, nexts, lastErrors, results, bodies)...)
	return err
}

// noteAll logs and counts the attempts of outcomes, once recorded.
func (r *Relay) noteAll(ctx context.Context, consumer string, outcomes []*taken) {
	for _, t := range outcomes {
		if !t.pending {
			r.note(ctx, consumer, &t.delivery)
		}
	}
}
