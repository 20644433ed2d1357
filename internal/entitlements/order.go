package entitlements

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// facts are what the guard weighs: the stored row and the incoming event.
type facts struct {
	// sameEvent: the stored row came from this event.
	sameEvent bool
	// terminal: the stored status is terminal.
	terminal bool
	storedAt time.Time
	at       time.Time
	// creation marks an event that never succeeds another
	// (customer.subscription.created); storedCreation a stored row such
	// an event wrote, which every other event of its second succeeds.
	creation, storedCreation bool
	// ends: the event's status is terminal. Stripe never leaves a
	// terminal status, so such an event follows every state that is not
	// terminal: it cannot be a change missing before the stored row.
	ends bool
	// after returns the stored fields that differ from the event's state;
	// before those that differ from the state before the event. before is
	// nil, or fails, when the state before the event cannot be known.
	after  func() []Field
	before func() ([]Field, error)
	// gap says how the event stands to the stored row's gap; called only
	// for a same-second event whose state before it is known.
	gap func() gapFacts
}

// gapFacts place a same-second event against what the stored row knows of
// the changes missing before it (a gap: the stored event said it came
// from a state other than the one stored before it).
type gapFacts struct {
	// known: the row has a gap; fromKnown: its start is known (an update
	// that was the first event seen leaves only its end).
	known, fromKnown bool
	// startsIt: the state before the event is the gap's start; endsIt:
	// the event's state is the gap's end. Neither when more than one
	// change is missing (many), which the row cannot place.
	startsIt, endsIt, many bool
	// unknownPast: the row was read from Stripe to settle an event of its
	// second, so which of that second's changes it holds is unknown.
	unknownPast bool
	// canAsk: Stripe can be asked (STRIPE_API_KEY).
	canAsk bool
}

// gapMove is what a verdict does to the stored row's gap.
type gapMove int

const (
	gapKeep gapMove = iota
	// gapOpen: the event revealed a gap from the stored state to the
	// state before it.
	gapOpen
	// gapClose: the event filled the gap.
	gapClose
	// gapEndAtBefore: the event was the gap's last change; the gap now
	// ends at the state before it.
	gapEndAtBefore
	// gapStartAtAfter: the event was the gap's first change; the gap now
	// starts at its state.
	gapStartAtAfter
	// gapMany: the event revealed a second gap, which the row cannot
	// hold beside the first: no event of the second succeeds it now.
	gapMany
)

// order is the guard's rule, written once for every guarded row. Stripe's
// created has one-second resolution, so events of one second cannot be
// ordered by time; for those, an event is applied when it is the stored
// state's successor: the state before it (its object with
// previous_attributes laid over it) is exactly the stored state, so every
// field it names held the previous value and every field it does not name
// already equals its value.
//
// A successor verdict is only sound when no change of that second is
// missing before the stored row. When the stored event's own
// previous_attributes did not match the row it replaced, a change is
// missing there (a gap, from the state stored before to the state the
// event came from), and an event of the same second that fits the gap is
// that missing predecessor, not a successor: a subscription upgraded and
// downgraded back in one second, delivered downgrade first, must not end
// upgraded.
//
//   - the stored row came from this event: Unchanged (a replay);
//   - the stored status is terminal: Stale (Stripe never revives it);
//   - strictly newer: Applied; strictly older: Stale;
//   - same second: a creation event never succeeds another (Stale), and
//     every other event succeeds a row one wrote (Applied); an event
//     that ends the subscription (a terminal status) succeeds the stored
//     state, which is not terminal, whatever gap it has (Applied); the event's
//     own state already stored: Unchanged (remembering the gap it
//     reveals, if any: a second one leaves a row no event of the second
//     succeeds); the state before it unknown: Unordered;
//   - same second, the row has a gap: an event that fills it exactly is
//     Stale (but Unordered when it also looks like a successor and Stripe
//     can be asked: the payloads cannot tell which of the two it is); one
//     that is not the stored state's successor and starts or ends the gap
//     is Stale and narrows it; anything else is Unordered;
//   - same second, the row was read from Stripe for an event of that
//     second: Unordered (its place among that second's changes is unknown);
//   - same second, no gap: the stored state is the one before the event:
//     Applied; otherwise Unordered.
//
// order never answers Revalidated: that is what settle makes of Unordered
// when it can ask Stripe.
func order(f facts) (Verdict, []Field, gapMove) {
	switch {
	case f.sameEvent:
		return Unchanged, nil, gapKeep
	case f.terminal:
		return Stale, nil, gapKeep
	case f.at.After(f.storedAt):
		return Applied, nil, gapKeep
	case f.at.Before(f.storedAt):
		return Stale, nil, gapKeep
	case f.creation:
		return Stale, nil, gapKeep
	case f.ends:
		return Applied, nil, gapKeep
	case f.storedCreation:
		// Written like a newer event, its gap (if any) remembered.
		return Applied, nil, gapKeep
	}
	var differs []Field
	var beforeErr error
	if f.before != nil {
		differs, beforeErr = f.before()
	}
	// previous_attributes that cannot be read prove nothing; failing the
	// delivery instead would fail every retry of it.
	beforeKnown := f.before != nil && beforeErr == nil
	successor := beforeKnown && len(differs) == 0
	var g gapFacts
	if beforeKnown {
		g = f.gap()
	}
	if len(f.after()) == 0 {
		switch {
		case !beforeKnown || successor || g.unknownPast:
			return Unchanged, nil, gapKeep
		case g.known:
			return Unchanged, nil, gapMany
		}
		return Unchanged, nil, gapOpen
	}
	unordered := func() (Verdict, []Field, gapMove) {
		if beforeKnown && len(differs) > 0 {
			return Unordered, differs, gapKeep
		}
		return Unordered, f.after(), gapKeep
	}
	switch {
	case !beforeKnown:
		return unordered()
	case g.known:
		switch {
		case g.fromKnown && g.startsIt && g.endsIt:
			if successor && g.canAsk {
				return unordered()
			}
			return Stale, nil, gapClose
		case successor:
			return unordered()
		case g.endsIt:
			return Stale, nil, gapEndAtBefore
		case g.fromKnown && g.startsIt:
			return Stale, nil, gapStartAtAfter
		}
		return unordered()
	case g.unknownPast:
		return unordered()
	case successor:
		return Applied, nil, gapKeep
	}
	return unordered()
}

// fast reads the fast path's one statement: settled (applied, the same
// event again, or stale), or not, when the event ties with the stored one
// or raced another delivery and must be settled under the row's lock.
func (s *Store) fast(w written, eventID string, at time.Time) (Result, bool) {
	res := Result{StoredEventID: deref(w.storedID)}
	switch {
	case w.applied && res.StoredEventID == eventID:
		res.Verdict = Unchanged
	case w.applied:
		res.Verdict = Applied
	case w.storedCreated != nil && (w.storedCreated.After(at) || terminal(deref(w.storedStatus))):
		s.stale.Inc()
		res.Verdict = Stale
	default:
		return Result{}, false
	}
	return res, true
}

// row is a guarded row as read back under its lock, with the event that
// wrote it.
type row[S any] struct {
	state    S
	eventID  string
	storedAt time.Time
	terminal bool
	// creation: a creation event wrote the row.
	creation bool
	// gapFrom and gapTo are the row's gap (migration 00010): gapTo nil,
	// none; gapFrom nil with gapTo set, a gap whose start is unknown.
	gapFrom, gapTo *S
}

// tie is one event the fast path could not settle, with what settle needs
// to judge it against its kind of row and to carry out the verdict.
type tie[S any] struct {
	eventID string
	// entry and subject are the event's ledger row, which settle writes
	// with its verdict in the same transaction (the writes it runs record
	// none themselves).
	entry    *ledger.Entry
	subject  string
	at       time.Time
	creation bool
	ends     bool // the event's status is terminal (facts.ends)
	// read locks and reads the stored row; false when there is none.
	read func(ctx context.Context, tx pgx.Tx) (row[S], bool, error)
	// after names the stored fields that differ from the event's state;
	// before those that differ from the state before the event, nil when
	// that state is unknown.
	after  func(stored S) []Field
	before func(stored S) ([]Field, error)
	// state is the event's state, prior the state before it (nil when
	// unknown, as before), and equal says whether two states are the same
	// for the guard: they place the event against the row's gap.
	state S
	prior func() (S, error)
	equal func(a, b S) bool
	// setGap stores the row's gap (nil, nil: none) without touching its
	// state, when a verdict that writes nothing moves it.
	setGap func(ctx context.Context, tx pgx.Tx, from, to *S) error
	// write stores the event's state as the successor of the stored event.
	write writeFunc
	// fetch reads the state from Stripe, to settle an unordered event;
	// nil without an API. writeFetched stores what it read as the
	// successor of the stored event.
	fetch        func(ctx context.Context) (S, error)
	writeFetched func(ctx context.Context, tx pgx.Tx, fetched S, storedID string) error
}

// writeFunc writes inside settle's transaction, naming the stored event
// the write succeeds.
type writeFunc func(ctx context.Context, tx pgx.Tx, storedID string) error

// settleAttempts bounds settle's transactions: an unordered event takes
// two (judge, then write what Stripe said), and one more pair each time
// the row moves while Stripe is being read.
const settleAttempts = 6

// errMoved: the row changed while Stripe was being read; judge again.
var errMoved = errors.New("row changed while Stripe was read")

// settle judges t under the row's lock and carries out the verdict in the
// same transaction. An unordered event with an API to ask is settled in
// two steps, so that no transaction is open while Stripe answers: the
// first transaction judges it and ends; Stripe is read with no connection
// held; a second transaction locks the row again and writes what was read
// only if the row still holds the state it was judged against. If another
// delivery wrote the row in between (possibly a newer state than the one
// read), the event is judged afresh against that row, so a state read
// earlier never overwrites one written later.
func settle[S any](ctx context.Context, s *Store, t tie[S]) (Result, error) {
	var fetched *fetchedState[S]
	for range settleAttempts {
		res, err := settleOnce(ctx, s, t, fetched)
		var need *needFetch
		switch {
		case errors.Is(err, errMoved):
			fetched = nil
			continue
		case errors.As(err, &need):
			state, err := t.fetch(ctx)
			if err != nil {
				return Result{}, err
			}
			fetched = &fetchedState[S]{state: state, against: need.storedID}
			continue
		}
		return res, err
	}
	return Result{}, fmt.Errorf("apply %s: %w, %d times", t.eventID, errMoved, settleAttempts)
}

// fetchedState is a state read from Stripe for an unordered event, and the
// stored event it was judged against.
type fetchedState[S any] struct {
	state   S
	against string
}

// needFetch: the event is unordered and Stripe can be asked; the
// transaction that judged it has ended.
type needFetch struct{ storedID string }

func (n *needFetch) Error() string { return "unordered: read Stripe, then judge again" }

// settleOnce is one transaction of settle: judge under the row's lock,
// then carry out the verdict, writing fetched (when the verdict is
// unordered and the row is still the one it was judged against).
func settleOnce[S any](ctx context.Context, s *Store, t tie[S], fetched *fetchedState[S]) (res Result, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("apply %s: %w", t.eventID, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	st, found, err := t.read(ctx, tx)
	if err != nil {
		return Result{}, err
	}
	// Not found: deleted in between (nothing here deletes rows), so the
	// event is written as new.
	res = Result{Verdict: Applied, StoredEventID: st.eventID}
	if found {
		f := facts{sameEvent: st.eventID == t.eventID, terminal: st.terminal,
			storedAt: st.storedAt, at: t.at, creation: t.creation, storedCreation: st.creation, ends: t.ends,
			after: func() []Field { return t.after(st.state) }}
		if t.before != nil {
			f.before = func() ([]Field, error) { return t.before(st.state) }
		}
		f.gap = func() gapFacts { return t.placeInGap(st) }
		var move gapMove
		res.Verdict, res.Differs, move = order(f)
		if err := t.moveGap(ctx, tx, st, move); err != nil {
			return Result{}, err
		}
	}
	switch res.Verdict {
	case Stale:
		s.stale.Inc()
	case Applied:
		if err := t.write(ctx, tx, st.eventID); err != nil {
			return Result{}, err
		}
	case Unordered:
		switch {
		case t.fetch == nil:
			s.unordered.Inc()
		case fetched == nil:
			return Result{}, &needFetch{storedID: st.eventID}
		case fetched.against != st.eventID:
			return Result{}, errMoved
		default:
			if err := t.writeFetched(ctx, tx, fetched.state, st.eventID); err != nil {
				return Result{}, err
			}
			res.Verdict = Revalidated
		}
	}
	if err := ledger.Record(ctx, tx, t.entry, t.subject, ledgerOutcome(res.Verdict)); err != nil {
		return Result{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("apply %s: %w", t.eventID, err)
	}
	return res, nil
}

// ledgerOutcome spells a verdict as the ledger does: a state read from Stripe
// and stored (Revalidated) is applied, a write happened.
func ledgerOutcome(v Verdict) ledger.Outcome {
	switch v {
	case Unchanged:
		return ledger.Unchanged
	case Stale:
		return ledger.Stale
	case Unordered:
		return ledger.Unordered
	}
	return ledger.Applied
}

// placeInGap places a same-second event, whose state before it is known,
// against the stored row's gap.
func (t tie[S]) placeInGap(st row[S]) gapFacts {
	g := gapFacts{known: st.gapTo != nil, fromKnown: st.gapFrom != nil,
		unknownPast: strings.HasPrefix(st.eventID, revalidatedID("")), canAsk: t.fetch != nil}
	g.many = g.known && g.fromKnown && t.equal(*st.gapFrom, *st.gapTo)
	if !g.known || g.many || t.prior == nil {
		return g
	}
	g.endsIt = t.equal(t.state, *st.gapTo)
	if b, err := t.prior(); err == nil && g.fromKnown {
		g.startsIt = t.equal(b, *st.gapFrom)
	}
	return g
}

// moveGap stores what a verdict did to the row's gap.
func (t tie[S]) moveGap(ctx context.Context, tx pgx.Tx, st row[S], move gapMove) error {
	if move == gapKeep || t.setGap == nil {
		return nil
	}
	before := func() *S {
		b, err := t.prior()
		if err != nil {
			return nil
		}
		return &b
	}
	from, to := st.gapFrom, st.gapTo
	switch move {
	case gapOpen:
		from, to = &st.state, before()
	case gapClose:
		from, to = nil, nil
	case gapEndAtBefore:
		to = before()
	case gapStartAtAfter:
		from = &t.state
	case gapMany:
		// Stored as a gap from a state to itself, which no other move
		// leaves (a gap that closes is cleared).
		return t.setGap(ctx, tx, &st.state, &st.state)
	}
	if to == nil || (from != nil && t.equal(*from, *to)) {
		from, to = nil, nil
	}
	return t.setGap(ctx, tx, from, to)
}
