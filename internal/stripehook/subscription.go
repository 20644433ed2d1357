package stripehook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// subscriptionJSON is the part of a Stripe Subscription this service
// stores (https://docs.stripe.com/api/subscriptions/object), read so that
// every API version from 2024-06-20 to 2026's dahlia decodes: pointer
// fields are null or absent in some versions.
type subscriptionJSON struct {
	ID              string `json:"id"`
	Customer        ref    `json:"customer"`
	CustomerAccount string `json:"customer_account"`
	Status          string `json:"status"`
	// Up to API 2025-02-24 the period is the subscription's, "a top-level
	// shared billing period" of all its items; from 2025-03-31.basil it is
	// each item's
	// (https://docs.stripe.com/changelog/basil/2025-03-31/deprecate-subscription-current-period-start-and-end).
	CurrentPeriodStart *int64 `json:"current_period_start"`
	CurrentPeriodEnd   *int64 `json:"current_period_end"`
	CancelAtPeriodEnd  bool   `json:"cancel_at_period_end"`
	CancelAt           *int64 `json:"cancel_at"`
	CanceledAt         *int64 `json:"canceled_at"`
	EndedAt            *int64 `json:"ended_at"`
	TrialStart         *int64 `json:"trial_start"`
	TrialEnd           *int64 `json:"trial_end"`
	PauseCollection    *struct {
		Behavior string `json:"behavior"`
	} `json:"pause_collection"`
	Livemode bool              `json:"livemode"`
	Metadata map[string]string `json:"metadata"`
	// Items is a list like any other: Stripe embeds its first page, and
	// has_more says there are more items to list.
	Items struct {
		Data    []itemJSON `json:"data"`
		HasMore bool       `json:"has_more"`
	} `json:"items"`
}

// itemJSON is a Subscription Item
// (https://docs.stripe.com/api/subscription_items/object).
type itemJSON struct {
	ID    string `json:"id"`
	Price struct {
		ID        string  `json:"id"`
		Product   ref     `json:"product"`
		LookupKey *string `json:"lookup_key"`
	} `json:"price"`
	Quantity           *int64 `json:"quantity"`
	CurrentPeriodStart *int64 `json:"current_period_start"`
	CurrentPeriodEnd   *int64 `json:"current_period_end"`
}

// ref is a Stripe reference: an id string, the expanded object, or null.
type ref string

func (r *ref) UnmarshalJSON(b []byte) error {
	switch {
	case bytes.HasPrefix(b, []byte(`"`)):
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*r = ref(s)
		return nil
	case bytes.Equal(b, []byte("null")):
		*r = ""
		return nil
	}
	var obj struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	*r = ref(obj.ID)
	return nil
}

// errMissing names a field a handled object lacks; it becomes a 400 with
// the field in the log line.
var errMissing = errors.New("missing")

// stored is the subscription in the stored shape, with the items it holds:
// the one derivation of price_id and current_period_end from them, whether
// they came embedded whole or were listed in full. It refuses an object
// without an id, a customer or a status.
func (s subscriptionJSON) stored() (entitlements.Subscription, error) {
	customer := string(s.Customer)
	if customer == "" {
		// Accounts v2: customer is null and the account stands in for it
		// (https://docs.stripe.com/api/subscriptions/object#subscription_object-customer_account).
		customer = s.CustomerAccount
	}
	switch {
	case s.ID == "":
		return entitlements.Subscription{}, fmt.Errorf("%w: subscription id", errMissing)
	case customer == "":
		return entitlements.Subscription{}, fmt.Errorf("%w: subscription %s customer (and customer_account)", errMissing, s.ID)
	case s.Status == "":
		return entitlements.Subscription{}, fmt.Errorf("%w: subscription %s status", errMissing, s.ID)
	}
	var ts times
	out := entitlements.Subscription{
		ID:                s.ID,
		CustomerID:        customer,
		Status:            s.Status,
		CurrentPeriodEnd:  ts.at("current_period_end", s.CurrentPeriodEnd),
		CancelAtPeriodEnd: s.CancelAtPeriodEnd,
		CancelAt:          ts.at("cancel_at", s.CancelAt),
		CanceledAt:        ts.at("canceled_at", s.CanceledAt),
		EndedAt:           ts.at("ended_at", s.EndedAt),
		TrialStart:        ts.at("trial_start", s.TrialStart),
		TrialEnd:          ts.at("trial_end", s.TrialEnd),
		Livemode:          s.Livemode,
		Metadata:          s.Metadata,
	}
	if s.PauseCollection != nil {
		out.PauseCollection = s.PauseCollection.Behavior
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	out.Items = make([]entitlements.Item, 0, len(s.Items.Data))
	var earliest time.Time
	for i, it := range s.Items.Data {
		if it.ID == "" || it.Price.ID == "" {
			return entitlements.Subscription{}, fmt.Errorf("%w: subscription %s items.data[%d] id or price.id", errMissing, s.ID, i)
		}
		// An item twice would make the item upsert touch one row twice,
		// which Postgres refuses on every retry.
		if slices.ContainsFunc(out.Items, func(prev entitlements.Item) bool { return prev.ID == it.ID }) {
			return entitlements.Subscription{}, fmt.Errorf("subscription %s items.data[%d] repeats item %s", s.ID, i, it.ID)
		}
		item := entitlements.Item{
			ID:                 it.ID,
			PriceID:            it.Price.ID,
			ProductID:          string(it.Price.Product),
			Quantity:           it.Quantity,
			CurrentPeriodStart: ts.at("items.data.current_period_start", it.CurrentPeriodStart),
			CurrentPeriodEnd:   ts.at("items.data.current_period_end", it.CurrentPeriodEnd),
		}
		// Before basil an item's period is its subscription's shared one.
		// Stored on the item, a subscription reads the same in every
		// version: a webhook rendered in 2024-06-20 and the API's answer
		// rendered in APIVersion store the same items.
		if it.CurrentPeriodStart == nil && it.CurrentPeriodEnd == nil {
			item.CurrentPeriodStart = ts.at("current_period_start", s.CurrentPeriodStart)
			item.CurrentPeriodEnd = ts.at("current_period_end", s.CurrentPeriodEnd)
		}
		if it.Price.LookupKey != nil {
			item.PriceLookupKey = *it.Price.LookupKey
		}
		out.Items = append(out.Items, item)
		// Items of a mixed-interval subscription renew on different days.
		// What Stripe bills next, and where cancel_at_period_end takes
		// effect, is the earliest item end: "for mixed interval
		// subscriptions cancel_at_period_end always resolves to the
		// earliest item period end"
		// (https://docs.stripe.com/changelog/basil/2025-07-30/cancel-at-enums).
		if end := item.CurrentPeriodEnd; !end.IsZero() && (earliest.IsZero() || end.Before(earliest)) {
			earliest = end
		}
	}
	if !earliest.IsZero() {
		out.CurrentPeriodEnd = earliest
	}
	if len(out.Items) > 0 {
		out.PriceID = out.Items[0].PriceID
	}
	if ts.err != nil {
		return entitlements.Subscription{}, fmt.Errorf("subscription %s: %w", s.ID, ts.err)
	}
	return out, nil
}

// times converts Unix seconds and keeps the first out-of-range field: a
// signed but absurd timestamp would otherwise fail every write (Postgres
// refuses years past 294276) and make a poison event.
type times struct{ err error }

// maxUnix is 9999-12-31T23:59:59Z.
const maxUnix = 253402300799

func (t *times) at(field string, v *int64) time.Time {
	if v == nil || *v == 0 {
		return time.Time{}
	}
	if *v < 0 || *v > maxUnix {
		if t.err == nil {
			t.err = fmt.Errorf("%w: %s out of range", errMissing, field)
		}
		return time.Time{}
	}
	return time.Unix(*v, 0).UTC()
}
