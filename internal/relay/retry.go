package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Errors of Retry.
var (
	ErrNoDelivery    = errors.New("no such delivery")
	ErrNotRetryable  = errors.New("only a failed or dead delivery is retried")
	ErrWaiting       = errors.New("an older change of the same subject is not delivered yet")
	ErrNotConfigured = errors.New("consumer not configured here")
)

// holdSQL takes a failed or dead delivery for a retry by hand: its next
// attempt moves past this attempt's deadline, so that the relay's loop
// does not run it alongside. It returns nothing for a delivery in another
// state, or one with an older open delivery of its order key.
const (
	holdSQL = `
UPDATE relay_deliveries d SET next_attempt_at = now() + make_interval(secs => $3::float8)
WHERE d.consumer = $1 AND d.change_id = $2 AND d.state IN ('failed', 'dead')
  AND NOT EXISTS (
    SELECT 1 FROM relay_deliveries o
    WHERE o.consumer = d.consumer AND o.order_key = d.order_key AND o.change_id < d.change_id
      AND o.state IN ('pending', 'failed'))
RETURNING d.attempts, d.change`
	getSQL = `SELECT ` + deliveryColumns + ` FROM relay_deliveries WHERE consumer = $1 AND change_id = $2`
)

// Retry runs a failed or dead delivery again at once, records its outcome
// as the loop would (a failure is retried on the schedule, or stays dead
// once the schedule has run out) and returns the delivery as it now
// stands. It repeats the delivery's identity, like any retry. It runs
// outside the leader (relay retry is a command), with no fence: the loop
// leaves the delivery alone while it runs (holdSQL).
func (r *Relay) Retry(ctx context.Context, consumer string, changeID int64) (Delivery, error) {
	c, ok := r.consumer(consumer)
	if !ok {
		return Delivery{}, fmt.Errorf("retry %s %d: %w", consumer, changeID, ErrNotConfigured)
	}
	d := &delivery{}
	var body []byte
	err := r.pool.QueryRow(ctx, holdSQL, consumer, changeID, r.timeout.Seconds()).Scan(&d.attempts, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err := r.get(ctx, consumer, changeID)
		switch {
		case err != nil:
			return Delivery{}, err
		case cur.State == Failed || cur.State == Dead:
			return cur, fmt.Errorf("retry %s %d: %w", consumer, changeID, ErrWaiting)
		default:
			return cur, fmt.Errorf("retry %s %d is %s: %w", consumer, changeID, cur.State, ErrNotRetryable)
		}
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("retry %s %d: %w", consumer, changeID, err)
	}
	if d.change, err = unmarshalChange(body); err != nil {
		return Delivery{}, err
	}
	actx, cancel := context.WithTimeout(ctx, r.timeout)
	actx, span := r.span(actx, c, d.change)
	d.span = span.SpanContext()
	d.result, d.err = c.Destination.Deliver(actx, d.change)
	endSpan(span, d.result, d.err)
	cancel()
	if err := ctx.Err(); err != nil {
		return Delivery{}, err
	}
	err = r.inTx(ctx, nil, func(tx pgx.Tx) error {
		if err := r.record(ctx, tx, consumer, []*delivery{d}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, handAttemptSQL, consumer, string(d.out.state))
		return err
	})
	if err != nil {
		return Delivery{}, fmt.Errorf("retry %s %d: record: %w", consumer, changeID, err)
	}
	r.log(ctx, consumer, d)
	return r.get(ctx, consumer, changeID)
}

// handAttemptSQL leaves a hand attempt's outcome for the leader to count
// (countHand): relay retry is a command, whose counters no one scrapes.
const handAttemptSQL = `INSERT INTO relay_hand_attempts (consumer, outcome) VALUES ($1, $2)`

// countHandSQL takes the hand attempts of the consumers this relay has,
// each once, whichever replica leads.
const countHandSQL = `DELETE FROM relay_hand_attempts WHERE consumer = ANY($1::text[]) RETURNING consumer, outcome`

// countHand adds the attempts relay retry ran to relay_deliveries_total,
// as if the relay had run them: the counter says how many deliveries were
// made, whoever made them.
func (r *Relay) countHand(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, countHandSQL, r.names())
	if err != nil {
		return fmt.Errorf("relay: count hand retries: %w", err)
	}
	var consumer, outcome string
	_, err = pgx.ForEachRow(rows, []any{&consumer, &outcome}, func() error {
		r.metrics.deliveries.WithLabelValues(consumer, outcome).Inc()
		return nil
	})
	if err != nil {
		return fmt.Errorf("relay: count hand retries: %w", err)
	}
	return nil
}

// matchingSQL lists the deliveries relay retry --state runs, by change:
// older first, so that each subject's go in order. The states spelled out
// beside $2 are for a generic plan, which cannot see that $2 is a rare
// state: it read every delivery of a million (300 ms), and with them reads
// relay_deliveries_state's entries of the state (12 ms for 10,000).
const matchingSQL = `
SELECT change_id FROM relay_deliveries
WHERE consumer = $1 AND state IN ('failed', 'dead') AND state = $2 AND created_at >= $3
ORDER BY change_id`

// RetryFilter says which deliveries RetryMatching runs again.
type RetryFilter struct {
	Consumer string
	State    State // Failed or Dead
	Since    time.Time
	// Rate is how many attempts a second at most (0: 10).
	Rate float64
	// GiveUpAfter ends the run after this many failed attempts in a row:
	// the destination still fails, and more attempts only add to its load
	// (0: 10).
	GiveUpAfter int
}

// Parse sets f's State and Since from relay retry's flags: state failed
// or dead; since empty (any age), a duration before now, or an RFC 3339
// time.
func (f *RetryFilter) Parse(state, since string, now time.Time) error {
	if f.Consumer == "" {
		return errors.New("--state needs --consumer")
	}
	if State(state) != Failed && State(state) != Dead {
		return fmt.Errorf("--state %q: want failed or dead", state)
	}
	f.State = State(state)
	if f.Rate <= 0 {
		return fmt.Errorf("--rate %v: want attempts a second, above 0", f.Rate)
	}
	if since == "" {
		return nil
	}
	if d, err := time.ParseDuration(since); err == nil && d > 0 {
		f.Since = now.Add(-d)
		return nil
	}
	t, err := time.Parse(time.RFC3339, since)
	if err != nil {
		return fmt.Errorf("--since %q: want a positive duration such as 72h, or an RFC 3339 time such as 2026-12-04T18:00:00Z", since)
	}
	f.Since = t
	return nil
}

// RetrySummary counts what RetryMatching did, by the delivery's state
// after its attempt; Waiting are those left for the relay because an older
// change of their order key is still open.
type RetrySummary struct {
	Matched   int           `json:"matched"`
	Attempted int           `json:"attempted"`
	States    map[State]int `json:"states"`
	Waiting   int           `json:"waiting"`
	GaveUp    bool          `json:"gave_up"`
}

// ErrGaveUp: RetryMatching stopped after GiveUpAfter failures in a row.
var ErrGaveUp = errors.New("the destination still fails")

// RetryMatching runs every delivery that f matches again, one at a time,
// older changes first (so each subject's in order), at most f.Rate a
// second, calling progress after each (with the delivery as it now stands,
// or the error that kept it from running). A delivery waiting for an
// older one of its order key (which failed again here) is left to the
// relay. It stops at ctx's end or after f.GiveUpAfter failed attempts in a
// row (ErrGaveUp).
func (r *Relay) RetryMatching(ctx context.Context, f RetryFilter, progress func(Delivery, error)) (RetrySummary, error) {
	sum := RetrySummary{States: map[State]int{}}
	if _, ok := r.consumer(f.Consumer); !ok {
		return sum, fmt.Errorf("retry %s: %w", f.Consumer, ErrNotConfigured)
	}
	if f.State != Failed && f.State != Dead {
		return sum, fmt.Errorf("retry %s %s: %w", f.Consumer, f.State, ErrNotRetryable)
	}
	rate, giveUp := f.Rate, f.GiveUpAfter
	if rate <= 0 {
		rate = 10
	}
	if giveUp <= 0 {
		giveUp = 10
	}
	rows, err := r.pool.Query(ctx, matchingSQL, f.Consumer, string(f.State), f.Since)
	if err != nil {
		return sum, fmt.Errorf("retry %s: %w", f.Consumer, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return sum, fmt.Errorf("retry %s: %w", f.Consumer, err)
	}
	sum.Matched = len(ids)
	pace := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer pace.Stop()
	failures := 0
	for i, id := range ids {
		if i > 0 {
			select {
			case <-ctx.Done():
				return sum, ctx.Err()
			case <-pace.C:
			}
		}
		d, err := r.Retry(ctx, f.Consumer, id)
		switch {
		case errors.Is(err, ErrWaiting):
			sum.Waiting++
		case errors.Is(err, ErrNotRetryable):
			// No longer failed or dead: the relay ran it meanwhile.
		case err != nil:
			progress(d, err)
			return sum, err
		default:
			sum.Attempted++
			sum.States[d.State]++
		}
		progress(d, err)
		if err == nil && d.State != Delivered && d.State != Skipped {
			failures++
		} else if err == nil {
			failures = 0
		}
		if failures >= giveUp {
			sum.GaveUp = true
			return sum, fmt.Errorf("retry %s: %d attempts in a row failed: %w", f.Consumer, failures, ErrGaveUp)
		}
	}
	return sum, nil
}
