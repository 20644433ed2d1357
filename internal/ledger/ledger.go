// Package ledger keeps what happened to every event that reached the claim
// (webhook_events) and what changed, for the app, because of it (changes,
// the feed). The stores write both with their effect, in the statement
// that writes the effect, from the fragments this package owns (RecordCTE,
// AppendCTE); this package writes what happens outside an effect (a
// failure after its rollback, a verdict reached in Go) and reads, tails,
// retries and trims them.
package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// Outcome is what became of an event, as stored in webhook_events.outcome.
type Outcome string

const (
	// Applied: the event's effect, or a state read from the API for it,
	// was written. The feed has a change when a field the app reads moved.
	Applied Outcome = "applied"
	// Unchanged: the stored state already was the event's (a redelivery
	// of an event whose first outcome was not applied, a same-second
	// event equal to the stored state, a mail already queued).
	Unchanged Outcome = "unchanged"
	// Stale: the stored state is newer; nothing was written.
	Stale Outcome = "stale"
	// Unordered: a same-second event that could not be ordered, kept out
	// for want of an API key.
	Unordered Outcome = "unordered"
	// Ignored is CONTRACT.md's name for an event answered without an
	// effect. This service writes no row for one: an ignored event never
	// reaches the claim, so every redelivery would cost a write, and most
	// of a Stripe account's events are of types it ignores.
	Ignored Outcome = "ignored"
	// Failed: the last attempt failed and was rolled back; the body is kept.
	Failed Outcome = "failed"
	// Dead: POISON_AFTER attempts failed; only a retry by hand runs it again.
	Dead Outcome = "dead"
)

// Outcomes lists every outcome, for validating a filter.
var Outcomes = []Outcome{Applied, Unchanged, Stale, Unordered, Ignored, Failed, Dead}

// RecordCTE writes an event's ledger row in the statement of its effect,
// so the row commits exactly when the effect does. It is a fragment of a
// WITH list: the statement that includes it defines
//
//	judged(provider, event_id, event_type, subject, outcome)
//
// with at most one row, outcome being the store's verdict (applied,
// unchanged, stale, unordered). A NULL event_id (a write no event caused:
// a snapshot, a form post, or a write whose verdict the caller records
// itself) or a NULL outcome (not settled by this statement) records
// nothing. The statement need not read recorded: a data-modifying CTE
// always runs.
//
// A row already 'applied' stays so: a later attempt of the same event (a
// crash before confirm, a replay) cannot undo a committed effect. attempts
// counts every attempt that reached the store; the kept body is dropped
// once an attempt succeeds.
const RecordCTE = `
recorded AS (
    INSERT INTO webhook_events AS w (provider, event_id, event_type, subject,
        outcome, attempts, first_seen_at, finished_at, trace_id)
    SELECT j.provider, j.event_id, j.event_type, j.subject, j.outcome, 1, now(), now(),
        split_part(` + traceparentSQL + `, '-', 2)
    FROM judged j
    WHERE j.event_id IS NOT NULL AND j.outcome IS NOT NULL
    ON CONFLICT (provider, event_id) DO UPDATE SET
        event_type  = coalesce(EXCLUDED.event_type, w.event_type),
        subject     = coalesce(EXCLUDED.subject, w.subject),
        outcome     = CASE WHEN w.outcome = 'applied' THEN 'applied' ELSE EXCLUDED.outcome END,
        attempts    = w.attempts + 1,
        finished_at = EXCLUDED.finished_at,
        body        = NULL,
        trace_id    = coalesce(EXCLUDED.trace_id, w.trace_id)
)`

// recordSQL is RecordCTE for a verdict reached in Go, inside the
// transaction that reached it (a same-second event judged stale,
// unordered or unchanged under its row lock, or written by the store's
// statement run without an event).
const recordSQL = `
WITH judged(provider, event_id, event_type, subject, outcome) AS (
    VALUES ($1::text, $2::text, $3::text, $4::text, $5::text)
),` + RecordCTE + `
SELECT`

// Entry names the event a store writes for: the ledger row's key and what
// it is about. A nil *Entry (a snapshot, a form post) records nothing.
type Entry struct {
	Provider string
	EventID  string
	Type     string
}

// Record writes e's row with outcome o in tx, the transaction that judged
// it and carried it out. subject is the row it is about.
func Record(ctx context.Context, tx pgx.Tx, e *Entry, subject string, o Outcome) error {
	if e == nil {
		return nil
	}
	if err := SetTrace(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, recordSQL, e.Provider, e.EventID, nullString(e.Type), nullString(subject), string(o)); err != nil {
		return fmt.Errorf("record %s %s as %s: %w", e.Provider, e.EventID, o, err)
	}
	return nil
}

// Ledger reads and writes webhook_events and changes outside an effect's
// statement.
type Ledger struct {
	pool        *pgxpool.Pool
	poisonAfter int
	pace        TrimPace
	tracer      trace.TracerProvider // nil: retention passes are not traced
}

// New returns a Ledger on pool. poisonAfter is POISON_AFTER: the failed
// attempts after which an event is dead (0: never).
func New(pool *pgxpool.Pool, poisonAfter int) *Ledger {
	return &Ledger{pool: pool, poisonAfter: poisonAfter, pace: TrimPace{Rate: trimRate, Budget: trimBudget}}
}

// Trace makes each retention pass a trace of its own under tp (nil: none).
// Call it before RunRetention.
func (l *Ledger) Trace(tp trace.TracerProvider) { l.tracer = tp }

// failSQL records a failed attempt after its rollback. The body is the
// verified one, kept for a retry by hand; it replaces an older one (a
// Stripe event fetched from the API may differ in its request fields).
// A row already 'applied' is not demoted: that attempt's effect committed,
// and a later failure (a retry by hand that broke) does not undo it.
const failSQL = `
INSERT INTO webhook_events AS w (provider, event_id, event_type, outcome,
    attempts, first_seen_at, finished_at, last_error, body, trace_id)
VALUES ($1, $2, $3, CASE WHEN $6::int > 0 AND 1 >= $6::int THEN 'dead' ELSE 'failed' END,
    1, now(), now(), $4, $5, nullif($7::text, ''))
ON CONFLICT (provider, event_id) DO UPDATE SET
    event_type  = coalesce(EXCLUDED.event_type, w.event_type),
    outcome     = CASE
                      WHEN w.outcome = 'applied' THEN 'applied'
                      WHEN $6::int > 0 AND w.attempts + 1 >= $6::int THEN 'dead'
                      ELSE 'failed' END,
    attempts    = w.attempts + 1,
    finished_at = EXCLUDED.finished_at,
    last_error  = EXCLUDED.last_error,
    trace_id    = coalesce(EXCLUDED.trace_id, w.trace_id),
    body        = CASE WHEN w.outcome = 'applied' THEN NULL ELSE coalesce(EXCLUDED.body, w.body) END
RETURNING outcome, attempts`

// maxErrorLen bounds last_error: an error can quote a whole API answer.
const maxErrorLen = 2000

// RecordFailure records a failed attempt of an event, after its effect's
// transaction rolled back: attempts+1, the error, and body (the verified
// body, copied by the caller) kept for a retry. It reports whether the
// event is now dead. The claim flow calls it.
func (l *Ledger) RecordFailure(ctx context.Context, provider, eventID, eventType string, body []byte, cause error) (dead bool, err error) {
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	if len(msg) > maxErrorLen {
		msg = msg[:maxErrorLen]
	}
	msg = string(bytes.ToValidUTF8([]byte(msg), []byte("?")))
	var outcome string
	var attempts int
	err = l.pool.QueryRow(ctx, failSQL, provider, eventID, nullString(eventType), msg, body, l.poisonAfter, tracing.TraceID(ctx)).
		Scan(&outcome, &attempts)
	if err != nil {
		return false, fmt.Errorf("record failure of %s %s: %w", provider, eventID, err)
	}
	return Outcome(outcome) == Dead, nil
}

// Event is one webhook_events row.
type Event struct {
	ID          int64      `json:"id"`
	Provider    string     `json:"provider"`
	EventID     string     `json:"event_id"`
	EventType   *string    `json:"event_type"`
	Subject     *string    `json:"subject"`
	Outcome     Outcome    `json:"outcome"`
	Attempts    int        `json:"attempts"`
	FirstSeenAt time.Time  `json:"first_seen_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	LastError   *string    `json:"last_error"`
	// BodyBytes is the kept body's size (0: none kept); Body itself is
	// never printed.
	BodyBytes int    `json:"body_bytes"`
	Body      []byte `json:"-"`
	// TraceID is the trace of the last traced attempt that reached the
	// store or failed (tracing on and the trace sampled); nil otherwise.
	TraceID *string `json:"trace_id,omitempty"`
}

const eventColumns = `id, provider, event_id, event_type, subject, outcome, attempts,
    first_seen_at, finished_at, last_error, coalesce(length(body), 0), trace_id`

func scanEvent(row pgx.Row, withBody bool) (Event, error) {
	var e Event
	dest := []any{&e.ID, &e.Provider, &e.EventID, &e.EventType, &e.Subject, &e.Outcome,
		&e.Attempts, &e.FirstSeenAt, &e.FinishedAt, &e.LastError, &e.BodyBytes, &e.TraceID}
	if withBody {
		dest = append(dest, &e.Body)
	}
	err := row.Scan(dest...)
	return e, err
}

const getSQL = `SELECT ` + eventColumns + `, body FROM webhook_events WHERE provider = $1 AND event_id = $2`

// ErrNotFound: the ledger has no row for the event.
var ErrNotFound = errors.New("not in the ledger")

// Get returns an event's row, with its kept body.
func (l *Ledger) Get(ctx context.Context, provider, eventID string) (Event, error) {
	e, err := scanEvent(l.pool.QueryRow(ctx, getSQL, provider, eventID), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return Event{}, fmt.Errorf("%s %s: %w", provider, eventID, ErrNotFound)
	}
	if err != nil {
		return Event{}, fmt.Errorf("read %s %s: %w", provider, eventID, err)
	}
	return e, nil
}

// listSQL reads rows oldest first; webhook_events_unsettled serves a
// filter by failed or dead (a plan for the given outcome: a one-off
// command's statement is planned with its values), webhook_events_first_seen
// one by time, or by any other outcome, which it filters.
const listSQL = `
SELECT ` + eventColumns + ` FROM webhook_events
WHERE ($1::text IS NULL OR outcome = $1) AND first_seen_at >= $2
ORDER BY first_seen_at, id`

// List calls each for every row first seen at or after since, oldest
// first; outcome "" means any.
func (l *Ledger) List(ctx context.Context, outcome Outcome, since time.Time, each func(Event) error) error {
	rows, err := l.pool.Query(ctx, listSQL, nullString(string(outcome)), since)
	if err != nil {
		return fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEvent(rows, false)
		if err != nil {
			return fmt.Errorf("list events: %w", err)
		}
		if err := each(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list events: %w", err)
	}
	return nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
