package entitlements

import (
	"context"
	"errors"
	"fmt"
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
	// (customer.subscription.created).
	creation bool
	// after returns the stored fields that differ from the event's state;
	// before those that differ from the state before the event. before is
	// nil, or fails, when the state before the event cannot be known.
	after  func() []Field
	before func() ([]Field, error)
}

// order is the guard's rule, written once for every guarded row. Stripe's
// created has one-second resolution, so events of one second cannot be
// ordered by time; for those, an event is applied when it is the stored
// state's successor: the state before it (its object with
// previous_attributes laid over it) is exactly the stored state, so every
// field it names held the previous value and every field it does not name
// already equals its value.
//
//   - the stored row came from this event: Unchanged (a replay);
//   - the stored status is terminal: Stale (Stripe never revives it);
//   - strictly newer: Applied; strictly older: Stale;
//   - same second: a creation event never succeeds another (Stale); the
//     event's own state already stored: Unchanged; the stored state is the
//     one before the event: Applied; otherwise Unordered.
//
// order never answers Revalidated: that is what settle makes of Unordered
// when it can ask Stripe.
func order(f facts) (Verdict, []Field) {
	switch {
	case f.sameEvent:
		return Unchanged, nil
	case f.terminal:
		return Stale, nil
	case f.at.After(f.storedAt):
		return Applied, nil
	case f.at.Before(f.storedAt):
		return Stale, nil
	case f.creation:
		return Stale, nil
	}
	if len(f.after()) == 0 {
		return Unchanged, nil
	}
	if f.before == nil {
		return Unordered, f.after()
	}
	differs, err := f.before()
	if err != nil {
		// previous_attributes that cannot be read prove nothing; failing
		// the delivery instead would fail every retry of it.
		return Unordered, f.after()
	}
	if len(differs) == 0 {
		return Applied, nil
	}
	return Unordered, differs
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
	// read locks and reads the stored row; false when there is none.
	read func(ctx context.Context, tx pgx.Tx) (row[S], bool, error)
	// after names the stored fields that differ from the event's state;
	// before those that differ from the state before the event, nil when
	// that state is unknown.
	after  func(stored S) []Field
	before func(stored S) ([]Field, error)
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
			storedAt: st.storedAt, at: t.at, creation: t.creation,
			after: func() []Field { return t.after(st.state) }}
		if t.before != nil {
			f.before = func() ([]Field, error) { return t.before(st.state) }
		}
		res.Verdict, res.Differs = order(f)
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
