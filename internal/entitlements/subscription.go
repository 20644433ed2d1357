package entitlements

import (
	"maps"
	"slices"
	"time"
)

// Subscription is one Stripe subscription in the shape this service stores.
// Zero times and empty strings are stored as null.
type Subscription struct {
	ID         string
	CustomerID string // customer, or customer_account (Accounts v2) when customer is null
	Status     string
	// PriceID is the first item's price, "" when there is no item.
	PriceID string
	// CurrentPeriodEnd is the earliest item end (API 2025-03-31 and later
	// keep periods on the items) or, before that, the subscription's own.
	CurrentPeriodEnd  time.Time
	CancelAtPeriodEnd bool
	CancelAt          time.Time
	CanceledAt        time.Time
	EndedAt           time.Time
	TrialStart        time.Time
	TrialEnd          time.Time
	// PauseCollection is pause_collection.behavior, "" when not paused.
	PauseCollection string
	Livemode        bool
	Metadata        map[string]string
	Items           []Item
}

// Item is one subscription item.
type Item struct {
	ID                 string
	PriceID            string
	ProductID          string
	PriceLookupKey     string
	Quantity           *int64 // nil when Stripe gives none (metered prices)
	CurrentPeriodStart time.Time
	CurrentPeriodEnd   time.Time
}

// AccessEndsAt is when access ends if nothing changes; zero means it
// renews. Stripe's order: a subscription that has ended ended then; one
// with cancel_at ends then (with flexible billing mode Stripe resolves
// cancel_at_period_end to the earliest item end, so cancel_at is the
// truth when set); one canceling at period end ends with the current
// period (https://docs.stripe.com/billing/subscriptions/cancel).
func (s Subscription) AccessEndsAt() time.Time {
	switch {
	case !s.EndedAt.IsZero():
		return s.EndedAt
	case !s.CancelAt.IsZero():
		return s.CancelAt
	case s.CancelAtPeriodEnd:
		return s.CurrentPeriodEnd
	}
	return time.Time{}
}

// Field names a stored field of a subscription, spelled as its column.
type Field string

// diff names the stored fields on which a and b differ, in column order.
// It is the one comparison the same-second rule uses.
func diff(a, b Subscription) []Field {
	var out []Field
	check := func(f Field, same bool) {
		if !same {
			out = append(out, f)
		}
	}
	check("stripe_customer_id", a.CustomerID == b.CustomerID)
	check("status", a.Status == b.Status)
	check("price_id", a.PriceID == b.PriceID)
	check("current_period_end", a.CurrentPeriodEnd.Equal(b.CurrentPeriodEnd))
	check("cancel_at_period_end", a.CancelAtPeriodEnd == b.CancelAtPeriodEnd)
	check("cancel_at", a.CancelAt.Equal(b.CancelAt))
	check("canceled_at", a.CanceledAt.Equal(b.CanceledAt))
	check("ended_at", a.EndedAt.Equal(b.EndedAt))
	check("trial_start", a.TrialStart.Equal(b.TrialStart))
	check("trial_end", a.TrialEnd.Equal(b.TrialEnd))
	check("pause_collection", a.PauseCollection == b.PauseCollection)
	check("livemode", a.Livemode == b.Livemode)
	check("metadata", maps.Equal(a.Metadata, b.Metadata))
	check("items", slices.EqualFunc(a.Items, b.Items, Item.equal))
	return out
}

func (i Item) equal(o Item) bool {
	sameQty := (i.Quantity == nil) == (o.Quantity == nil) && (i.Quantity == nil || *i.Quantity == *o.Quantity)
	return i.ID == o.ID && i.PriceID == o.PriceID && i.ProductID == o.ProductID &&
		i.PriceLookupKey == o.PriceLookupKey && sameQty &&
		i.CurrentPeriodStart.Equal(o.CurrentPeriodStart) && i.CurrentPeriodEnd.Equal(o.CurrentPeriodEnd)
}
