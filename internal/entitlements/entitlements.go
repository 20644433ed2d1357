// Package entitlements keeps what Stripe says each customer may use: the
// subscriptions and their items, the customer's active features, and the
// checkout sessions that link an app's user to a customer. Each row moves
// only forward in Stripe event time.
package entitlements

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// Event identifies the Stripe event that reported a row.
type Event struct {
	ID string
	// Type is the event's type, for its ledger row ("" for a test).
	Type    string
	Created time.Time // Stripe's created: one-second resolution
	// Creation marks a customer.subscription.created event, which never
	// succeeds another.
	Creation bool
	// Before returns the subscription as it was just before the event:
	// the event's object with data.previous_attributes laid over it. Only a
	// same-second tie calls it. Nil: unknown, so never a successor.
	Before func() (Subscription, error)
	// Previous says Before is what the event says it came from (it
	// carried data.previous_attributes), not just its own object. Only
	// such an event, admitted over a row other than the one it came from,
	// reveals that a change is missing before it (a gap), and its first
	// delivery calls Before to see.
	Previous bool
}

// Fetch reads a subscription from Stripe, to settle an unordered event.
type Fetch func(ctx context.Context, subscriptionID string) (Subscription, error)

// Store writes entitlements to Postgres.
type Store struct {
	pool      *pgxpool.Pool
	stale     prometheus.Counter
	unordered prometheus.Counter
}

// NewStore returns a Store on pool; a nil reg leaves its metrics
// unregistered (commands that run once, like stripe sync).
func NewStore(pool *pgxpool.Pool, reg prometheus.Registerer) *Store {
	stale := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "entitlements_stale_events_total",
		Help: "Events the event-time guard refused (older than the stored one, or after a terminal status).",
	})
	unordered := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "entitlements_unordered_events_total",
		Help: "Same-second events neither successor nor provably older, kept out because no STRIPE_API_KEY was set to settle them.",
	})
	if reg != nil {
		reg.MustRegister(stale, unordered)
	}
	return &Store{pool: pool, stale: stale, unordered: unordered}
}

// revalidatedID marks a state read from Stripe to settle an unordered
// event. It must not be the event's own id: the guard lets an event rewrite
// the row it wrote (a replay of the same state), and a redelivery of the
// unordered event would then put its own state back over Stripe's, a
// canceled subscription included. Under this id a redelivery meets the
// same-second rule like any other event.
func revalidatedID(eventID string) string { return "api:" + eventID }

// ApplySQL is the statement ApplySubscription runs on its fast path, for tools/bench to
// run under pgbench as the database's ceiling: the compiler sees the
// dependency.
const ApplySQL = applySQL

// applySQL writes a subscription and its items in one statement, so that a
// first delivery is one round trip and no concurrent delivery can slip
// between a read and a write. The row is replaced only when
//   - the incoming event is the one that wrote it (a replay rewrites the
//     same state). A snapshot's id names only its second, so two
//     listings begun in one second share it without sharing a state: the
//     later one's write replaces a row the earlier one wrote only while
//     that is not terminal, or a listing that read the subscription before
//     it was canceled would revive it; or
//   - the stored status is not terminal (Stripe never revives a canceled
//     or incomplete_expired subscription), and the event is strictly newer
//     or, after the same-second rule judged it under a row lock, $9 names
//     the stored event it succeeds.
//
// The item set is replaced only when the row is (gone and put run only if
// up returned a row). gone and put touch disjoint rows, since all parts of
// one statement see the same snapshot and their order is not defined. The
// last SELECT reads that snapshot: the row as it was before this statement,
// which tells a stale event from a same-second one.
//
// The ledger and the feed ride in the same statement (internal/ledger's
// fragments). old is the stored row's verdict fields, as the snapshot
// shows them, which the lock taken before this statement makes the
// committed state; judged and the last SELECT read it rather than look the
// row up again. change is the feed's row: $29 is the subscription as the
// feed describes it (stateJSON, built from the same values as the
// parameters, so it is what up writes); a new row's change is all of it,
// and an existing row's is what differs from the stored one
// (subscription_state, read through the statement's snapshot, so before
// this statement's writes). The diff lives in migration 00008's functions,
// called only when there is an old row: as expressions in this statement
// Postgres built them on every run, and they cost more than both inserts
// (docs/PERFORMANCE.md). TestSubscriptionChangeIsTheRowsDiff holds the
// change to the JSON diff of the row before and after.
//
// $31 says a customer.subscription.created wrote the row (creation).
// $30 is the state the event says it came from (Event.Before as
// stateJSON; NULL when it says nothing, or for a state read from Stripe).
// An admitted event whose $30 is not the stored state reveals a gap, kept
// as gap_from (the stored state; NULL for a new row, whose past is
// unknown) and gap_to ($30), for the same-second rule (order.go). Anything
// else admitted clears it: a newer second's gaps no longer matter, and a
// successor is admitted only over a row without one. A replay keeps it.
// The comparison is prior's, which the feed's diff reads too, so that
// subscription_state still runs once per replacing write.
//
// judged is the fast path's verdict, as fast reads it, or NULL for a tie
// (settle records it). $26 is the event behind the change (the event, or a
// snapshot's id); $27 and $28 the ledger row's event id and type, NULL
// when this statement records none.
const applySQL = `
WITH old AS (
    SELECT s.last_event_id, s.last_event_created, s.status
    FROM entitlements s
    WHERE s.stripe_subscription_id = $1
), prior(st) AS (
    -- The stored state, read once for both the gap and the feed's diff,
    -- and only by a write that replaces a row.
    SELECT subscription_state($1) FROM old
), up AS (
    INSERT INTO entitlements AS e (
        stripe_subscription_id, stripe_customer_id, status, price_id,
        current_period_end, cancel_at_period_end, last_event_id,
        last_event_created, updated_at, cancel_at, canceled_at, ended_at,
        trial_start, trial_end, pause_collection, access_ends_at, livemode,
        metadata, gap_from, gap_to, creation)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $10, $11, $12, $13, $14,
        $15, $16, $17, $18, NULL, $30::jsonb, $31)
    ON CONFLICT (stripe_subscription_id) DO UPDATE SET
        stripe_customer_id   = EXCLUDED.stripe_customer_id,
        status               = EXCLUDED.status,
        price_id             = EXCLUDED.price_id,
        current_period_end   = EXCLUDED.current_period_end,
        cancel_at_period_end = EXCLUDED.cancel_at_period_end,
        last_event_id        = EXCLUDED.last_event_id,
        last_event_created   = EXCLUDED.last_event_created,
        updated_at           = EXCLUDED.updated_at,
        cancel_at            = EXCLUDED.cancel_at,
        canceled_at          = EXCLUDED.canceled_at,
        ended_at             = EXCLUDED.ended_at,
        trial_start          = EXCLUDED.trial_start,
        trial_end            = EXCLUDED.trial_end,
        pause_collection     = EXCLUDED.pause_collection,
        access_ends_at       = EXCLUDED.access_ends_at,
        livemode             = EXCLUDED.livemode,
        metadata             = EXCLUDED.metadata,
        creation             = EXCLUDED.creation,
        gap_from             = CASE WHEN e.last_event_id = EXCLUDED.last_event_id THEN e.gap_from
                                    ELSE (SELECT p.st FROM prior p WHERE p.st IS DISTINCT FROM EXCLUDED.gap_to
                                          AND EXCLUDED.gap_to IS NOT NULL) END,
        gap_to               = CASE WHEN e.last_event_id = EXCLUDED.last_event_id THEN e.gap_to
                                    ELSE (SELECT EXCLUDED.gap_to FROM prior p WHERE p.st IS DISTINCT FROM EXCLUDED.gap_to) END
    WHERE (e.last_event_id = EXCLUDED.last_event_id
           AND EXCLUDED.last_event_id NOT LIKE 'snapshot:%')
       OR (e.status NOT IN ('canceled', 'incomplete_expired')
           AND (e.last_event_created < EXCLUDED.last_event_created
                OR e.last_event_id = $9::text
                OR e.last_event_id = EXCLUDED.last_event_id))
    RETURNING e.stripe_subscription_id
), gone AS (
    DELETE FROM entitlement_items
    WHERE stripe_subscription_id = $1 AND EXISTS (SELECT FROM up)
      AND stripe_item_id <> ALL ($19::text[])
), put AS (
    INSERT INTO entitlement_items (
        stripe_subscription_id, stripe_item_id, price_id, product_id,
        price_lookup_key, quantity, current_period_start, current_period_end,
        position)
    SELECT $1, i.id, i.price, i.product, i.lookup_key, i.quantity, i.period_start,
        i.period_end, i.position
    FROM unnest($19::text[], $20::text[], $21::text[], $22::text[], $23::bigint[],
        $24::timestamptz[], $25::timestamptz[])
        WITH ORDINALITY AS i(id, price, product, lookup_key, quantity,
            period_start, period_end, position)
    WHERE EXISTS (SELECT FROM up)
    ON CONFLICT (stripe_subscription_id, stripe_item_id) DO UPDATE SET
        price_id             = EXCLUDED.price_id,
        product_id           = EXCLUDED.product_id,
        price_lookup_key     = EXCLUDED.price_lookup_key,
        quantity             = EXCLUDED.quantity,
        current_period_start = EXCLUDED.current_period_start,
        current_period_end   = EXCLUDED.current_period_end,
        position             = EXCLUDED.position
), change(kind, subject, customer, event_id, before, after) AS (
    -- OFFSET 0 keeps the subquery whole, so the diff runs once, not once
    -- per field read from it. Nothing is appended when no field moved (a
    -- replay, an event that moved only bookkeeping).
    SELECT '` + ledger.KindSubscription + `', $1::text, $2::text, $26::text, (d.c).before, (d.c).after
    FROM (SELECT CASE WHEN EXISTS (SELECT FROM old)
                 THEN ledger_diff((SELECT st FROM prior), $29::jsonb)
                 ELSE ROW(NULL, $29::jsonb)::ledger_change END AS c
          FROM up OFFSET 0) d
    WHERE (d.c).after IS NOT NULL
), judged(provider, event_id, event_type, subject, outcome) AS (
    SELECT 'stripe', $27::text, $28::text, $1::text, CASE
        WHEN EXISTS (SELECT FROM up) THEN
            CASE WHEN s.last_event_id = $7 THEN 'unchanged' ELSE 'applied' END
        WHEN s.last_event_created > $8 OR s.status IN ('canceled', 'incomplete_expired') THEN 'stale'
        END
    FROM (SELECT) AS one LEFT JOIN old s ON true
),` + ledger.AppendChangeCTE + `,` + ledger.RecordCTE + `
SELECT EXISTS (SELECT FROM up), s.last_event_id, s.last_event_created, s.status
FROM (SELECT) AS one LEFT JOIN old s ON true`

// lockSQL serialises every write of one subscription, on the fast path
// and the same-second path alike, and is taken before anything else in its
// transaction. Each later statement of that transaction takes its snapshot
// once the lock is held, so it sees the item set the previous holder
// committed and replaces it whole. Without it, two concurrent newer events
// each deleted only the items their own snapshot showed, and a mix of both
// sets could remain (TestApplyConcurrentNewestWins caught it). The lock is
// re-entrant within a session, so write may take it again inside the
// same-second path's transaction.
const lockSQL = `SELECT pg_advisory_xact_lock(hashtext('entitlements'), hashtext($1))`

// querier is a pool or a transaction: the fast path writes on the pool,
// the same-second path inside its transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// written is what applySQL reports: whether it wrote, and the row it found.
type written struct {
	applied       bool
	storedID      *string
	storedCreated *time.Time
	storedStatus  *string
}

// write runs applySQL. successorOf is the stored event the same-second
// rule found this event to succeed ("" on the fast path). cause is the
// event behind the write, for the feed; entry, when not nil, has the
// statement write the event's ledger row with the fast path's verdict.
// came, when not nil, is the state the event says it came from ($30);
// creation, that a customer.subscription.created is written.
func write(ctx context.Context, q querier, sub Subscription, eventID string, created time.Time, successorOf string, cause string, entry *ledger.Entry, came *Subscription, creation bool) (written, error) {
	metadata, err := metadataJSON(sub.Metadata)
	if err != nil {
		return written{}, err
	}
	state, err := stateJSON(sub, metadata)
	if err != nil {
		return written{}, err
	}
	var cameFrom *string
	if came != nil {
		st, err := stateOf(*came)
		if err != nil {
			return written{}, err
		}
		cameFrom = &st
	}
	n := len(sub.Items)
	ids, prices := make([]string, n), make([]string, n)
	products, lookupKeys := make([]*string, n), make([]*string, n)
	quantities := make([]*int64, n)
	starts, ends := make([]*time.Time, n), make([]*time.Time, n)
	for i, it := range sub.Items {
		ids[i], prices[i] = it.ID, it.PriceID
		products[i], lookupKeys[i] = nullString(it.ProductID), nullString(it.PriceLookupKey)
		quantities[i] = it.Quantity
		starts[i], ends[i] = nullTime(it.CurrentPeriodStart), nullTime(it.CurrentPeriodEnd)
	}
	// The lock and the write go in one batch: one round trip, and one
	// implicit transaction when q is the pool.
	b := &pgx.Batch{}
	b.Queue(lockSQL, sub.ID)
	b.Queue(applySQL,
		sub.ID, sub.CustomerID, sub.Status, nullString(sub.PriceID),
		nullTime(sub.CurrentPeriodEnd), sub.CancelAtPeriodEnd, eventID, created,
		nullString(successorOf), nullTime(sub.CancelAt), nullTime(sub.CanceledAt),
		nullTime(sub.EndedAt), nullTime(sub.TrialStart), nullTime(sub.TrialEnd),
		nullString(sub.PauseCollection), nullTime(sub.AccessEndsAt()), sub.Livemode,
		metadata, ids, prices, products, lookupKeys, quantities, starts, ends,
		cause, entryID(entry), entryType(entry), state, cameFrom, creation)
	br := ledger.SendBatch(ctx, q, b)
	var w written
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&w.applied, &w.storedID, &w.storedCreated, &w.storedStatus)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return written{}, fmt.Errorf("write subscription %s from %s: %w", sub.ID, eventID, err)
	}
	return w, nil
}

func terminal(status string) bool {
	return status == "canceled" || status == "incomplete_expired"
}

// ApplySubscription stores sub as reported by ev, unless the guard
// refuses it. fetch, when not nil, settles an unordered same-second event
// by reading the subscription from Stripe; nil keeps the stored row and
// counts it.
//
// A strictly newer or strictly older event (the common case) is one
// statement. A same-second event, or one that raced another delivery, is
// judged again under the row's lock (settle).
func (s *Store) ApplySubscription(ctx context.Context, sub Subscription, ev Event, fetch Fetch) (Result, error) {
	came := ev.cameFrom()
	w, err := write(ctx, s.pool, sub, ev.ID, ev.Created, "", ev.ID, ev.entry(), came, ev.Creation)
	if err != nil {
		return Result{}, err
	}
	if res, ok := s.fast(w, ev.ID, ev.Created); ok {
		return res, nil
	}
	return settle(ctx, s, subscriptionTie(sub, ev, fetch, came))
}

// cameFrom is the state ev says it came from, nil when it says nothing or
// its previous_attributes cannot be read (which proves nothing, as for a
// tie).
func (ev Event) cameFrom() *Subscription {
	if !ev.Previous || ev.Before == nil {
		return nil
	}
	b, err := ev.Before()
	if err != nil {
		return nil
	}
	return &b
}

// readSQL reads a stored subscription and locks its row: a same-second
// event is judged, and a revalidation written, while no other delivery
// for the subscription can write it. Stripe is read between two such
// transactions, and what it said is written only over the row it was
// judged against (settle).
const readSQL = selectSubscriptionSQL + `, gap_from, gap_to, creation
FROM entitlements e WHERE stripe_subscription_id = $1
FOR UPDATE`

// selectSubscriptionSQL reads a stored subscription, its items as the
// feed's JSON (migration 00009's subscription_items, as itemState).
const selectSubscriptionSQL = `
SELECT stripe_customer_id, status, coalesce(price_id, ''), current_period_end,
    cancel_at_period_end, cancel_at, canceled_at, ended_at, trial_start,
    trial_end, coalesce(pause_collection, ''), coalesce(livemode, false),
    metadata, last_event_id, last_event_created,
    subscription_items(e.stripe_subscription_id)`

// read reads a stored subscription under its row lock.
func read(ctx context.Context, tx pgx.Tx, id string) (row[Subscription], bool, error) {
	var from, to []byte
	var creation bool
	st, err := scanSubscription(tx.QueryRow(ctx, readSQL, id), id, &from, &to, &creation)
	st.creation = creation
	if errors.Is(err, pgx.ErrNoRows) {
		return row[Subscription]{}, false, nil
	}
	if err == nil {
		st.gapFrom, err = parseState(from)
	}
	if err == nil {
		st.gapTo, err = parseState(to)
	}
	if err != nil {
		return row[Subscription]{}, false, fmt.Errorf("read subscription %s: %w", id, err)
	}
	return st, true, nil
}

// setGapSQL stores a subscription's gap without touching its state.
const setGapSQL = `UPDATE entitlements SET gap_from = $2::jsonb, gap_to = $3::jsonb WHERE stripe_subscription_id = $1`

// setGap stores a subscription's gap (nil, nil: none).
func setGap(ctx context.Context, tx pgx.Tx, id string, from, to *Subscription) error {
	var args [2]*string
	for i, s := range []*Subscription{from, to} {
		if s == nil {
			continue
		}
		st, err := stateOf(*s)
		if err != nil {
			return err
		}
		args[i] = &st
	}
	if _, err := tx.Exec(ctx, setGapSQL, id, args[0], args[1]); err != nil {
		return fmt.Errorf("store the gap of subscription %s: %w", id, err)
	}
	return nil
}

// scanSubscription scans the columns of selectSubscriptionSQL, then any
// given after them.
func scanSubscription(r pgx.Row, id string, more ...any) (row[Subscription], error) {
	var (
		st                                                     row[Subscription]
		periodEnd, cancelAt, canceledAt, endedAt, tStart, tEnd *time.Time
		items                                                  []itemState
	)
	sub := &st.state
	sub.ID = id
	err := r.Scan(append([]any{&sub.CustomerID, &sub.Status,
		&sub.PriceID, &periodEnd, &sub.CancelAtPeriodEnd, &cancelAt,
		&canceledAt, &endedAt, &tStart, &tEnd, &sub.PauseCollection,
		&sub.Livemode, &sub.Metadata, &st.eventID, &st.storedAt, &items}, more...)...)
	if err != nil {
		return row[Subscription]{}, err
	}
	st.terminal = terminal(sub.Status)
	sub.CurrentPeriodEnd, sub.CancelAt, sub.CanceledAt = value(periodEnd), value(cancelAt), value(canceledAt)
	sub.EndedAt, sub.TrialStart, sub.TrialEnd = value(endedAt), value(tStart), value(tEnd)
	if sub.Metadata == nil {
		sub.Metadata = map[string]string{}
	}
	sub.Items = make([]Item, len(items))
	for i, it := range items {
		start, err1 := parseJSONTime(it.CurrentPeriodStart)
		end, err2 := parseJSONTime(it.CurrentPeriodEnd)
		if err := errors.Join(err1, err2); err != nil {
			return row[Subscription]{}, fmt.Errorf("subscription %s, item %s: %w", id, it.ID, err)
		}
		sub.Items[i] = Item{ID: it.ID, PriceID: it.PriceID, ProductID: deref(it.ProductID),
			PriceLookupKey: deref(it.PriceLookupKey), Quantity: it.Quantity,
			CurrentPeriodStart: start, CurrentPeriodEnd: end}
	}
	return st, nil
}

// subscriptionTie is a subscription event for settle.
func subscriptionTie(sub Subscription, ev Event, fetch Fetch, came *Subscription) tie[Subscription] {
	t := tie[Subscription]{
		eventID:  ev.ID,
		entry:    ev.entry(),
		subject:  sub.ID,
		at:       ev.Created,
		creation: ev.Creation,
		ends:     terminal(sub.Status),
		read: func(ctx context.Context, tx pgx.Tx) (row[Subscription], bool, error) {
			if _, err := tx.Exec(ctx, lockSQL, sub.ID); err != nil {
				return row[Subscription]{}, false, fmt.Errorf("lock subscription %s: %w", sub.ID, err)
			}
			return read(ctx, tx, sub.ID)
		},
		after: func(stored Subscription) []Field { return diff(stored, sub) },
		state: sub,
		equal: func(a, b Subscription) bool { return len(diff(a, b)) == 0 },
		setGap: func(ctx context.Context, tx pgx.Tx, from, to *Subscription) error {
			return setGap(ctx, tx, sub.ID, from, to)
		},
		write: func(ctx context.Context, tx pgx.Tx, storedID string) error {
			_, err := write(ctx, tx, sub, ev.ID, ev.Created, storedID, ev.ID, nil, came, ev.Creation)
			return err
		},
	}
	if ev.Before != nil {
		t.prior = ev.Before
		t.before = func(stored Subscription) ([]Field, error) {
			b, err := ev.Before()
			if err != nil {
				return nil, err
			}
			return diff(stored, b), nil
		}
	}
	if fetch != nil {
		t.fetch = func(ctx context.Context) (Subscription, error) {
			fetched, err := fetch(ctx, sub.ID)
			if err != nil {
				return Subscription{}, fmt.Errorf("revalidate %s for %s: %w", sub.ID, ev.ID, err)
			}
			return fetched, nil
		}
		t.writeFetched = func(ctx context.Context, tx pgx.Tx, fetched Subscription, storedID string) error {
			_, err := write(ctx, tx, fetched, revalidatedID(ev.ID), ev.Created, storedID, ev.ID, nil, nil, false)
			return err
		}
	}
	return t
}

// snapshotID is the last_event_id of a row written by a snapshot: no
// event wrote it, and the time says which listing did.
func snapshotID(takenAt time.Time) string {
	return snapshotPrefix + takenAt.UTC().Format(time.RFC3339)
}

const snapshotPrefix = "snapshot:"

// IsSnapshot reports whether a row's last event id is a snapshot's (stripe
// sync, or stripe verify --repair), not a webhook event's.
func IsSnapshot(eventID string) bool { return strings.HasPrefix(eventID, snapshotPrefix) }

// SnapshotSubscription stores sub as read from Stripe's API by a listing that
// began at takenAt (stripe sync). The tie rule: the snapshot stands for
// takenAt's whole second, truncated; a stored event from that second or
// later is kept, since it may postdate the read, while anything older is
// in the snapshot. The row then records the snapshot as its event, so a
// webhook from the same second meets the same-second rule against it.
func (s *Store) SnapshotSubscription(ctx context.Context, sub Subscription, takenAt time.Time) (Result, error) {
	at := takenAt.UTC().Truncate(time.Second)
	w, err := write(ctx, s.pool, sub, snapshotID(at), at, "", snapshotID(at), nil, nil, false)
	if err != nil {
		return Result{}, err
	}
	return s.snapshotResult(w), nil
}

// snapshotResult reads a snapshot's write: applied, or kept out by a
// stored event as new as the snapshot or newer.
func (s *Store) snapshotResult(w written) Result {
	if !w.applied {
		s.stale.Inc()
		return Result{Verdict: Stale, StoredEventID: deref(w.storedID)}
	}
	return Result{Verdict: Applied, StoredEventID: deref(w.storedID)}
}

// metadataJSON is the stored form of metadata: an object, never null. It
// is a string, not []byte: pgx sends a []byte as bytea in the exec and
// simple_protocol query modes, which a jsonb column refuses (22P02); a
// string is text to every mode.
func metadataJSON(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// state is a subscription as the feed describes it: its row without the
// bookkeeping, and its items in order. Migration 00008's
// subscription_state builds the same shape from the stored row (its items
// from 00009's subscription_items, which is also how the service reads
// stored items back, as itemState), and
// applySQL compares the two as jsonb, so the values here must print as
// Postgres prints them: timestamps in UTC to the microsecond, absent ones
// null, an empty item list [].
type state struct {
	ID                string          `json:"stripe_subscription_id"`
	CustomerID        string          `json:"stripe_customer_id"`
	Status            string          `json:"status"`
	PriceID           *string         `json:"price_id"`
	CurrentPeriodEnd  *string         `json:"current_period_end"`
	CancelAtPeriodEnd bool            `json:"cancel_at_period_end"`
	CancelAt          *string         `json:"cancel_at"`
	CanceledAt        *string         `json:"canceled_at"`
	EndedAt           *string         `json:"ended_at"`
	TrialStart        *string         `json:"trial_start"`
	TrialEnd          *string         `json:"trial_end"`
	PauseCollection   *string         `json:"pause_collection"`
	AccessEndsAt      *string         `json:"access_ends_at"`
	Livemode          bool            `json:"livemode"`
	Metadata          json.RawMessage `json:"metadata"`
	Items             []itemState     `json:"items"`
}

type itemState struct {
	ID                 string  `json:"id"`
	PriceID            string  `json:"price_id"`
	ProductID          *string `json:"product_id"`
	PriceLookupKey     *string `json:"price_lookup_key"`
	Quantity           *int64  `json:"quantity"`
	CurrentPeriodStart *string `json:"current_period_start"`
	CurrentPeriodEnd   *string `json:"current_period_end"`
}

// stateJSON is sub's state as JSON; metadata is its metadataJSON.
func stateJSON(sub Subscription, metadata string) (string, error) {
	st := state{
		ID: sub.ID, CustomerID: sub.CustomerID, Status: sub.Status,
		PriceID: nullString(sub.PriceID), CurrentPeriodEnd: jsonTime(sub.CurrentPeriodEnd),
		CancelAtPeriodEnd: sub.CancelAtPeriodEnd, CancelAt: jsonTime(sub.CancelAt),
		CanceledAt: jsonTime(sub.CanceledAt), EndedAt: jsonTime(sub.EndedAt),
		TrialStart: jsonTime(sub.TrialStart), TrialEnd: jsonTime(sub.TrialEnd),
		PauseCollection: nullString(sub.PauseCollection), AccessEndsAt: jsonTime(sub.AccessEndsAt()),
		Livemode: sub.Livemode, Metadata: json.RawMessage(metadata),
		Items: make([]itemState, len(sub.Items)),
	}
	for i, it := range sub.Items {
		st.Items[i] = itemState{
			ID: it.ID, PriceID: it.PriceID, ProductID: nullString(it.ProductID),
			PriceLookupKey: nullString(it.PriceLookupKey), Quantity: it.Quantity,
			CurrentPeriodStart: jsonTime(it.CurrentPeriodStart), CurrentPeriodEnd: jsonTime(it.CurrentPeriodEnd),
		}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("subscription %s as JSON: %w", sub.ID, err)
	}
	// A string, not []byte: in the simple protocol (a transaction pooler's
	// mode) pgx would send bytes as bytea.
	return string(b), nil
}

// stateOf is sub's state as JSON (stateJSON with its metadata).
func stateOf(sub Subscription) (string, error) {
	metadata, err := metadataJSON(sub.Metadata)
	if err != nil {
		return "", err
	}
	return stateJSON(sub, metadata)
}

// parseState reads a state stateJSON or subscription_state wrote; nil for
// NULL.
func parseState(b []byte) (*Subscription, error) {
	if b == nil {
		return nil, nil
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("stored state: %w", err)
	}
	sub := Subscription{ID: st.ID, CustomerID: st.CustomerID, Status: st.Status,
		PriceID: deref(st.PriceID), CancelAtPeriodEnd: st.CancelAtPeriodEnd,
		PauseCollection: deref(st.PauseCollection), Livemode: st.Livemode,
		Metadata: map[string]string{}, Items: make([]Item, len(st.Items))}
	var errs []error
	at := func(s *string) time.Time {
		t, err := parseJSONTime(s)
		errs = append(errs, err)
		return t
	}
	sub.CurrentPeriodEnd, sub.CancelAt, sub.CanceledAt = at(st.CurrentPeriodEnd), at(st.CancelAt), at(st.CanceledAt)
	sub.EndedAt, sub.TrialStart, sub.TrialEnd = at(st.EndedAt), at(st.TrialStart), at(st.TrialEnd)
	if len(st.Metadata) > 0 && string(st.Metadata) != "null" {
		errs = append(errs, json.Unmarshal(st.Metadata, &sub.Metadata))
	}
	for i, it := range st.Items {
		sub.Items[i] = Item{ID: it.ID, PriceID: it.PriceID, ProductID: deref(it.ProductID),
			PriceLookupKey: deref(it.PriceLookupKey), Quantity: it.Quantity,
			CurrentPeriodStart: at(it.CurrentPeriodStart), CurrentPeriodEnd: at(it.CurrentPeriodEnd)}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("stored state: %w", err)
	}
	return &sub, nil
}

// jsonTime prints t as Postgres prints a timestamptz in JSON in UTC, to the
// microsecond it stores (pgx sends t truncated to it); nil for a zero t.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Truncate(time.Microsecond).Format("2006-01-02T15:04:05.999999-07:00")
	return &s
}

// parseJSONTime reads a timestamp as jsonTime prints it, or as Postgres
// prints a timestamptz in JSON in any time zone; zero for nil.
func parseJSONTime(s *string) (time.Time, error) {
	if s == nil {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	return t.UTC(), err
}

// provider names Stripe in the ledger, as the claim flow does.
const provider = "stripe"

// entry is the event's ledger key.
func (ev Event) entry() *ledger.Entry {
	return &ledger.Entry{Provider: provider, EventID: ev.ID, Type: ev.Type}
}

func entryID(e *ledger.Entry) *string {
	if e == nil {
		return nil
	}
	return &e.EventID
}

func entryType(e *ledger.Entry) *string {
	if e == nil {
		return nil
	}
	return nullString(e.Type)
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func value(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
