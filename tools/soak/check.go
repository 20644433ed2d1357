package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// verdict is the database held against the model.
type verdict struct {
	// lostSubs: subscriptions whose stored state is not the model's final
	// state (or that have no row). lostMails: mails to support with no
	// support message.
	lostSubs, lostMails int
	// regressed: stored last_event_created older than the model's final
	// event's (state moved backwards, or never caught up).
	regressed int
	// revived: a terminated subscription stored with a live status.
	revived int
	// unordered: subscriptions whose final event the service could not
	// place among the changes of its second and kept out, as its ledger
	// says (outcome unordered): the soak runs without STRIPE_API_KEY, and
	// that is what the service does then (docs/STRIPE.md). Visible, so
	// not a loss; reported.
	unordered int
	// duplicated: mails with more than one support message.
	duplicated int
	// unexpected: rows the model has no event for, and support messages for
	// mail to nobody in support.
	unexpected int
	// ackedEarly: mails answered 2xx before their support message was
	// created, i.e. acknowledged work that a later delivery did (a wrong
	// 2xx that a redelivery happened to repair).
	ackedEarly int
	// examples are the first few discrepancies, for the report.
	examples []string
}

func (v verdict) lost() int { return v.lostSubs + v.lostMails }

func (v verdict) ok() bool {
	return v.lost() == 0 && v.regressed == 0 && v.revived == 0 && v.duplicated == 0 && v.unexpected == 0 && v.ackedEarly == 0
}

func (v *verdict) example(format string, args ...any) {
	if len(v.examples) < 10 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

type storedEntitlement struct {
	status      string
	priceID     *string
	periodEnd   *time.Time
	cancelAtEnd bool
	lastEventID string
	lastCreated time.Time
}

// check compares the database at dbURL with the model of w.
func check(ctx context.Context, dbURL string, w *workload) (verdict, error) {
	var v verdict
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return v, fmt.Errorf("check: %w", err)
	}
	defer conn.Close(context.Background())

	stored := map[string]storedEntitlement{}
	rows, err := conn.Query(ctx, `SELECT stripe_subscription_id, status, price_id, current_period_end,
		cancel_at_period_end, last_event_id, last_event_created FROM entitlements`)
	if err != nil {
		return v, fmt.Errorf("check entitlements: %w", err)
	}
	for rows.Next() {
		var id string
		var e storedEntitlement
		if err := rows.Scan(&id, &e.status, &e.priceID, &e.periodEnd, &e.cancelAtEnd, &e.lastEventID, &e.lastCreated); err != nil {
			return v, fmt.Errorf("check entitlements: %w", err)
		}
		stored[id] = e
	}
	if err := rows.Err(); err != nil {
		return v, fmt.Errorf("check entitlements: %w", err)
	}
	keptOut, err := unorderedEvents(ctx, conn)
	if err != nil {
		return v, err
	}
	for _, s := range w.subs {
		want := s.want
		got, ok := stored[s.id]
		delete(stored, s.id)
		if !ok {
			v.lostSubs++
			v.example("lost: %s has no entitlement, want %s from %s", s.id, want.Status, want.ID)
			continue
		}
		if isTerminal(want.Status) && !isTerminal(got.status) {
			v.revived++
			v.example("revived: %s holds %s from %s, after its termination by %s", s.id, got.status, got.lastEventID, want.ID)
		}
		if got.lastCreated.Before(time.Unix(want.Created, 0)) {
			v.regressed++
			v.example("regressed: %s holds %s from %s (created %d), want %s from %s (created %d)",
				s.id, got.status, got.lastEventID, got.lastCreated.Unix(), want.Status, want.ID, want.Created)
		}
		if !slices.ContainsFunc(s.accept, func(e *stripeEvent) bool { return sameState(got, e) }) {
			if keptOut[want.ID] {
				v.unordered++
				continue
			}
			v.lostSubs++
			v.example("lost: %s holds %s from %s (created %d), want the state of %s (%s, created %d)",
				s.id, got.status, got.lastEventID, got.lastCreated.Unix(), want.ID, want.Status, want.Created)
		}
	}
	for id := range stored {
		v.unexpected++
		v.example("unexpected: entitlement %s has no events in the model", id)
	}

	counts := map[string]int{}
	created := map[string]time.Time{}
	mrows, err := conn.Query(ctx, `SELECT coalesce(message_id, ''), count(*), min(created_at) FROM support_messages WHERE source = 'email' GROUP BY 1`)
	if err != nil {
		return v, fmt.Errorf("check support messages: %w", err)
	}
	for mrows.Next() {
		var id string
		var n int
		var at time.Time
		if err := mrows.Scan(&id, &n, &at); err != nil {
			return v, fmt.Errorf("check support messages: %w", err)
		}
		counts[id], created[id] = n, at
	}
	if err := mrows.Err(); err != nil {
		return v, fmt.Errorf("check support messages: %w", err)
	}
	// The first 2xx of a Message-ID, over the mail and its twins.
	firstAck := map[string]int64{}
	for _, m := range w.mails {
		if at := m.firstAck.Load(); at != 0 && (firstAck[m.MessageID] == 0 || at < firstAck[m.MessageID]) {
			firstAck[m.MessageID] = at
		}
	}
	seen := map[string]bool{}
	for _, m := range w.mails {
		if m.twinOf != nil || seen[m.MessageID] {
			continue // judged with its original
		}
		seen[m.MessageID] = true
		n := counts[m.MessageID]
		delete(counts, m.MessageID)
		if at, ok := created[m.MessageID]; ok && m.support && firstAck[m.MessageID] != 0 {
			// created_at is the inserting transaction's start: before its
			// commit, so before any 2xx that reports it. Same clock.
			if ack := time.Unix(0, firstAck[m.MessageID]); at.After(ack) {
				v.ackedEarly++
				v.example("acked early: mail %s answered 2xx at %s, its support message created at %s",
					m.MessageID, ack.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
			}
		}
		switch {
		case m.support && n == 0:
			v.lostMails++
			v.example("lost: mail %s (%s) has no support message", m.MessageID, m.SvixID)
		case m.support && n > 1:
			v.duplicated++
			v.example("duplicated: mail %s has %d support messages", m.MessageID, n)
		case !m.support && n > 0:
			v.unexpected++
			v.example("unexpected: mail %s to %s has %d support messages", m.MessageID, m.To, n)
		}
	}
	for id, n := range counts {
		v.unexpected += n
		v.example("unexpected: %d support messages with Message-ID %q", n, id)
	}
	return v, nil
}

func isTerminal(status string) bool {
	return status == statusCanceled || status == statusIncompleteExpired
}

// sameState compares what the entitlement says with what want reported.
func sameState(got storedEntitlement, want *stripeEvent) bool {
	if got.status != want.Status || got.cancelAtEnd != want.CancelAtPeriodEnd || got.lastEventID != want.ID {
		return false
	}
	if (got.priceID == nil) != (want.PriceID == "") || (got.priceID != nil && *got.priceID != want.PriceID) {
		return false
	}
	if (got.periodEnd == nil) != (want.PeriodEnd == 0) || (got.periodEnd != nil && got.periodEnd.Unix() != want.PeriodEnd) {
		return false
	}
	return true
}

// unorderedEvents are the events the ledger says were kept out as
// unordered.
func unorderedEvents(ctx context.Context, conn *pgx.Conn) (map[string]bool, error) {
	rows, err := conn.Query(ctx, `SELECT event_id FROM webhook_events WHERE provider = 'stripe' AND outcome = 'unordered'`)
	if err != nil {
		return nil, fmt.Errorf("check unordered events: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("check unordered events: %w", err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}
