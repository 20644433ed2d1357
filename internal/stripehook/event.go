package stripehook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// event is the part of a Stripe event this service reads. It is decoded
// once, after the signature check, into only these fields; the rest of the
// body is skipped. Fields are read defensively so that events rendered at
// any API version are handled (stripe-go's own Event type would tie us to
// its pinned version).
type event struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		Object             subscription `json:"object"`
		PreviousAttributes struct {
			Status string `json:"status"`
		} `json:"previous_attributes"`
	} `json:"data"`
}

type subscription struct {
	ID                string `json:"id"`
	Customer          ref    `json:"customer"`
	Status            string `json:"status"`
	CancelAtPeriodEnd bool   `json:"cancel_at_period_end"`
	// CurrentPeriodEnd is on the subscription up to API version
	// 2025-02-24; from 2025-03-31 it lives on each item.
	CurrentPeriodEnd int64 `json:"current_period_end"`
	Items            struct {
		Data []struct {
			Price struct {
				ID string `json:"id"`
			} `json:"price"`
			CurrentPeriodEnd int64 `json:"current_period_end"`
		} `json:"data"`
	} `json:"items"`
}

// ref is a Stripe reference: an id string, or the expanded object.
type ref string

func (r *ref) UnmarshalJSON(b []byte) error {
	if bytes.HasPrefix(b, []byte(`"`)) {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*r = ref(s)
		return nil
	}
	if bytes.Equal(b, []byte("null")) {
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

var errInvalidEvent = errors.New("invalid event")

// subscriptionEvents are the event types that carry a subscription whose
// state becomes an entitlement.
var subscriptionEvents = map[string]bool{
	"customer.subscription.created": true,
	"customer.subscription.updated": true,
	"customer.subscription.deleted": true,
	"customer.subscription.paused":  true,
	"customer.subscription.resumed": true,
}

// decode parses a verified body. Only subscription events need their
// object to be complete; any other event needs just an id and a type.
func decode(body []byte) (event, error) {
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		return event{}, fmt.Errorf("%w: %w", errInvalidEvent, err)
	}
	if ev.ID == "" || ev.Type == "" {
		return event{}, fmt.Errorf("%w: missing id or type", errInvalidEvent)
	}
	if !subscriptionEvents[ev.Type] {
		return ev, nil
	}
	sub := ev.Data.Object
	switch {
	case ev.Created <= 0:
		return event{}, fmt.Errorf("%w: %s has no created time", errInvalidEvent, ev.ID)
	case sub.ID == "" || sub.Customer == "" || sub.Status == "":
		return event{}, fmt.Errorf("%w: %s lacks subscription id, customer or status", errInvalidEvent, ev.ID)
	}
	return ev, nil
}

// entitlement maps the event's subscription onto the stored shape.
func (ev event) entitlement() (entitlements.Entitlement, entitlements.Event) {
	sub := ev.Data.Object
	ent := entitlements.Entitlement{
		SubscriptionID:    sub.ID,
		CustomerID:        string(sub.Customer),
		Status:            sub.Status,
		CancelAtPeriodEnd: sub.CancelAtPeriodEnd,
	}
	periodEnd := sub.CurrentPeriodEnd
	for i, item := range sub.Items.Data {
		if i == 0 {
			ent.PriceID = item.Price.ID
		}
		// Items can renew on different days; the subscription's period
		// is over when the last of them is.
		periodEnd = max(periodEnd, item.CurrentPeriodEnd)
	}
	if periodEnd > 0 {
		ent.CurrentPeriodEnd = time.Unix(periodEnd, 0).UTC()
	}
	return ent, entitlements.Event{
		ID:             ev.ID,
		Created:        time.Unix(ev.Created, 0).UTC(),
		PreviousStatus: ev.Data.PreviousAttributes.Status,
	}
}
