package entitlements

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// verdict is what the guard does with an event, given the stored row.
type verdict int

const (
	admit     verdict = iota + 1 // write the event's state
	same                         // the stored state is already the event's: nothing to write
	stale                        // the stored state is newer: keep it
	unordered                    // a same-second event that cannot be ordered: ask Stripe, or keep and count
)

func (v verdict) String() string {
	return [...]string{"", "admit", "same", "stale", "unordered"}[v]
}

// order is the guard's rule, written once for every guarded row. Stripe's
// created has one-second resolution, so events of one second cannot be
// ordered by time; for those, an event is admitted when it is the stored
// state's successor: the state before it (its object with
// previous_attributes laid over it) is exactly the stored state, so every
// field it names held the previous value and every field it does not name
// already equals its value.
//
//   - the stored row came from this event: same (a replay);
//   - the stored status is terminal: stale (Stripe never revives it);
//   - strictly newer: admit; strictly older: stale;
//   - same second: a creation event never succeeds another (stale); the
//     event's own state already stored: same; the stored state is the one
//     before the event: admit; otherwise unordered.
//
// after and before return the stored fields that differ from the event's
// state and from the state before it; before is nil, or fails, when the
// state before the event cannot be known.
func order(sameEvent, terminal bool, storedAt, at time.Time, creation bool,
	after func() []Field, before func() ([]Field, error)) (verdict, []Field) {
	switch {
	case sameEvent:
		return same, nil
	case terminal:
		return stale, nil
	case at.After(storedAt):
		return admit, nil
	case at.Before(storedAt):
		return stale, nil
	case creation:
		return stale, nil
	}
	if len(after()) == 0 {
		return same, nil
	}
	if before == nil {
		return unordered, after()
	}
	differs, err := before()
	if err != nil {
		// previous_attributes that cannot be read prove nothing; failing
		// the delivery instead would fail every retry of it.
		return unordered, after()
	}
	if len(differs) == 0 {
		return admit, nil
	}
	return unordered, differs
}

// judge applies order to a subscription event.
func judge(st stored, sub Subscription, ev Event) (verdict, []Field) {
	var before func() ([]Field, error)
	if ev.Before != nil {
		before = func() ([]Field, error) {
			b, err := ev.Before()
			if err != nil {
				return nil, err
			}
			return diff(st.sub, b), nil
		}
	}
	return order(st.eventID == ev.ID, terminal(st.sub.Status), st.created, ev.Created, ev.Creation,
		func() []Field { return diff(st.sub, sub) }, before)
}

// tie is a same-second judgement and the means to carry it out.
type tie struct {
	verdict verdict
	result  Result // StoredEventID, Differs
	// admit writes the event's state as the stored state's successor.
	admit func(ctx context.Context, tx pgx.Tx) error
	// revalidate writes the state read from Stripe; nil without an API.
	revalidate func(ctx context.Context, tx pgx.Tx) error
}

// settle judges under a row lock and carries out the verdict in the same
// transaction: the read, any call to Stripe and the write happen while no
// other delivery can write the row, so two revalidations commit in the
// order they read.
func (s *Store) settle(ctx context.Context, eventID string, judge func(ctx context.Context, tx pgx.Tx) (tie, error)) (res Result, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("apply %s: %w", eventID, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	t, err := judge(ctx, tx)
	if err != nil {
		return Result{}, err
	}
	res = t.result
	switch t.verdict {
	case same:
		res.Applied = true
	case stale:
		s.stale.Inc()
		res.Stale = true
	case admit:
		if err := t.admit(ctx, tx); err != nil {
			return Result{}, err
		}
		res.Applied = true
	case unordered:
		if t.revalidate == nil {
			s.unordered.Inc()
			res.Unordered = true
			break
		}
		if err := t.revalidate(ctx, tx); err != nil {
			return Result{}, err
		}
		res.Revalidated = true
	}
	if err := tx.Commit(ctx); err != nil {
		return Result{}, fmt.Errorf("apply %s: %w", eventID, err)
	}
	return res, nil
}
