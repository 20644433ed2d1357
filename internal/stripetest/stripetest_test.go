package stripetest

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

func newClient(base *url.URL, retries int64) *client.API {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(base.String()),
		MaxNetworkRetries: stripe.Int64(retries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return client.New(Key, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
}

// calls are the stripe-go calls the service makes, with every parameter it
// sends; ids name objects the fake holds (stripe-mock accepts any).
func calls(api *client.API) map[string]func() error {
	drain := func(it interface {
		Next() bool
		Err() error
	}) error {
		for it.Next() {
		}
		return it.Err()
	}
	return map[string]func() error{
		"retrieve event": func() error {
			_, err := api.Events.Get("evt_1", nil)
			return err
		},
		"retrieve subscription": func() error {
			_, err := api.Subscriptions.Get("sub_1", nil)
			return err
		},
		"list subscriptions status=all": func() error {
			p := &stripe.SubscriptionListParams{Status: stripe.String("all")}
			p.Limit = stripe.Int64(100)
			return drain(api.Subscriptions.List(p).Iter)
		},
		"list subscriptions starting_after": func() error {
			p := &stripe.SubscriptionListParams{Status: stripe.String("all")}
			p.Limit, p.StartingAfter, p.Single = stripe.Int64(2), stripe.String("sub_1"), true
			return drain(api.Subscriptions.List(p).Iter)
		},
		"list subscription items": func() error {
			p := &stripe.SubscriptionItemListParams{Subscription: stripe.String("sub_1")}
			p.Limit = stripe.Int64(100)
			return drain(api.SubscriptionItems.List(p).Iter)
		},
		"list subscription items starting_after": func() error {
			p := &stripe.SubscriptionItemListParams{Subscription: stripe.String("sub_1")}
			p.Limit, p.StartingAfter, p.Single = stripe.Int64(100), stripe.String("si_sub_1"), true
			return drain(api.SubscriptionItems.List(p).Iter)
		},
		"list events types created delivery_success": func() error {
			p := &stripe.EventListParams{
				Types:           stripe.StringSlice([]string{"customer.subscription.updated", "customer.subscription.deleted"}),
				CreatedRange:    &stripe.RangeQueryParams{GreaterThanOrEqual: 1700000000},
				DeliverySuccess: stripe.Bool(false),
			}
			p.Limit = stripe.Int64(100)
			return drain(api.Events.List(p).Iter)
		},
		"list events ending_before": func() error {
			p := &stripe.EventListParams{Types: stripe.StringSlice([]string{"customer.subscription.updated"})}
			p.Limit, p.EndingBefore, p.Single = stripe.Int64(100), stripe.String("evt_1"), true
			return drain(api.Events.List(p).Iter)
		},
		"list active entitlements": func() error {
			p := &stripe.EntitlementsActiveEntitlementListParams{Customer: stripe.String("cus_1")}
			p.Limit = stripe.Int64(100)
			return drain(api.EntitlementsActiveEntitlements.List(p).Iter)
		},
	}
}

// TestRequestShapesMatchStripeMock sends the service's stripe-go calls to
// stripe-mock, which validates each request against Stripe's OpenAPI spec
// (an unknown route or parameter is a 400 or 404), and to the fake: both
// must accept every one, so the fake serves what Stripe would.
func TestRequestShapesMatchStripeMock(t *testing.T) {
	t.Parallel()
	mock := StartStripeMock(t)
	fake := New(t)
	fx := LoadFixtures(t)
	fake.PutSubscription(fx.Subscription(Subscription{ID: "sub_1", Customer: "cus_1", Status: "active", PriceID: "price_1", Created: 1700000000}))
	fake.AddEvent(fx.Event("evt_1", "customer.subscription.updated", 1700000000, fx.Subscription(Subscription{ID: "sub_1"}), nil), false)
	fake.SetActiveEntitlements("cus_1", fx.ActiveEntitlement("ent_1", "feat_1", "pro"))

	for name, call := range calls(newClient(mock, 0)) {
		if err := call(); err != nil {
			t.Errorf("stripe-mock refused %s: %v", name, err)
		}
	}
	for name, call := range calls(newClient(fake.URL(), 0)) {
		if err := call(); err != nil {
			t.Errorf("fake refused %s: %v", name, err)
		}
	}
}

// ids lists the ids of every object an iterator yields, page after page.
func ids(t *testing.T, it *stripe.Iter) []string {
	t.Helper()
	var out []string
	for it.Next() {
		switch o := it.Current().(type) {
		case *stripe.Subscription:
			out = append(out, o.ID)
		case *stripe.SubscriptionItem:
			out = append(out, o.ID)
		case *stripe.Event:
			out = append(out, o.ID)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestListSubscriptionsPaginatesAndFiltersByStatus(t *testing.T) {
	t.Parallel()
	fake := New(t)
	fx := LoadFixtures(t)
	statuses := []string{"active", "canceled", "trialing", "incomplete_expired", "past_due"}
	for i := range 250 {
		fake.PutSubscription(fx.Subscription(Subscription{
			ID: fmt.Sprintf("sub_%03d", i), Customer: "cus_1", Status: statuses[i%len(statuses)],
			PriceID: "price_1", Created: 1700000000 + int64(i),
		}))
	}
	api := newClient(fake.URL(), 0)
	list := func(status string) []string {
		p := &stripe.SubscriptionListParams{}
		if status != "" {
			p.Status = stripe.String(status)
		}
		p.Limit = stripe.Int64(100)
		return ids(t, api.Subscriptions.List(p).Iter)
	}

	all := list("all")
	if got, want := len(all), 250; got != want {
		t.Fatalf("status=all listed %d subscriptions, want %d", got, want)
	}
	if all[0] != "sub_249" || all[249] != "sub_000" {
		t.Errorf("status=all order: first %s last %s, want newest (sub_249) first", all[0], all[249])
	}
	if got, want := fake.Calls(ListSubscriptions), 3; got != want {
		t.Errorf("250 subscriptions at limit 100 took %d calls, want %d", got, want)
	}
	if got, want := len(list("")), 200; got != want {
		t.Errorf("default status listed %d, want %d (every one but the 50 canceled)", got, want)
	}
	if got, want := len(list("ended")), 100; got != want {
		t.Errorf("status=ended listed %d, want %d", got, want)
	}
}

// A subscription of 12 items is answered with the first 10 embedded and
// has_more, as Stripe embeds a list's first page; the items list gives all
// 12 in their order, page after page, and needs the subscription.
func TestSubscriptionItems(t *testing.T) {
	t.Parallel()
	fake := New(t)
	fx := LoadFixtures(t)
	s := Subscription{ID: "sub_many", Customer: "cus_1", Status: "active", PriceID: "price_0", Created: 1700000000, PeriodEnd: 1702592000}
	want := []string{"si_sub_many"}
	for i := 1; i < 12; i++ {
		s.More = append(s.More, Item{ID: fmt.Sprintf("si_%02d", i), PriceID: fmt.Sprintf("price_%d", i), PeriodEnd: 1702592000 + int64(i)})
		want = append(want, fmt.Sprintf("si_%02d", i))
	}
	fake.PutSubscription(fx.Subscription(s))
	api := newClient(fake.URL(), 0)

	sub, err := api.Subscriptions.Get("sub_many", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(sub.Items.Data); got != EmbeddedItems || !sub.Items.HasMore {
		t.Errorf("retrieve embeds %d items, has_more %v; want %d and true", got, sub.Items.HasMore, EmbeddedItems)
	}
	p := &stripe.SubscriptionItemListParams{Subscription: stripe.String("sub_many")}
	p.Limit = stripe.Int64(5)
	if diff := cmp.Diff(want, ids(t, api.SubscriptionItems.List(p).Iter)); diff != "" {
		t.Errorf("items listed (-want +got):\n%s", diff)
	}
	if got, want := fake.Calls(ListSubscriptionItems), 3; got != want {
		t.Errorf("12 items at limit 5 took %d calls, want %d", got, want)
	}
	it := api.SubscriptionItems.List(&stripe.SubscriptionItemListParams{}).Iter
	var serr *stripe.Error
	if it.Next() || !errors.As(it.Err(), &serr) || serr.HTTPStatusCode != http.StatusBadRequest {
		t.Errorf("items without a subscription: err = %v, want a 400", it.Err())
	}

	// One item: embedded whole, has_more false.
	fake.PutSubscription(fx.Subscription(Subscription{ID: "sub_one", Customer: "cus_1", Status: "active", PriceID: "price_0"}))
	if sub, err := api.Subscriptions.Get("sub_one", nil); err != nil || len(sub.Items.Data) != 1 || sub.Items.HasMore {
		t.Errorf("one item: %v, %+v", err, sub.Items)
	}
}

func TestListEventsFiltersAndOrders(t *testing.T) {
	t.Parallel()
	fake := New(t)
	fx := LoadFixtures(t)
	sub := fx.Subscription(Subscription{ID: "sub_1", Customer: "cus_1", Status: "active"})
	add := func(id, typ string, created int64, delivered bool) {
		fake.AddEvent(fx.Event(id, typ, created, sub, nil), delivered)
	}
	add("evt_old", "customer.subscription.updated", 100, false)
	add("evt_a", "customer.subscription.created", 200, true)
	add("evt_b", "customer.subscription.updated", 200, false)
	add("evt_charge", "charge.succeeded", 300, false)
	add("evt_c", "customer.subscription.deleted", 400, true)
	api := newClient(fake.URL(), 0)

	list := func(p *stripe.EventListParams) []string { return ids(t, api.Events.List(p).Iter) }
	subTypes := stripe.StringSlice([]string{"customer.subscription.created", "customer.subscription.updated", "customer.subscription.deleted"})
	tests := []struct {
		name   string
		params *stripe.EventListParams
		want   []string
	}{
		{"newest first, later added first in a second", &stripe.EventListParams{}, []string{"evt_c", "evt_charge", "evt_b", "evt_a", "evt_old"}},
		{"types and created[gte]", &stripe.EventListParams{Types: subTypes, CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: 200}}, []string{"evt_c", "evt_b", "evt_a"}},
		{"undelivered", &stripe.EventListParams{Types: subTypes, DeliverySuccess: stripe.Bool(false)}, []string{"evt_b", "evt_old"}},
	}
	for _, tt := range tests {
		tt.params.Limit = stripe.Int64(2) // pages of two: pagination under the filters
		if diff := cmp.Diff(tt.want, list(tt.params)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}

	// ending_before walks towards the newest; stripe-go hands each page over
	// oldest first.
	p := &stripe.EventListParams{Types: subTypes}
	p.Limit, p.EndingBefore = stripe.Int64(2), stripe.String("evt_old")
	if diff := cmp.Diff([]string{"evt_a", "evt_b", "evt_c"}, list(p)); diff != "" {
		t.Errorf("ending_before evt_old (-want +got):\n%s", diff)
	}
}

func TestFailuresOnDemand(t *testing.T) {
	t.Parallel()
	fake := New(t)
	fx := LoadFixtures(t)
	fake.PutSubscription(fx.Subscription(Subscription{ID: "sub_1", Customer: "cus_1", Status: "active"}))

	// stripe-go retries a 500: one failure costs one more call.
	fake.FailNext(1, http.StatusInternalServerError)
	if _, err := newClient(fake.URL(), 1).Subscriptions.Get("sub_1", nil); err != nil {
		t.Fatalf("a 500 then a success, with one retry: %v", err)
	}
	if got, want := fake.Calls(RetrieveSubscription), 2; got != want {
		t.Errorf("calls = %d, want %d", got, want)
	}

	// A rate limit comes back as Stripe's error, code rate_limit.
	fake.FailNext(1, http.StatusTooManyRequests)
	_, err := newClient(fake.URL(), 0).Subscriptions.Get("sub_1", nil)
	var serr *stripe.Error
	if !errors.As(err, &serr) || serr.HTTPStatusCode != http.StatusTooManyRequests || serr.Code != stripe.ErrorCodeRateLimit {
		t.Errorf("after FailNext(429): err = %v, want a 429 rate_limit *stripe.Error", err)
	}

	_, err = newClient(fake.URL(), 0).Subscriptions.Get("sub_missing", nil)
	if !errors.As(err, &serr) || serr.HTTPStatusCode != http.StatusNotFound {
		t.Errorf("missing subscription: err = %v, want a 404", err)
	}
	if got, want := fake.TotalCalls(), 4; got != want {
		t.Errorf("total calls = %d, want %d", got, want)
	}
}
