package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// The workload is what the providers send, and the model is what the
// database must hold once they have sent it all.
//
// Stripe: each subscription is a chain of events with non-decreasing created
// times. Some pairs share a second; the second of a pair names the first's
// status as its previous_attributes.status (succession), and the three
// statuses involved (before, first, second) differ, so the contract's tie
// rule settles the pair in either order. (A tie of three events, or A -> B
// -> A within one second, cannot be settled by that rule in every order; the
// generator makes none, see docs/RELIABILITY.md.) Some chains end in
// a terminal status (customer.subscription.deleted -> canceled, or
// incomplete -> incomplete_expired); some of those are followed by a later
// update that keeps the terminal status (Stripe never revives a
// subscription, but may still update a canceled one). The model's final
// state of a subscription is its newest event by (created, succession),
// terminal absorbing: the last event of a live chain; for a terminated one,
// its terminal event, or a later update of the terminated subscription if
// that arrived first (the service keeps whichever terminal state it stored
// first and absorbs the rest; both say the subscription is over).
//
// Resend: each inbound mail is one email.received event. Mail to support
// must become exactly one support message; mail to anyone else none. A few
// mails arrive twice under two Resend ids (a "twin": same Message-ID, same
// content), which is still one message.

// stripeEvent is one subscription event and its rendered body.
type stripeEvent struct {
	faulttest.StripeEvent
	body []byte
}

// subscription is one subscription's event chain and the model's verdict.
type subscription struct {
	id     string
	events []*stripeEvent // in (created, succession) order
	want   *stripeEvent   // the model's final event: the last, or the first terminal one
	// accept are the events whose state may be stored at the end: want,
	// and for a terminated subscription the updates after its termination.
	accept []*stripeEvent
	// terminal, afterEnd and ties describe the chain, for the report.
	terminal, afterEnd, ties int
}

// mail is one inbound email and whether it must become a support message.
type mail struct {
	faulttest.Email
	support bool
	twinOf  *mail // the mail this one repeats under another Resend id
	// firstAck is when the first 2xx for this mail arrived (unix ns; 0:
	// none yet). Its support message must have been created before it.
	firstAck atomic.Int64
}

// delivery is one provider delivery (its attempts are retries of it).
type delivery struct {
	stripe     *stripeEvent
	mail       *mail
	redelivery bool
}

// workload is everything the providers send, in the order they first send it.
type workload struct {
	subs       []*subscription
	mails      []*mail
	deliveries []*delivery
	events     int // distinct events: stripe events + mail events
}

const (
	statusCanceled          = "canceled"
	statusIncompleteExpired = "incomplete_expired"
)

// walk are the statuses a live subscription moves between.
var walk = []string{"trialing", "active", "past_due", "unpaid", "paused"}

func newWorkload(cfg config) *workload {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x50a4))
	w := &workload{}
	mails := int(float64(cfg.Events) * cfg.MailShare)
	stripeEvents := cfg.Events - mails
	subs := min(cfg.Subs, max(stripeEvents/2, 1))

	// Spread the Stripe events over the subscriptions, at least two each.
	counts := make([]int, subs)
	for i := range counts {
		counts[i] = 2
	}
	for left := stripeEvents - 2*subs; left > 0; left-- {
		counts[rng.IntN(subs)]++
	}
	for i, n := range counts {
		w.subs = append(w.subs, newSubscription(rng, i, n))
	}
	w.mails = newMails(rng, mails)
	for _, s := range w.subs {
		w.events += len(s.events)
	}
	w.events += len(w.mails)
	w.deliveries = order(rng, w, cfg)
	return w
}

// newSubscription generates a chain of about n events (the last one or two
// may be a termination and an update after it).
func newSubscription(rng *rand.Rand, index, n int) *subscription {
	s := &subscription{id: fmt.Sprintf("sub_soak_%05d", index)}
	customer := fmt.Sprintf("cus_soak_%05d", index)
	created := int64(1767225600 + rng.IntN(86400))
	price := "price_soak_monthly"
	periodEnd := created + 30*86400
	cancelAtEnd := false
	emit := func(typ, status, prev string) *stripeEvent {
		e := &stripeEvent{StripeEvent: faulttest.StripeEvent{
			ID:                fmt.Sprintf("evt_soak_%05d_%03d", index, len(s.events)),
			Type:              typ,
			Created:           created,
			SubscriptionID:    s.id,
			CustomerID:        customer,
			Status:            status,
			PreviousStatus:    prev,
			PriceID:           price,
			PeriodEnd:         periodEnd,
			CancelAtPeriodEnd: cancelAtEnd,
		}}
		e.body = e.JSON()
		s.events = append(s.events, e)
		return e
	}
	change := func(cur, next string) string {
		switch {
		case next == "paused":
			return "customer.subscription.paused"
		case cur == "paused":
			return "customer.subscription.resumed"
		}
		return "customer.subscription.updated"
	}
	pick := func(not ...string) string {
		for {
			if s := walk[rng.IntN(len(walk))]; !slices.Contains(not, s) {
				return s
			}
		}
	}
	advance := func() { created += 1 + rng.Int64N(86400) }

	cur := []string{"incomplete", "trialing", "active", "active"}[rng.IntN(4)]
	emit("customer.subscription.created", cur, "")

	terminal := rng.Float64() < 0.3
	afterEnd := terminal && rng.Float64() < 0.5
	reserve := 0
	if terminal {
		reserve = 1
		if afterEnd {
			reserve = 2
		}
	}
	for len(s.events) < n-reserve {
		r := rng.Float64()
		switch {
		case r < 0.2 && len(s.events)+2 <= n-reserve:
			// Two status changes in one second.
			advance()
			first := pick(cur)
			second := pick(cur, first)
			emit(change(cur, first), first, cur)
			emit(change(first, second), second, first)
			cur = second
			s.ties++
		case r < 0.6:
			advance()
			next := pick(cur)
			emit(change(cur, next), next, cur)
			cur = next
		default:
			// A change that leaves the status alone.
			advance()
			switch rng.IntN(3) {
			case 0:
				price = []string{"price_soak_monthly", "price_soak_yearly", "price_soak_family"}[rng.IntN(3)]
			case 1:
				cancelAtEnd = !cancelAtEnd
			default:
				periodEnd += 30 * 86400
			}
			emit("customer.subscription.updated", cur, "")
		}
	}
	s.want = s.events[len(s.events)-1]
	s.accept = []*stripeEvent{s.want}
	if !terminal {
		return s
	}
	end := statusCanceled
	typ := "customer.subscription.deleted"
	if cur == "incomplete" {
		end, typ = statusIncompleteExpired, "customer.subscription.updated"
	}
	advance()
	if end == statusCanceled && rng.Float64() < 0.3 {
		// The cancel shares its second with the status change before it.
		before := pick(cur)
		emit(change(cur, before), before, cur)
		cur = before
		s.ties++
	}
	s.want = emit(typ, end, cur)
	s.accept = []*stripeEvent{s.want}
	s.terminal = 1
	if afterEnd {
		// An update of the terminated subscription that keeps its status
		// (its item's price changed): the terminal status absorbs it.
		advance()
		price = "price_soak_after_end"
		cancelAtEnd = !cancelAtEnd
		s.accept = append(s.accept, emit("customer.subscription.updated", end, ""))
		s.afterEnd = 1
	}
	return s
}

// newMails generates n inbound mails: most to the support address, some to
// an address in the support domain, some to someone else, and a few twins.
func newMails(rng *rand.Rand, n int) []*mail {
	out := make([]*mail, 0, n)
	created := time.Date(2026, 1, 1, 8, 0, 0, 0, time.UTC)
	for i := range n {
		m := &mail{Email: faulttest.Email{
			SvixID:    fmt.Sprintf("msg_soak_%06d", i),
			EmailID:   fmt.Sprintf("em-soak-%06d", i),
			MessageID: fmt.Sprintf("<soak-%06d@mail.example.com>", i),
			From:      fmt.Sprintf("Customer %d <customer%d@example.com>", i%500, i%500),
			Subject:   fmt.Sprintf("Question %d", i),
			Text:      fmt.Sprintf("Hello, this is question %d about my order.", i),
			Created:   created.Add(time.Duration(i) * time.Second),
		}, support: true}
		switch r := rng.Float64(); {
		case r < 0.05:
			m.To, m.support = "someone@elsewhere.example", false
		case r < 0.10:
			m.To = fmt.Sprintf("orders%d@%s", i%7, faulttest.SupportDomain)
		default:
			m.To = faulttest.SupportAddress
		}
		if len(out) > 0 && rng.Float64() < 0.03 {
			// The same mail again under another Resend id and Svix message.
			orig := out[rng.IntN(len(out))]
			m = &mail{Email: orig.Email, support: orig.support, twinOf: orig}
			m.SvixID = fmt.Sprintf("msg_soak_%06d", i)
			m.EmailID = fmt.Sprintf("em-soak-%06d", i)
		}
		out = append(out, m)
	}
	return out
}

// order interleaves the subscriptions' chains and the mails into the order
// the providers first send them, then disturbs it: some deliveries move
// later (out of order), and a share are delivered again later.
func order(rng *rand.Rand, w *workload, cfg config) []*delivery {
	type queue struct{ items []*delivery }
	var queues []*queue
	for _, s := range w.subs {
		q := &queue{}
		for _, e := range s.events {
			q.items = append(q.items, &delivery{stripe: e})
		}
		queues = append(queues, q)
	}
	mq := &queue{}
	for _, m := range w.mails {
		mq.items = append(mq.items, &delivery{mail: m})
	}
	queues = append(queues, mq)

	// Each next delivery comes from a queue chosen in proportion to what it
	// has left, so every chain is spread over the whole run.
	left := w.events
	seq := make([]*delivery, 0, left)
	for left > 0 {
		k := rng.IntN(left)
		for _, q := range queues {
			if k < len(q.items) {
				seq = append(seq, q.items[0])
				q.items = q.items[1:]
				break
			}
			k -= len(q.items)
		}
		left--
	}

	// Out of order: swap a share with a delivery a little later.
	for i := range seq {
		if rng.Float64() < cfg.OutOfOrder {
			j := min(len(seq)-1, i+1+rng.IntN(50))
			seq[i], seq[j] = seq[j], seq[i]
		}
	}

	// Redeliveries: a share of the deliveries is sent again, soon or much
	// later, a few of them twice.
	type placed struct {
		pos float64
		d   *delivery
	}
	all := make([]placed, 0, len(seq)*14/10)
	for i, d := range seq {
		all = append(all, placed{float64(i), d})
		if rng.Float64() >= cfg.Redeliver {
			continue
		}
		copies := 1
		if rng.Float64() < 0.1 {
			copies = 2
		}
		for range copies {
			again := &delivery{stripe: d.stripe, mail: d.mail, redelivery: true}
			all = append(all, placed{float64(i+rng.IntN(2000)) + 0.5, again})
		}
	}
	slices.SortStableFunc(all, func(a, b placed) int {
		switch {
		case a.pos < b.pos:
			return -1
		case a.pos > b.pos:
			return 1
		}
		return 0
	})
	out := make([]*delivery, len(all))
	for i, p := range all {
		out[i] = p.d
	}
	return out
}
