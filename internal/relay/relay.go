// Package relay delivers the change feed, once, to each consumer: it
// follows changes (ledger.Read) with a cursor per consumer in
// feed_consumers, takes the changes a consumer wants into
// relay_deliveries, and hands each to the consumer's Destination, retrying
// on a schedule. The feed is the outbox: nothing but the change itself is
// written with the change.
//
// Once: a destination's delivery carries an identity fixed by the change
// (destination.go), so a crash between sending and recording repeats the
// send only with the same identity. Order: for one consumer, a change is
// delivered only once every older change of its subject is delivered,
// dead or skipped; other subjects do not wait for it. One replica at a
// time runs the relay, and every transaction that records a delivery or
// moves a cursor first calls the run's Fence, so a replica that lost the
// lead records nothing over its successor.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// Fence returns an error when this replica no longer leads. The relay
// calls it first in every transaction that records deliveries or moves a
// cursor, and stops when it fails.
type Fence func(ctx context.Context, tx pgx.Tx) error

// ErrFenced wraps a Fence's error: the run stopped because it no longer
// leads.
var ErrFenced = errors.New("relay: no longer the leader")

// Consumer is one named follower of the feed and its far side.
type Consumer struct {
	// Name is its row in feed_consumers and its deliveries' consumer.
	Name string
	// Kinds are the change kinds it takes; the others pass it by (its
	// cursor moves over them, no delivery is recorded).
	Kinds       []string
	Destination Destination
	// Parallel is how many of its deliveries (each of another subject)
	// run at once; 0 is 1.
	Parallel int
	// OrderBy is what a change's order goes by: a change waits for the
	// older changes with the same key. nil: its subject.
	OrderBy func(ledger.Change) string
	// Takes, when not nil, narrows Kinds: a change of its kinds that
	// Takes refuses passes it by as other kinds do (no delivery is
	// recorded), since the destination would never send it.
	Takes func(ledger.Change) bool
}

// takes reports whether c records a delivery for ch.
func (c Consumer) takes(ch ledger.Change) bool {
	return slices.Contains(c.Kinds, ch.Kind) && (c.Takes == nil || c.Takes(ch))
}

// orderKey is ch's key for c.
func (c Consumer) orderKey(ch ledger.Change) string {
	if c.OrderBy != nil {
		if k := c.OrderBy(ch); k != "" {
			return k
		}
	}
	return ch.Subject
}

// DefaultSchedule is RELAY_RETRY_SCHEDULE's default, the Standard
// Webhooks schedule: the waits after the first failed attempt, the
// second, and so on; a delivery whose last wait has run out fails for the
// last time and is dead.
var DefaultSchedule = []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute,
	2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// Config is what a Relay runs on.
type Config struct {
	Pool *pgxpool.Pool
	// Forward, when its To is not empty, is the consumer forward.
	Forward ForwardConfig
	// Consumers are consumers besides those built from the fields above.
	Consumers []Consumer
	// Schedule is RELAY_RETRY_SCHEDULE (nil: DefaultSchedule).
	Schedule []time.Duration
	// Poll is how often the relay looks for new changes and for retries
	// that are due (0: one second).
	Poll time.Duration
	// Batch is how many changes one read takes and how many deliveries
	// one pass starts, per consumer (0: 100).
	Batch int
	// AttemptTimeout caps one delivery attempt (0: two minutes); a
	// destination has its own, shorter, deadline.
	AttemptTimeout time.Duration
	// Retention is EVENTS_RETENTION: delivered and skipped deliveries
	// older than it are deleted (0: kept). Failed, dead and pending ones
	// are kept whatever their age.
	Retention  time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Tracer, when not nil, traces each attempt (internal/tracing) and
	// the forward's calls to Resend; nil adds no instrumentation.
	Tracer trace.TracerProvider
	// RegisterWait bounds how long Register waits for the transactions
	// older than a new start to end (0: DefaultRegisterWait). Tests that
	// share a server with others may shorten it.
	RegisterWait time.Duration
}

// Relay follows the feed for its consumers.
type Relay struct {
	pool      *pgxpool.Pool
	consumers []Consumer
	schedule  []time.Duration
	poll      time.Duration
	batch     int
	timeout   time.Duration
	retention time.Duration
	logger    *slog.Logger
	metrics   *metrics
	now       func() time.Time
	tracer    trace.Tracer // nil: tracing is off
	// replan goes before the arguments of the statements that read and
	// write relay_deliveries by batch (batchArgs). Under pgx's default
	// mode, a prepared statement settles on a generic plan after five
	// runs, and one made while the table was small kept reading every
	// delivery the consumer ever had, each batch, until the next ANALYZE:
	// about 2.5 ms more per batch for every 10,000 deliveries. The exec
	// mode plans each run with its arguments, for a fraction of a
	// millisecond per batch; every other mode already does.
	replan []any
	// registerWait is Config.RegisterWait, defaulted.
	registerWait time.Duration
}

// New builds the relay and its destinations from cfg, and registers its
// metrics (exported from 0 for every consumer it has).
func New(cfg Config) *Relay {
	r := &Relay{
		pool:      cfg.Pool,
		schedule:  cfg.Schedule,
		poll:      cfg.Poll,
		batch:     cfg.Batch,
		timeout:   cfg.AttemptTimeout,
		retention: cfg.Retention,
		logger:    cfg.Logger,
		now:       time.Now,
	}
	if r.schedule == nil {
		r.schedule = DefaultSchedule
	}
	if r.poll <= 0 {
		r.poll = time.Second
	}
	if r.batch <= 0 {
		r.batch = 100
	}
	if r.registerWait = cfg.RegisterWait; r.registerWait <= 0 {
		r.registerWait = DefaultRegisterWait
	}
	if r.timeout <= 0 {
		r.timeout = 2 * time.Minute
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tracer != nil {
		r.tracer = cfg.Tracer.Tracer(tracing.ScopeName)
		cfg.Forward.tracer = cfg.Tracer
	}
	if cfg.Pool != nil && cfg.Pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		r.replan = []any{pgx.QueryExecModeExec}
	}
	if len(cfg.Forward.To) > 0 {
		r.consumers = append(r.consumers, Consumer{
			Name:        ForwardConsumer,
			Kinds:       []string{ledger.KindSupportMessage},
			Destination: NewForward(cfg.Pool, cfg.Forward),
			OrderBy:     threadOf,
		})
	}
	r.consumers = append(r.consumers, cfg.Consumers...)
	r.metrics = newMetrics(cfg.Registerer, r.names())
	return r
}

func (r *Relay) names() []string {
	names := make([]string, len(r.consumers))
	for i, c := range r.consumers {
		names[i] = c.Name
	}
	return names
}

// consumer returns the consumer called name.
func (r *Relay) consumer(name string) (Consumer, bool) {
	i := slices.IndexFunc(r.consumers, func(c Consumer) bool { return c.Name == name })
	if i < 0 {
		return Consumer{}, false
	}
	return r.consumers[i], true
}

// Run relays until ctx ends (it returns nil) or fence fails (an error
// wrapping ErrFenced). It first marks which consumers are enabled (those
// it has; the others then hold retention back no more) and goes on from
// each one's cursor. One that Register has not placed (a relay run on
// its own, as in tests) starts at Run's own transaction, as Register
// would place it, but without waiting for older transactions to end: a
// change one of them commits later counts as before the start. A failed
// pass is logged and tried again at the next poll.
func (r *Relay) Run(ctx context.Context, fence Fence) error {
	cursors, err := r.enable(ctx, fence)
	if err != nil {
		return r.stopped(ctx, err)
	}
	checked := map[string]uint64{}   // the floor last checked for a gap, per consumer
	stored := map[string]time.Time{} // when the cursor was last stored, per consumer
	var trimmed time.Time
	for {
		if r.retention > 0 && time.Since(trimmed) >= trimEvery {
			if err := r.trim(ctx); err != nil && ctx.Err() == nil {
				r.logger.Error("relay: trimming finished deliveries failed", "err", err)
			}
			trimmed = time.Now()
		}
		busy := false
		for _, c := range r.consumers {
			more, err := r.pass(ctx, fence, c, cursors, checked, stored)
			if err != nil {
				if errors.Is(err, ErrFenced) || ctx.Err() != nil {
					return r.stopped(ctx, err)
				}
				r.logger.Error("relay pass failed", "consumer", c.Name, "err", err)
			}
			busy = busy || more
		}
		if busy {
			continue
		}
		if err := r.countHand(ctx); err != nil && ctx.Err() == nil {
			r.logger.Error("relay pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.poll):
		}
	}
}

// trimEvery is how often the relay deletes finished deliveries past the
// retention.
const trimEvery = time.Hour

// trimDeliveriesSQL deletes a batch of finished deliveries past the
// retention: they say only that a change went (the change itself follows
// EVENTS_RETENTION too).
const trimDeliveriesSQL = `
DELETE FROM relay_deliveries WHERE (consumer, change_id) IN (
    SELECT consumer, change_id FROM relay_deliveries
    WHERE state IN ('delivered', 'skipped') AND created_at < $1
    LIMIT 1000)`

// trim deletes finished deliveries older than the retention, a batch at a
// time.
func (r *Relay) trim(ctx context.Context) error {
	cutoff := r.now().Add(-r.retention)
	for {
		tag, err := r.pool.Exec(ctx, trimDeliveriesSQL, cutoff)
		if err != nil {
			return fmt.Errorf("relay: trim deliveries: %w", err)
		}
		if tag.RowsAffected() < 1000 {
			return nil
		}
	}
}

// stopped is Run's return: nil once ctx has ended, the error otherwise.
func (r *Relay) stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ErrFenced) {
		return nil
	}
	return err
}

// batchArgs are args as the batch statements take them, after replan.
func (r *Relay) batchArgs(args ...any) []any { return append(slices.Clip(r.replan), args...) }

// inTx runs fn in a transaction that the fence guards.
func (r *Relay) inTx(ctx context.Context, fence Fence, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if fence != nil {
			if err := fence(ctx, tx); err != nil {
				return fmt.Errorf("%w: %w", ErrFenced, err)
			}
		}
		return fn(tx)
	})
}

// enableSQL marks the consumers this relay has as enabled and every other
// as not, and returns the cursors of those it has.
const (
	disableSQL = `UPDATE feed_consumers SET enabled = (name = ANY($1::text[]))
WHERE enabled <> (name = ANY($1::text[]))`
	cursorsSQL = `SELECT name, cursor FROM feed_consumers WHERE name = ANY($1::text[])`
)

func (r *Relay) enable(ctx context.Context, fence Fence) (map[string]ledger.Cursor, error) {
	names := r.names()
	cursors := map[string]ledger.Cursor{}
	err := r.inTx(ctx, fence, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, disableSQL, names); err != nil {
			return err
		}
		// serve has registered them before it took any delivery; this
		// places one that was not (a relay run on its own, as in tests),
		// without Register's wait (see Run).
		if _, _, err := addConsumers(ctx, tx, names); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, cursorsSQL, names)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, s string
			if err := rows.Scan(&name, &s); err != nil {
				return err
			}
			c, err := ledger.ParseCursor(s)
			if err != nil {
				return fmt.Errorf("consumer %s: %w", name, err)
			}
			cursors[name] = c
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("relay: enable consumers: %w", err)
	}
	return cursors, nil
}

// pass takes the consumer's new changes and runs its due deliveries. more
// is true when there is more to do at once (a full page or batch).
func (r *Relay) pass(ctx context.Context, fence Fence, c Consumer, cursors map[string]ledger.Cursor, checked map[string]uint64, stored map[string]time.Time) (more bool, err error) {
	cur := cursors[c.Name]
	if floor := cur.Floor(); checked[c.Name] != floor {
		if err := ledger.CheckCursor(ctx, r.pool, cur); errors.Is(err, ledger.ErrCursorExpired) {
			r.logger.Error("relay consumer fell behind retention: changes it had not passed were deleted; going on from the oldest kept",
				"consumer", c.Name, "cursor", cur.String(), "err", err)
			r.metrics.gaps.WithLabelValues(c.Name).Inc()
		} else if err != nil {
			return false, err
		}
		checked[c.Name] = floor
	}
	took, next, moved, err := r.take(ctx, fence, c, cur, time.Since(stored[c.Name]) < idleMoveEvery)
	if err != nil {
		return false, err
	}
	cursors[c.Name] = next
	if moved {
		stored[c.Name] = time.Now()
	}
	ran, err := r.deliverDue(ctx, fence, c)
	if err != nil {
		return false, err
	}
	return took == r.batch || ran == r.batch, nil
}

// dueSQL finds the deliveries to run now: open, due, and with no older
// open delivery of the same order key (which would have to go first). The
// partial index on open deliveries serves both sides. Its shape keeps the
// cost to the open deliveries whatever plan a prepared statement settles
// on: the check for an older one is a subquery with LIMIT, which the
// planner cannot turn into a join, so it is one index probe by order key
// per open delivery. As NOT EXISTS, a generic plan made while the table
// was small scanned every open delivery for each one.
const dueSQL = `
SELECT d.change_id, d.attempts, d.change FROM relay_deliveries d
WHERE d.consumer = $1 AND d.state IN ('pending', 'failed') AND d.next_attempt_at <= now()
  AND (SELECT true FROM relay_deliveries o
       WHERE o.consumer = $1 AND o.order_key = d.order_key AND o.change_id < d.change_id
         AND o.state IN ('pending', 'failed')
       LIMIT 1) IS NULL
ORDER BY d.change_id
LIMIT $2`

// delivery is one attempt's input and outcome.
type delivery struct {
	change   ledger.Change
	attempts int // before this attempt
	result   string
	err      error
	out      outcome           // as recorded
	span     trace.SpanContext // the attempt's span, for its log line
}

// deliverDue runs the consumer's due deliveries, Parallel at a time (each
// is of another order key), without holding a connection while they wait
// on the far side, and records their outcomes as they come, one statement
// for all those done within a flush interval: a slow or rate-limited
// destination's first outcomes are on record (and visible) long before
// the batch's last. It returns how many it started. As a page does, it
// checks the fence before it sends anything, so that a replica that lost
// the lead sends none of them beside its successor; a poll with nothing
// due opens no transaction (the fence's row lock would take a
// transaction id and write, every poll, on an idle service).
func (r *Relay) deliverDue(ctx context.Context, fence Fence, c Consumer) (int, error) {
	rows, err := r.pool.Query(ctx, dueSQL, r.batchArgs(c.Name, r.batch)...)
	if err != nil {
		return 0, fmt.Errorf("relay %s: due deliveries: %w", c.Name, err)
	}
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*delivery, error) {
		var d delivery
		var body []byte
		if err := row.Scan(&d.change.ID, &d.attempts, &body); err != nil {
			return nil, err
		}
		ch, err := unmarshalChange(body)
		d.change = ch
		return &d, err
	})
	if err != nil {
		return 0, fmt.Errorf("relay %s: due deliveries: %w", c.Name, err)
	}
	if len(due) == 0 {
		return 0, nil
	}
	if fence != nil {
		if err := r.inTx(ctx, fence, func(pgx.Tx) error { return nil }); err != nil {
			return 0, fmt.Errorf("relay %s: due deliveries: %w", c.Name, err)
		}
	}
	chains := make([][]*taken, len(due))
	for i, d := range due {
		chains[i] = []*taken{{delivery: *d}} // each of another order key
	}
	err = r.sendAndRecord(ctx, c, chains, func(outcomes []*taken, _ bool) error {
		if len(outcomes) == 0 {
			return nil
		}
		ds := make([]*delivery, len(outcomes))
		for i, t := range outcomes {
			ds[i] = &t.delivery
		}
		if err := r.inTx(ctx, fence, func(tx pgx.Tx) error { return r.record(ctx, tx, c.Name, ds) }); err != nil {
			return fmt.Errorf("relay %s: record deliveries: %w", c.Name, err)
		}
		for _, d := range ds {
			r.note(ctx, c.Name, d)
		}
		return nil
	})
	return len(due), err
}

// recordSQL writes a batch of outcomes, one statement for the batch. Each
// row is found through the primary key by a subquery per outcome, and
// updated by its ctid: joined on the change id, the planner, misled by
// the statistics of a young and fast-growing table, read every delivery
// the consumer ever had (60,000 rows and 16 ms a batch, growing) until
// the next ANALYZE. A row that `relay retry` updates while this statement
// waits for it has a new ctid and is left to the retry, which records its
// own attempt.
const recordSQL = `
UPDATE relay_deliveries d SET
    state = o.state, attempts = d.attempts + 1, next_attempt_at = o.next_attempt_at,
    last_error = o.last_error, result = coalesce(o.result, d.result),
    delivered_at = CASE WHEN o.state = 'delivered' THEN now() ELSE d.delivered_at END
FROM (
    SELECT o.*, (SELECT x.ctid FROM relay_deliveries x WHERE x.consumer = $1 AND x.change_id = o.change_id) AS row
    FROM unnest($2::bigint[], $3::text[], $4::timestamptz[], $5::text[], $6::text[])
        AS o(change_id, state, next_attempt_at, last_error, result)
) o
WHERE d.ctid = o.row`

// record writes the outcomes of due (each d.out); note logs and counts
// them once the transaction has committed.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, consumer string, due []*delivery) error {
	n := len(due)
	ids, states := make([]int64, n), make([]string, n)
	nexts, lastErrors, results := make([]*time.Time, n), make([]*string, n), make([]*string, n)
	now := r.now()
	for i, d := range due {
		d.out = r.outcome(d, now)
		o := d.out
		ids[i], states[i], nexts[i] = d.change.ID, string(o.state), o.next
		if o.lastError != "" {
			lastErrors[i] = &o.lastError
		}
		if d.result != "" {
			results[i] = &d.result
		}
	}
	_, err := tx.Exec(ctx, recordSQL, r.batchArgs(consumer, ids, states, nexts, lastErrors, results)...)
	return err
}

// note logs and counts an attempt whose outcome is recorded: a failed
// attempt at warn, a dead delivery at error, each once, so that a failing
// destination speaks up in the log and not only in relay list.
func (r *Relay) note(ctx context.Context, consumer string, d *delivery) {
	r.metrics.deliveries.WithLabelValues(consumer, string(d.out.state)).Inc()
	r.log(ctx, consumer, d)
}

// log logs an attempt whose outcome is recorded, if it failed, in the
// context of the attempt's span: a sampled attempt's line carries its
// trace_id and span_id (tracing.LogHandler).
func (r *Relay) log(ctx context.Context, consumer string, d *delivery) {
	if d.span.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, d.span)
	}
	o := d.out
	args := []any{"consumer", consumer, "change_id", d.change.ID, "subject", d.change.Subject,
		"attempt", d.attempts + 1}
	if d.result != "" {
		args = append(args, "answer", d.result)
	}
	switch o.state {
	case Failed:
		args = append(args, "err", d.err, "next_attempt_at", *o.next)
		r.logger.WarnContext(ctx, "relay: delivery attempt failed", args...)
	case Dead:
		args = append(args, "err", d.err)
		r.logger.ErrorContext(ctx, "relay: delivery dead: no more attempts; relay retry runs it again", args...)
	}
}

// State is a delivery's state in relay_deliveries.
type State string

// The states of a delivery.
const (
	Pending   State = "pending"
	Delivered State = "delivered"
	Failed    State = "failed"
	Dead      State = "dead"
	Skipped   State = "skipped"
)

// States lists every State, in the order of a delivery's life.
var States = []State{Pending, Delivered, Failed, Dead, Skipped}

type outcome struct {
	state     State
	next      *time.Time
	lastError string
}

// outcome reads an attempt's error: delivered, skipped, dead at once, or
// failed and due again after the schedule's wait (or the far side's
// Retry-After, when it said one), dead once the schedule has run out.
func (r *Relay) outcome(d *delivery, now time.Time) outcome {
	switch {
	case d.err == nil:
		return outcome{state: Delivered}
	case errors.Is(d.err, ErrSkip):
		return outcome{state: Skipped, lastError: d.err.Error()}
	case errors.Is(d.err, ErrPermanent):
		return outcome{state: Dead, lastError: d.err.Error()}
	}
	if d.attempts >= len(r.schedule) {
		return outcome{state: Dead, lastError: d.err.Error()}
	}
	wait := r.schedule[d.attempts]
	if ra, ok := errors.AsType[*RetryAfterError](d.err); ok && ra.After > 0 {
		wait = ra.After
	}
	next := now.Add(wait)
	return outcome{state: Failed, next: &next, lastError: d.err.Error()}
}
