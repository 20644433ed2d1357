package stripehook

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

type applyFunc func(ctx context.Context) (entitlements.Result, error)

// subscriptionEvent reads a customer.subscription.* event. An item list
// Stripe cut short (items.has_more) is completed inside the apply, after
// the claim and under the handler deadline: with an API key by listing
// every item, without one by storing what arrived, counted.
func (r *Receiver) subscriptionEvent(h head, at time.Time) (applyFunc, error) {
	s, previous, err := objectOf[subscriptionJSON](h.Data)
	if err != nil {
		return nil, err
	}
	// Only an event that names what it changed says where it came from
	// (created, deleted and trial_will_end carry no previous_attributes).
	hasPrevious := len(previous) > 0 && string(previous) != "null"
	sub, err := s.stored()
	if err != nil {
		return nil, err
	}
	if err := subscriptionIDs(sub); err != nil {
		return nil, err
	}
	// Only an object whose list was cut is kept for the apply: every
	// other delivery keeps nothing more than it did.
	var cut *subscriptionJSON
	if s.Items.HasMore {
		c := s
		cut = &c
	}
	// The decoded object and previous_attributes are kept instead of the
	// event's data: the state before the event is laid over them.
	object, id, typ, creation := s, h.ID, h.Type, h.Type == "customer.subscription.created"
	return func(ctx context.Context) (entitlements.Result, error) {
		sub, complete := sub, cut == nil
		var full []itemJSON // the item list as listed in full; nil when not listed
		if cut != nil && r.api != nil {
			s := *cut
			err := r.lister().completeItems(ctx, &s)
			if err == nil {
				sub, err = s.stored()
			}
			if err != nil {
				return entitlements.Result{}, err
			}
			full, complete = s.Items.Data, true
		}
		ev := entitlements.Event{
			ID:       id,
			Type:     typ,
			Created:  at,
			Creation: creation,
			Previous: hasPrevious,
			Before: func() (entitlements.Subscription, error) {
				return before(object, previous, full)
			},
		}
		res, err := r.store.ApplySubscription(ctx, sub, ev, r.fetch())
		// Unchanged too: the same event again rewrote the cut list.
		if err == nil && !complete && (res.Verdict == entitlements.Applied || res.Verdict == entitlements.Unchanged) {
			r.itemsIncomplete.Inc()
			r.logger.Warn("subscription stored with the items the event carried: Stripe cut the list short and no STRIPE_API_KEY is set to list the rest",
				"event_id", id, "subscription_id", sub.ID, "items", len(sub.Items))
		}
		return res, err
	}, nil
}

// before is the subscription as it stood just before the event: its object
// (s, as decoded) with data.previous_attributes laid over it. Stripe names
// there each attribute the event changed, with its prior value; an array
// is given whole, a hash (metadata) only by the keys that changed, a key
// that was added being given as null or ""
// (https://docs.stripe.com/api/events/object#event_object-data-previous_attributes).
// Only previous_attributes is decoded here, over a copy of s, so that a
// first delivery, which now asks for it (to see a gap), does not decode
// its object twice.
//
// full is the object's item list as listed in full when Stripe cut it
// short (nil otherwise). When previous_attributes does not name items, the
// event did not change them, so the items before it are that full list:
// judging the stored set against the cut one would make every same-second
// event of such a subscription unordered. When it names them, their prior
// value is taken as given; if that list was cut too it cannot equal a
// complete stored set, and the event is settled as unordered.
func before(s subscriptionJSON, previous json.RawMessage, full []itemJSON) (entitlements.Subscription, error) {
	itemsNamed := false
	if len(previous) > 0 && string(previous) != "null" {
		var err error
		if itemsNamed, err = layOver(&s, previous); err != nil {
			return entitlements.Subscription{}, err
		}
	}
	if !itemsNamed && full != nil {
		s.Items.Data, s.Items.HasMore = full, false
	}
	return s.stored()
}

// layOver sets the attributes previous names in s to their prior values,
// and says whether items is one of them. Every value is decoded afresh, so
// nothing s shares with the object it was copied from is written.
func layOver(s *subscriptionJSON, previous json.RawMessage) (itemsNamed bool, err error) {
	var named map[string]json.RawMessage
	if err := json.Unmarshal(previous, &named); err != nil {
		return false, fmt.Errorf("previous_attributes: %w", err)
	}
	var p subscriptionJSON
	if err := json.Unmarshal(previous, &p); err != nil {
		return false, fmt.Errorf("previous_attributes: %w", err)
	}
	for k, v := range named {
		switch k {
		case "customer":
			s.Customer = p.Customer
		case "customer_account":
			s.CustomerAccount = p.CustomerAccount
		case "status":
			s.Status = p.Status
		case "current_period_start":
			s.CurrentPeriodStart = p.CurrentPeriodStart
		case "current_period_end":
			s.CurrentPeriodEnd = p.CurrentPeriodEnd
		case "cancel_at_period_end":
			s.CancelAtPeriodEnd = p.CancelAtPeriodEnd
		case "cancel_at":
			s.CancelAt = p.CancelAt
		case "canceled_at":
			s.CanceledAt = p.CanceledAt
		case "ended_at":
			s.EndedAt = p.EndedAt
		case "trial_start":
			s.TrialStart = p.TrialStart
		case "trial_end":
			s.TrialEnd = p.TrialEnd
		case "pause_collection":
			s.PauseCollection = p.PauseCollection
		case "livemode":
			s.Livemode = p.Livemode
		case "items":
			s.Items, itemsNamed = p.Items, true
		case "metadata":
			var was map[string]*string
			if err := json.Unmarshal(v, &was); err != nil {
				return false, fmt.Errorf("previous_attributes.metadata: %w", err)
			}
			now := maps.Clone(s.Metadata)
			if now == nil {
				now = map[string]string{}
			}
			for key, old := range was {
				if old == nil || *old == "" {
					delete(now, key)
				} else {
					now[key] = *old
				}
			}
			s.Metadata = now
		}
	}
	return itemsNamed, nil
}

// summaryJSON is an Active Entitlement Summary
// (https://docs.stripe.com/api/entitlements/active-entitlement-summary/object):
// the customer and the list of features they may use, which like every
// Stripe list may be cut short (has_more).
type summaryJSON struct {
	Customer     ref `json:"customer"`
	Entitlements struct {
		Data []struct {
			LookupKey string `json:"lookup_key"`
		} `json:"data"`
		HasMore bool `json:"has_more"`
	} `json:"entitlements"`
}

func (s summaryJSON) keys() []string {
	keys := make([]string, 0, len(s.Entitlements.Data))
	for _, e := range s.Entitlements.Data {
		keys = append(keys, e.LookupKey)
	}
	return keys
}

// featuresEvent reads an entitlements.active_entitlement_summary.updated
// event.
func (r *Receiver) featuresEvent(h head, at time.Time) (applyFunc, error) {
	s, previous, err := objectOf[summaryJSON](h.Data)
	if err != nil {
		return nil, err
	}
	if s.Customer == "" {
		return nil, fmt.Errorf("%w: customer", errMissing)
	}
	if err := checkID("customer", string(s.Customer), maxObjectID); err != nil {
		return nil, err
	}
	ev := entitlements.FeatureEvent{ID: h.ID, Type: h.Type, Created: at}
	var prev struct {
		Entitlements *struct {
			Data []struct {
				LookupKey string `json:"lookup_key"`
			} `json:"data"`
		} `json:"entitlements"`
	}
	if len(previous) > 0 && json.Unmarshal(previous, &prev) == nil && prev.Entitlements != nil {
		ev.HasPrevious = true
		for _, e := range prev.Entitlements.Data {
			ev.Previous = append(ev.Previous, e.LookupKey)
		}
	}
	customer, keys, truncated := string(s.Customer), s.keys(), s.Entitlements.HasMore
	return func(ctx context.Context) (entitlements.Result, error) {
		complete := !truncated
		if truncated && r.api != nil {
			full, err := r.listFeatures(ctx, customer)
			if err != nil {
				return entitlements.Result{}, err
			}
			keys, complete = full, true
		}
		if !complete {
			r.truncated.Inc()
		}
		f := entitlements.Features{CustomerID: customer, LookupKeys: keys, Complete: complete}
		return r.store.ApplyFeatures(ctx, f, ev, r.featureLister())
	}, nil
}

// sessionJSON is a Checkout Session
// (https://docs.stripe.com/api/checkout/sessions/object).
type sessionJSON struct {
	ID                string  `json:"id"`
	ClientReferenceID *string `json:"client_reference_id"`
	Customer          ref     `json:"customer"`
	CustomerAccount   string  `json:"customer_account"`
	Subscription      ref     `json:"subscription"`
	Mode              string  `json:"mode"`
	Status            string  `json:"status"`
	PaymentStatus     string  `json:"payment_status"`
	// customer_email is what the integration prefilled; customer_details
	// is what the customer entered, and is what Stripe keeps.
	CustomerEmail   *string `json:"customer_email"`
	CustomerDetails *struct {
		Email *string `json:"email"`
	} `json:"customer_details"`
	Metadata map[string]string `json:"metadata"`
}

// checkoutEvent reads a checkout.session.* event.
func (r *Receiver) checkoutEvent(h head, at time.Time) (applyFunc, error) {
	s, _, err := objectOf[sessionJSON](h.Data)
	if err != nil {
		return nil, err
	}
	switch {
	case s.ID == "":
		return nil, fmt.Errorf("%w: id", errMissing)
	case s.Mode == "":
		return nil, fmt.Errorf("%w: mode", errMissing)
	case s.Status == "":
		return nil, fmt.Errorf("%w: status", errMissing)
	}
	cs := entitlements.CheckoutSession{
		ID:             s.ID,
		CustomerID:     string(s.Customer),
		SubscriptionID: string(s.Subscription),
		Mode:           s.Mode,
		Status:         s.Status,
		PaymentStatus:  s.PaymentStatus,
		Metadata:       s.Metadata,
	}
	if cs.CustomerID == "" {
		cs.CustomerID = s.CustomerAccount
	}
	if s.ClientReferenceID != nil {
		cs.ClientReferenceID = *s.ClientReferenceID
	}
	switch {
	case s.CustomerDetails != nil && s.CustomerDetails.Email != nil:
		cs.CustomerEmail = *s.CustomerDetails.Email
	case s.CustomerEmail != nil:
		cs.CustomerEmail = *s.CustomerEmail
	}
	if cs.Metadata == nil {
		cs.Metadata = map[string]string{}
	}
	if err := checkoutIDs(cs); err != nil {
		return nil, err
	}
	ev := entitlements.Event{ID: h.ID, Type: h.Type, Created: at}
	return func(ctx context.Context) (entitlements.Result, error) {
		return r.store.ApplyCheckout(ctx, cs, ev)
	}, nil
}
