package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Change kinds, as stored in changes.kind.
const (
	KindSubscription     = "subscription"
	KindCustomerFeatures = "customer_features"
	KindCheckoutSession  = "checkout_session"
	KindSupportMessage   = "support_message"
)

// Channel is the NOTIFY channel a committed change rings, with its id as
// the payload.
const Channel = "munchable_changes"

// AppendCTE appends the feed's row for a change, in the statement that
// makes it. It is a fragment of a WITH list: the statement defines
//
//	old(j)                                   -- the row before, as jsonb; no row when new
//	new(kind, subject, customer, event_id, j) -- the row written; no row when none was
//
// with bookkeeping (updated_at, last_event_*) left out of both j. Only the
// fields that differ are kept, before and after; before is null for a new
// row; nothing is appended when no field differs (a replay, an event that
// moved only bookkeeping). The diff is migration 00008's ledger_diff, a
// function, so that Postgres builds it only when it runs (OFFSET 0 keeps
// it to one call per row).
//
// The feed's order is (txid, id), and for one row both are commit order.
// txid is the transaction's id, which Postgres assigns at its first
// write; every writer of a row the feed follows takes the row's advisory
// lock (which writes nothing) before anything else in its transaction, so
// of two transactions that change one row, the one that waited gets its
// txid after the other committed, a larger one. The id is drawn (nextval)
// when the row is inserted, after new's rows exist, so after the lock too
// (docs/APP.md builds the consumer's order on both).
//
// The writing transaction sends no NOTIFY: the Doorbell rings for it once
// it has committed (see there for why).
const AppendCTE = `
change(kind, subject, customer, event_id, before, after) AS (
    SELECT n.kind, n.subject, n.customer, n.event_id, (d.c).before, (d.c).after
    FROM new n
    LEFT JOIN old o ON true
    CROSS JOIN LATERAL (SELECT ledger_diff(o.j, n.j) AS c OFFSET 0) d
    WHERE (d.c).after IS NOT NULL
),` + AppendChangeCTE

// AppendChangeCTE appends the feed's row from change(kind, subject,
// customer, event_id, before, after), for a statement that works out the
// change itself (applySQL: a new subscription's change is the state the
// service built, with no diff to run, and only an existing one's calls
// ledger_diff). It has at most one row, and one only when something
// changed; it must read the written row (up) so that the id is drawn after
// that row's lock is held.
const AppendChangeCTE = `
appended AS (
    INSERT INTO changes (at, kind, subject, stripe_customer_id, event_id, before, after, traceparent)
    SELECT now(), c.kind, c.subject, c.customer, c.event_id, c.before, c.after, ` + traceparentSQL + `
    FROM change c
    RETURNING id
)`

// Change is one row of the feed.
type Change struct {
	ID               int64           `json:"id"`
	At               time.Time       `json:"at"`
	Kind             string          `json:"kind"`
	Subject          string          `json:"subject"`
	StripeCustomerID *string         `json:"stripe_customer_id"`
	EventID          *string         `json:"event_id"`
	Before           json.RawMessage `json:"before"`
	After            json.RawMessage `json:"after"`
	// Cursor resumes the feed just after this change.
	Cursor Cursor `json:"cursor"`
	// Traceparent is the delivery span that made the change, when its
	// trace was sampled ("" otherwise): the relay continues that trace.
	// Not part of the feed's JSON.
	Traceparent string `json:"-"`
}

// Cursor is a consumer's position in the feed, whose order is (txid, id):
// Lo and Last are the txid and id of the last change read, and every
// change at or before it in that order has been read (Last 0: every change
// whose txid is below Lo). Its string form is opaque to consumers,
// c2.<txid>.<id>; the zero Cursor is the start of the feed.
//
// Hi is set only by a cursor the first release printed inside one of its
// windows (c1.lo.hi.last: the changes with txid in [lo, hi) up to id last,
// and every one below lo, have been read). Read finishes that window as
// the first release did, then goes on in (txid, id) order: nothing is lost
// or read twice.
type Cursor struct {
	Lo, Hi uint64
	Last   int64
}

// String is the cursor's opaque form.
func (c Cursor) String() string {
	if c.Hi != 0 {
		return fmt.Sprintf("c1.%d.%d.%d", c.Lo, c.Hi, c.Last)
	}
	return fmt.Sprintf("c2.%d.%d", c.Lo, c.Last)
}

// Floor is the cursor's floor: every change whose txid is below Floor has
// been read at c. Retention keeps what an enabled consumer's floor has not
// passed, and a floor at or below what retention deleted is a gap.
func (c Cursor) Floor() uint64 { return c.Lo }

// Passed reports whether the change (txid, id) has been read at c: it is
// at or before c in the feed's (txid, id) order.
func (c Cursor) Passed(txid uint64, id int64) bool {
	switch {
	case txid < c.Lo:
		return true
	case c.Hi != 0: // a first-release window: [Lo, Hi) up to id Last
		return txid < c.Hi && id <= c.Last
	default:
		return txid == c.Lo && id <= c.Last
	}
}

// MarshalText makes a Cursor print as its string in JSON.
func (c Cursor) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// ErrCursor: the string is not a cursor this service printed.
var ErrCursor = errors.New("not a changes cursor")

// ParseCursor reads a cursor's string form; "" is the start of the feed.
// It reads the first release's c1 cursors too: c1.lo.0.0, between windows,
// is the position c2.lo.0.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	bad := fmt.Errorf("%q: %w", s, ErrCursor)
	parts := strings.Split(s, ".")
	var c Cursor
	var err1, err2, err3 error
	switch {
	case len(parts) == 3 && parts[0] == "c2":
		c.Lo, err1 = strconv.ParseUint(parts[1], 10, 64)
		c.Last, err2 = strconv.ParseInt(parts[2], 10, 64)
	case len(parts) == 4 && parts[0] == "c1":
		c.Lo, err1 = strconv.ParseUint(parts[1], 10, 64)
		c.Hi, err2 = strconv.ParseUint(parts[2], 10, 64)
		c.Last, err3 = strconv.ParseInt(parts[3], 10, 64)
		// Between windows the first release printed last 0 (c1.lo.0.0).
		if c.Hi == 0 && c.Last != 0 || c.Hi != 0 && c.Hi < c.Lo {
			return Cursor{}, bad
		}
	default:
		return Cursor{}, bad
	}
	if err := errors.Join(err1, err2, err3); err != nil || c.Last < 0 {
		return Cursor{}, bad
	}
	return c, nil
}

// ReadSQL is the consumer query (docs/APP.md quotes it). It reads the
// changes after the cursor ($1 txid, $2 id) in (txid, id) order, up to $3
// of them, below the horizon: the oldest transaction id still running
// when the statement's snapshot was taken. Every transaction below it has
// finished and its rows are all visible; no transaction that commits later
// can add a row below it, so a change is read only once no earlier one in
// this order can still appear. For any one row of the app's tables txid
// order is commit order (AppendCTE).
//
// The cursor and the order are those of the index changes_txid (txid, id),
// so a page is one range scan of that index from the cursor, whatever the
// plan: it costs the same at the feed's start and at its end, on a new
// connection or one whose plans have gone generic. The first column is the
// horizon, on every row; an empty page comes back as one row with NULLs.
// MATERIALIZED takes the horizon once, for the filter and the first column
// alike.
const ReadSQL = `
WITH h AS MATERIALIZED (
    SELECT pg_snapshot_xmin(pg_current_snapshot()) AS hi
)
SELECT h.hi::text, c.txid::text, c.id, c.at, c.kind, c.subject,
       c.stripe_customer_id, c.event_id, c.before, c.after, c.traceparent
FROM h
LEFT JOIN LATERAL (
    SELECT * FROM changes
    WHERE (txid, id) > ($1::text::xid8, $2::bigint) AND txid < h.hi
    ORDER BY txid, id
    LIMIT $3
) c ON true
ORDER BY c.txid, c.id`

// readWindowSQL finishes a window of the first release's cursor (Cursor.Hi
// set): the changes with txid in [$1, $2) after id $3, by id, as that
// release read them. A consumer reads it at most once, on its first read
// after the upgrade; the window's last page walks the ids after $3.
const readWindowSQL = `
SELECT id, at, kind, subject, stripe_customer_id, event_id, before, after, coalesce(traceparent, '')
FROM changes
WHERE txid >= $1::text::xid8 AND txid < $2::text::xid8 AND id > $3
ORDER BY id
LIMIT $4`

// querier is what Read runs on: the pool, or Tail's own connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Read returns up to limit changes after c, in order, and the cursor to
// read on from. Fewer than limit changes means it has read every change
// below the horizon: the next Read waits for newer ones to pass it.
func Read(ctx context.Context, q querier, c Cursor, limit int) ([]Change, Cursor, error) {
	if limit < 1 {
		return nil, c, nil
	}
	var out []Change
	if c.Hi != 0 {
		page, err := readWindow(ctx, q, c, limit)
		if err != nil {
			return nil, c, err
		}
		if len(page) == limit {
			return page, page[len(page)-1].Cursor, nil
		}
		// The window is done: every change below its hi has been read.
		out, c = page, Cursor{Lo: c.Hi}
	}
	page, next, err := readAfter(ctx, q, c, limit-len(out))
	if err != nil {
		return nil, c, err
	}
	return append(out, page...), next, nil
}

// readAfter runs ReadSQL.
func readAfter(ctx context.Context, q querier, c Cursor, limit int) ([]Change, Cursor, error) {
	rows, err := q.Query(ctx, ReadSQL, strconv.FormatUint(c.Lo, 10), c.Last, limit)
	if err != nil {
		return nil, c, fmt.Errorf("read changes: %w", err)
	}
	defer rows.Close()
	var out []Change
	var horizon uint64
	for rows.Next() {
		var h string
		var txid *string
		var id *int64
		var ch Change
		var at *time.Time
		var kind, subject, traceparent *string
		if err := rows.Scan(&h, &txid, &id, &at, &kind, &subject, &ch.StripeCustomerID,
			&ch.EventID, &ch.Before, &ch.After, &traceparent); err != nil {
			return nil, c, fmt.Errorf("read changes: %w", err)
		}
		if horizon, err = strconv.ParseUint(h, 10, 64); err != nil {
			return nil, c, fmt.Errorf("read changes: horizon %q: %w", h, err)
		}
		if id == nil {
			continue // nothing new below the horizon
		}
		ch.ID, ch.At, ch.Kind, ch.Subject = *id, *at, *kind, *subject
		if traceparent != nil {
			ch.Traceparent = *traceparent
		}
		if ch.Cursor.Lo, err = strconv.ParseUint(*txid, 10, 64); err != nil {
			return nil, c, fmt.Errorf("read changes: txid %q: %w", *txid, err)
		}
		ch.Cursor.Last = ch.ID
		out = append(out, ch)
	}
	if err := rows.Err(); err != nil {
		return nil, c, fmt.Errorf("read changes: %w", err)
	}
	if len(out) == limit {
		return out, out[len(out)-1].Cursor, nil
	}
	// Every change below the horizon has been read: the cursor moves up to
	// it, so that Floor follows the horizon on a quiet feed. The horizon
	// never goes back; should it (a prepared transaction?), c stays.
	if horizon > c.Lo {
		return out, Cursor{Lo: horizon}, nil
	}
	if len(out) > 0 {
		return out, out[len(out)-1].Cursor, nil
	}
	return out, c, nil
}

// readWindow runs readWindowSQL.
func readWindow(ctx context.Context, q querier, c Cursor, limit int) ([]Change, error) {
	rows, err := q.Query(ctx, readWindowSQL, strconv.FormatUint(c.Lo, 10),
		strconv.FormatUint(c.Hi, 10), c.Last, limit)
	if err != nil {
		return nil, fmt.Errorf("read changes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Change, error) {
		var ch Change
		err := row.Scan(&ch.ID, &ch.At, &ch.Kind, &ch.Subject, &ch.StripeCustomerID,
			&ch.EventID, &ch.Before, &ch.After, &ch.Traceparent)
		ch.Cursor = Cursor{Lo: c.Lo, Hi: c.Hi, Last: ch.ID}
		return ch, err
	})
	if err != nil {
		return nil, fmt.Errorf("read changes: %w", err)
	}
	return out, nil
}

// Tail calls each for every change after c, in order, until it has read
// all there is (follow false) or ctx ends (follow true), and returns the
// cursor after the last change handled: give it back to resume. With
// follow it listens on Channel on a connection of its own: a
// notification is only a doorbell (one sent while the connection was
// being made is lost, and with no replica running nothing rings), so it
// also reads every poll.
func (l *Ledger) Tail(ctx context.Context, c Cursor, follow bool, poll time.Duration, each func(Change) error) (Cursor, error) {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return c, fmt.Errorf("tail changes: %w", err)
	}
	if !follow {
		defer conn.Release()
		return drain(ctx, conn, c, each)
	}
	// A connection that has listened is not given back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+Channel); err != nil {
		return c, fmt.Errorf("listen %s: %w", Channel, err)
	}
	for {
		if c, err = drain(ctx, pc, c, each); err != nil {
			return c, err
		}
		wait, cancel := context.WithTimeout(ctx, poll)
		_, err := pc.WaitForNotification(wait)
		cancel()
		switch {
		case ctx.Err() != nil:
			return c, nil
		case err != nil && !errors.Is(err, context.DeadlineExceeded) && !pgconnTimeout(err):
			return c, fmt.Errorf("wait for %s: %w", Channel, err)
		}
	}
}

// tailPage is how many changes one Read of Tail asks for.
const tailPage = 500

// drain reads until a window comes back short.
func drain(ctx context.Context, q querier, c Cursor, each func(Change) error) (Cursor, error) {
	for {
		page, next, err := Read(ctx, q, c, tailPage)
		if err != nil {
			return c, err
		}
		for _, ch := range page {
			if err := each(ch); err != nil {
				return c, err // ch was not handled: resume at it
			}
			c = ch.Cursor
		}
		c = next
		if len(page) < tailPage {
			return c, nil
		}
	}
}

// pgconnTimeout: WaitForNotification ended by its context's deadline, as
// pgconn reports it.
func pgconnTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// changesOfSQL reads an event's changes. They were appended between its
// first attempt and its last (the now() of their transactions), so the
// index on at bounds the scan without an index of their own on event_id,
// which every delivery would pay for.
const changesOfSQL = `
SELECT txid::text, id, at, kind, subject, stripe_customer_id, event_id, before, after
FROM changes WHERE at BETWEEN $2 AND $3 AND event_id = $1 ORDER BY id`

// ChangesOf returns the changes the event e made, in order, each with the
// cursor that resumes the feed just after it.
func (l *Ledger) ChangesOf(ctx context.Context, e Event) ([]Change, error) {
	last := e.FirstSeenAt
	if e.FinishedAt != nil && e.FinishedAt.After(last) {
		last = *e.FinishedAt
	}
	rows, err := l.pool.Query(ctx, changesOfSQL, e.EventID, e.FirstSeenAt, last)
	if err != nil {
		return nil, fmt.Errorf("changes of %s: %w", e.EventID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Change, error) {
		var c Change
		var txid string
		if err := row.Scan(&txid, &c.ID, &c.At, &c.Kind, &c.Subject, &c.StripeCustomerID, &c.EventID, &c.Before, &c.After); err != nil {
			return c, err
		}
		lo, err := strconv.ParseUint(txid, 10, 64)
		c.Cursor = Cursor{Lo: lo, Last: c.ID}
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("changes of %s: %w", e.EventID, err)
	}
	return out, nil
}
