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
// The id is drawn (nextval) when the row is inserted, which is after new's
// rows exist, so after the written row's lock is held: of two
// transactions that change one row, the one that commits first draws the
// smaller id (docs/APP.md builds the consumer's order on it).
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
    INSERT INTO changes (at, kind, subject, stripe_customer_id, event_id, before, after)
    SELECT now(), c.kind, c.subject, c.customer, c.event_id, c.before, c.after
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
}

// Cursor is a consumer's position in the feed: every change whose
// transaction id is below Lo has been read; when Hi is set, so have the
// changes of the window [Lo, Hi) up to id Last. Its string form is opaque
// to consumers; the zero Cursor is the start of the feed.
type Cursor struct {
	Lo, Hi uint64
	Last   int64
}

// String is the cursor's opaque form.
func (c Cursor) String() string {
	return fmt.Sprintf("c1.%d.%d.%d", c.Lo, c.Hi, c.Last)
}

// Floor is the cursor's floor: every change whose txid is below Floor has
// been read at c. Retention keeps what an enabled consumer's floor has not
// passed, and a floor at or below what retention deleted is a gap.
func (c Cursor) Floor() uint64 { return c.Lo }

// MarshalText makes a Cursor print as its string in JSON.
func (c Cursor) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// ErrCursor: the string is not a cursor this service printed.
var ErrCursor = errors.New("not a changes cursor")

// ParseCursor reads a cursor's string form; "" is the start of the feed.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 || parts[0] != "c1" {
		return Cursor{}, fmt.Errorf("%q: %w", s, ErrCursor)
	}
	var c Cursor
	var err1, err2, err3 error
	c.Lo, err1 = strconv.ParseUint(parts[1], 10, 64)
	c.Hi, err2 = strconv.ParseUint(parts[2], 10, 64)
	c.Last, err3 = strconv.ParseInt(parts[3], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil || c.Last < 0 || (c.Hi != 0 && c.Hi < c.Lo) {
		return Cursor{}, fmt.Errorf("%q: %w", s, ErrCursor)
	}
	return c, nil
}

// ReadSQL is the consumer query (docs/APP.md quotes it). A window is
// [lo, hi): hi is the horizon, the oldest transaction id still running
// when the statement's snapshot was taken, so every transaction below it
// has finished and its rows are all visible; no transaction that commits
// later can add a row below it. $2 is NULL to open a new window, or the hi
// of a window being paged through. Within a window rows go by id, which
// for any one row of the app's tables is commit order (AppendCTE). The
// first column repeats hi on every row, and comes as one row with NULLs
// when the window is empty.
const ReadSQL = `
WITH w AS (
    SELECT $1::text::xid8 AS lo,
           coalesce($2::text::xid8, pg_snapshot_xmin(pg_current_snapshot())) AS hi
)
SELECT w.hi::text, c.id, c.at, c.kind, c.subject, c.stripe_customer_id,
       c.event_id, c.before, c.after
FROM w
LEFT JOIN LATERAL (
    SELECT * FROM changes
    WHERE txid >= w.lo AND txid < w.hi AND id > $3
    ORDER BY id
    LIMIT $4
) c ON true
ORDER BY c.id`

// querier is what Read runs on: the pool, or Tail's own connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Read returns up to limit changes after c, in order, and the cursor to
// read on from. Fewer than limit changes means the window is done: the
// next Read opens a new one at the horizon it reached.
func Read(ctx context.Context, q querier, c Cursor, limit int) ([]Change, Cursor, error) {
	var hi *string
	if c.Hi != 0 {
		s := strconv.FormatUint(c.Hi, 10)
		hi = &s
	}
	rows, err := q.Query(ctx, ReadSQL, strconv.FormatUint(c.Lo, 10), hi, c.Last, limit)
	if err != nil {
		return nil, c, fmt.Errorf("read changes: %w", err)
	}
	defer rows.Close()
	var out []Change
	window := c
	for rows.Next() {
		var h string
		var id *int64
		var ch Change
		var at *time.Time
		var kind, subject *string
		if err := rows.Scan(&h, &id, &at, &kind, &subject, &ch.StripeCustomerID,
			&ch.EventID, &ch.Before, &ch.After); err != nil {
			return nil, c, fmt.Errorf("read changes: %w", err)
		}
		if window.Hi == 0 {
			if window.Hi, err = strconv.ParseUint(h, 10, 64); err != nil {
				return nil, c, fmt.Errorf("read changes: horizon %q: %w", h, err)
			}
			// The horizon never goes back; should it (a prepared
			// transaction?), the window is empty rather than inverted.
			window.Hi = max(window.Hi, window.Lo)
		}
		if id == nil {
			continue // empty window
		}
		ch.ID, ch.At, ch.Kind, ch.Subject = *id, *at, *kind, *subject
		ch.Cursor = Cursor{Lo: window.Lo, Hi: window.Hi, Last: ch.ID}
		out = append(out, ch)
	}
	if err := rows.Err(); err != nil {
		return nil, c, fmt.Errorf("read changes: %w", err)
	}
	if len(out) == limit && limit > 0 {
		return out, out[len(out)-1].Cursor, nil
	}
	return out, Cursor{Lo: window.Hi}, nil
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
SELECT id, at, kind, subject, stripe_customer_id, event_id, before, after
FROM changes WHERE at BETWEEN $2 AND $3 AND event_id = $1 ORDER BY id`

// ChangesOf returns the changes the event e made, in order. Their cursors
// are unset: an operator's view, not a position in the feed.
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
		err := row.Scan(&c.ID, &c.At, &c.Kind, &c.Subject, &c.StripeCustomerID, &c.EventID, &c.Before, &c.After)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("changes of %s: %w", e.EventID, err)
	}
	return out, nil
}
