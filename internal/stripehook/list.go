package stripehook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
	"github.com/stripe/stripe-go/v79/form"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// Lister reads Stripe's lists through stripe-go's backend and iterator,
// handing each object over as Stripe sent it: the service decodes objects
// with its own rules, since stripe-go's types are pinned to one API
// version. It backs off from a rate limit, counts its requests and notes
// Stripe's clock at the first answer. One Lister serves one caller at a
// time.
type Lister struct {
	backend  stripe.Backend
	key      string
	requests int
	takenAt  time.Time
}

// NewLister returns a Lister on api's backend and key.
func NewLister(api *client.API) *Lister {
	return &Lister{backend: api.Subscriptions.B, key: api.Subscriptions.Key}
}

// Requests is the number of requests made so far, rate-limited and failed
// ones included.
func (l *Lister) Requests() int { return l.requests }

// TakenAt is the Date of the first successful answer (Stripe's clock): the
// objects listed are at least that new. Zero before any answer.
func (l *Lister) TakenAt() time.Time { return l.takenAt }

// rawObject is one object of a list page, kept raw.
type rawObject struct {
	ID   string
	JSON []byte
}

func (o *rawObject) UnmarshalJSON(b []byte) error {
	var head struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return err
	}
	o.ID, o.JSON = head.ID, slices.Clone(b)
	return nil
}

type rawList struct {
	stripe.APIResource
	stripe.ListMeta
	Data []*rawObject `json:"data"`
}

// rawOne is one retrieved object: its JSON is the answer's body.
type rawOne struct{ stripe.APIResource }

// answer is what call fills: a list page or one object.
type answer interface {
	stripe.LastResponseSetter
	response() *stripe.APIResponse
}

func (p *rawList) response() *stripe.APIResponse { return p.LastResponse }
func (o *rawOne) response() *stripe.APIResponse  { return o.LastResponse }

// Retrieve returns the JSON of the object at path (GET), as Stripe
// rendered it in APIVersion, backing off from a rate limit as List does.
func (l *Lister) Retrieve(ctx context.Context, path string) ([]byte, error) {
	p := &stripe.Params{Context: ctx}
	one := &rawOne{}
	if err := l.call(ctx, path, p, nil, one); err != nil {
		return nil, err
	}
	return one.LastResponse.RawJSON, nil
}

// List calls each with the id and JSON of every object of the list at
// path, page after page, in the order Stripe lists them (with
// params.EndingBefore, stripe-go hands each page over oldest first). An
// error from each stops the listing and is returned as it is.
func (l *Lister) List(ctx context.Context, path string, params stripe.ListParamsContainer, each func(id string, raw []byte) error) error {
	params.GetListParams().Context = ctx
	it := stripe.GetIter(params, func(p *stripe.Params, values *form.Values) ([]any, stripe.ListContainer, error) {
		page := &rawList{}
		err := l.call(ctx, path, p, values, page)
		objs := make([]any, len(page.Data))
		for i, o := range page.Data {
			objs[i] = o
		}
		return objs, page, err
	})
	for it.Next() {
		o := it.Current().(*rawObject)
		if err := each(o.ID, o.JSON); err != nil {
			return err
		}
	}
	return it.Err()
}

// rateLimitRetries is how often a rate-limited page is asked again, after
// 1, 2, 4, 8 and 16 s, as long as the caller's context allows: stripe-go
// retries a 500 itself, but not a 429 that is a rate limit
// (https://docs.stripe.com/rate-limits advises backing off).
const rateLimitRetries = 5

func (l *Lister) call(ctx context.Context, path string, p *stripe.Params, values *form.Values, into answer) error {
	for attempt := 0; ; attempt++ {
		l.requests++
		err := l.backend.CallRaw(http.MethodGet, path, l.key, values, p, into)
		var serr *stripe.Error
		if !errors.As(err, &serr) || serr.HTTPStatusCode != http.StatusTooManyRequests || attempt == rateLimitRetries {
			if err == nil && l.takenAt.IsZero() {
				l.takenAt = stripeClock(into.response())
			}
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rate limited, then: %w", ctx.Err())
		case <-time.After(time.Second << attempt):
		}
	}
}

// stripeClock is the Date of an answer from Stripe. Without one, the local
// clock less a second.
func stripeClock(resp *stripe.APIResponse) time.Time {
	if resp != nil {
		if t, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			return t.UTC()
		}
	}
	return time.Now().Add(-time.Second).Truncate(time.Second).UTC()
}

// LookupKeys lists a customer's active entitlements, every page, and
// returns their lookup keys.
func (l *Lister) LookupKeys(ctx context.Context, customer string) ([]string, error) {
	params := &stripe.EntitlementsActiveEntitlementListParams{Customer: stripe.String(customer)}
	params.Limit = stripe.Int64(100)
	var keys []string
	err := l.List(ctx, "/v1/entitlements/active_entitlements", params, func(_ string, raw []byte) error {
		var ent struct {
			LookupKey string `json:"lookup_key"`
		}
		if err := json.Unmarshal(raw, &ent); err != nil {
			return fmt.Errorf("active entitlement of %s: %w", customer, err)
		}
		keys = append(keys, ent.LookupKey)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list active entitlements of %s: %w", customer, err)
	}
	return keys, nil
}

// ErrUnreadable marks an object from the API that the service cannot
// read, as opposed to a failure to reach the API.
var ErrUnreadable = errors.New("unreadable")

// Subscription reads one subscription object as the API answered it (a
// list page's object, a retrieve) into the stored shape, its item list
// listed in full when Stripe cut it short.
func (l *Lister) Subscription(ctx context.Context, raw []byte) (entitlements.Subscription, error) {
	var s subscriptionJSON
	if err := json.Unmarshal(raw, &s); err != nil {
		return entitlements.Subscription{}, fmt.Errorf("%w: subscription: %w", ErrUnreadable, err)
	}
	if s.Items.HasMore {
		if err := l.completeItems(ctx, &s); err != nil {
			return entitlements.Subscription{}, err
		}
	}
	sub, err := s.stored()
	if err != nil {
		return entitlements.Subscription{}, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return sub, nil
}

// completeItems replaces a subscription's embedded item list, which holds
// only Stripe's first page when has_more is set ("True if this list has
// another page of items after this one that can be fetched": the
// subscription object's items, https://docs.stripe.com/api/subscriptions/object#subscription_object-items),
// with every item, in Stripe's order, from "List all subscription items"
// (https://docs.stripe.com/api/subscription_items/list: limit 1 to 100,
// default 10).
func (l *Lister) completeItems(ctx context.Context, s *subscriptionJSON) error {
	params := &stripe.SubscriptionItemListParams{Subscription: stripe.String(s.ID)}
	params.Limit = stripe.Int64(100)
	var items []itemJSON
	err := l.List(ctx, "/v1/subscription_items", params, func(id string, raw []byte) error {
		var it itemJSON
		if err := json.Unmarshal(raw, &it); err != nil {
			return fmt.Errorf("%w: subscription item %s: %w", ErrUnreadable, id, err)
		}
		items = append(items, it)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list items of subscription %s: %w", s.ID, err)
	}
	s.Items.Data, s.Items.HasMore = items, false
	return nil
}
