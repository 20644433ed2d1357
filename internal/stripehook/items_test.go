package stripehook

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// manyItems is a subscription of 12 items, built from Stripe's fixture
// (testdata/stripe/api), of which an event or an answer embeds the first
// 10 with has_more. The earliest item end is the last item's, one that is
// not embedded: stored from the embedded list alone, current_period_end
// and access_ends_at would be 20 days late.
type manyItems struct {
	sub      stripetest.Subscription
	ids      []string // every item, in Stripe's order
	earliest time.Time
}

const itemsCreated = corpusStart

func newManyItems(id string) manyItems {
	m := manyItems{sub: stripetest.Subscription{
		ID: id, Customer: "cus_QmunchableItems", Status: "active", PriceID: "price_item00",
		Created: itemsCreated, PeriodEnd: day(30),
	}}
	m.ids = []string{"si_" + id}
	for i := 1; i < 12; i++ {
		end := day(30 + int64(i))
		switch i {
		case 10:
			end = day(20)
		case 11:
			end = day(10)
		}
		it := stripetest.Item{ID: fmt.Sprintf("si_%s_%02d", id, i), PriceID: fmt.Sprintf("price_item%02d", i), PeriodEnd: end}
		m.sub.More = append(m.sub.More, it)
		m.ids = append(m.ids, it.ID)
	}
	m.earliest = *at(day(10))
	return m
}

// event is a customer.subscription.updated about m as Stripe sends it
// (items cut to the first page), with previous_attributes when not nil.
func (m manyItems) event(fx stripetest.Fixtures, id string, created int64, previous map[string]any) []byte {
	return fx.Event(id, "customer.subscription.updated", created, stripetest.Embed(fx.Subscription(m.sub)), previous)
}

// itemsRig is a harness with the fake Stripe API holding the subscription
// (nil api: offline).
type itemsRig struct {
	*harness
	api *stripetest.API
	fx  stripetest.Fixtures
}

func newItemsRig(t *testing.T, withKey bool) itemsRig {
	t.Helper()
	r := itemsRig{api: stripetest.New(t), fx: stripetest.LoadFixtures(t)}
	o := options{}
	if withKey {
		o.api = NewAPI(stripetest.Key, r.api.URL(), nil, nil)
	}
	r.harness = newHarness(t, o)
	return r
}

func itemIDs(items []storedItem) []string {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.ID
	}
	return ids
}

// With a key, an event whose item list was cut stores every item in
// Stripe's order, and price_id, current_period_end and access_ends_at from
// all of them; without one it stores the 10 that arrived, answers 200,
// counts it and logs a warning naming the subscription.
func TestTruncatedItems(t *testing.T) {
	t.Parallel()
	for _, withKey := range []bool{true, false} {
		t.Run(fmt.Sprintf("key=%v", withKey), func(t *testing.T) {
			t.Parallel()
			r := newItemsRig(t, withKey)
			m := newManyItems("sub_QmunchableItems")
			m.sub.CancelAtPeriodEnd = true
			r.api.PutSubscription(r.fx.Subscription(m.sub))
			assertAnswer(t, r.post(t, m.event(r.fx, "evt_items", itemsCreated+60, nil), time.Now()), 200, "first")

			got, items := r.subscription(t, m.sub.ID)
			wantIDs, wantEnd, wantIncomplete := m.ids, m.earliest, 0.0
			if !withKey {
				wantIDs, wantEnd, wantIncomplete = m.ids[:stripetest.EmbeddedItems], *at(day(30)), 1
			}
			if d := cmp.Diff(wantIDs, itemIDs(items)); d != "" {
				t.Errorf("entitlement_items (-want +got):\n%s", d)
			}
			if got.PeriodEnd == nil || !got.PeriodEnd.Equal(wantEnd) || got.AccessEndsAt == nil || !got.AccessEndsAt.Equal(wantEnd) {
				t.Errorf("current_period_end %v, access_ends_at %v; want both %v, the earliest item end", got.PeriodEnd, got.AccessEndsAt, wantEnd)
			}
			if got.PriceID == nil || *got.PriceID != "price_item00" {
				t.Errorf("price_id = %v, want the first item's", got.PriceID)
			}
			if n := r.metric(t, "entitlement_items_incomplete_total"); n != wantIncomplete {
				t.Errorf("entitlement_items_incomplete_total = %v, want %v", n, wantIncomplete)
			}
			logs := r.logs.String()
			if warned := strings.Contains(logs, `"level":"WARN"`) && strings.Contains(logs, `"subscription_id":"sub_QmunchableItems"`); warned == withKey {
				t.Errorf("warning logged = %v, want %v:\n%s", warned, !withKey, logs)
			}
			if calls := r.api.Calls(stripetest.ListSubscriptionItems); (calls == 1) != withKey {
				t.Errorf("items listed %d times", calls)
			}
		})
	}
}

// An API failure while listing the items fails the delivery and releases
// its claim; Stripe's retry lists them and stores all 12.
func TestTruncatedItemsAPIFailure(t *testing.T) {
	t.Parallel()
	r := newItemsRig(t, true)
	m := newManyItems("sub_QmunchableItemsFail")
	r.api.PutSubscription(r.fx.Subscription(m.sub))
	body := m.event(r.fx, "evt_items_fail", itemsCreated+60, nil)

	r.api.FailNext(3, http.StatusInternalServerError) // one try and stripe-go's two retries
	assertAnswer(t, r.post(t, body, time.Now()), 500, "first")
	if n := r.rdb.Exists(t.Context(), r.claims.Key("stripe", "evt_items_fail")).Val(); n != 0 {
		t.Error("claim kept after the items listing failed")
	}
	if n := r.rows(t); n != 0 {
		t.Errorf("%d rows written by a failed delivery", n)
	}

	assertAnswer(t, r.post(t, body, time.Now()), 200, "first")
	got, items := r.subscription(t, m.sub.ID)
	if d := cmp.Diff(m.ids, itemIDs(items)); d != "" {
		t.Errorf("entitlement_items after the retry (-want +got):\n%s", d)
	}
	if got.PeriodEnd == nil || !got.PeriodEnd.Equal(m.earliest) {
		t.Errorf("current_period_end = %v, want %v", got.PeriodEnd, m.earliest)
	}
}

// Same-second events of a subscription whose items arrive cut. The state
// before an event that does not name items has the items it has now, all
// of them: so a successor is admitted as such, and is not taken for an
// unordered event because the stored set is complete and the event's list
// is not. An unordered one, with a key, is settled by retrieving the
// subscription, whose answer is cut as well and completed before it is
// stored.
func TestTruncatedItemsSameSecond(t *testing.T) {
	t.Parallel()
	for _, withKey := range []bool{true, false} {
		t.Run(fmt.Sprintf("key=%v", withKey), func(t *testing.T) {
			t.Parallel()
			r := newItemsRig(t, withKey)
			m := newManyItems("sub_QmunchableItemsTie")
			const second = itemsCreated + 120
			r.api.PutSubscription(r.fx.Subscription(m.sub))
			assertAnswer(t, r.post(t, m.event(r.fx, "evt_tie_first", second, nil), time.Now()), 200, "first")

			// Canceled at period end in the same second, naming only that.
			m.sub.CancelAtPeriodEnd = true
			r.api.PutSubscription(r.fx.Subscription(m.sub))
			successor := m.event(r.fx, "evt_tie_cancel", second, map[string]any{"cancel_at_period_end": false})
			assertAnswer(t, r.post(t, successor, time.Now()), 200, "first")
			got, items := r.subscription(t, m.sub.ID)
			wantItems := len(m.ids)
			if !withKey {
				wantItems = stripetest.EmbeddedItems
			}
			if got.LastEventID != "evt_tie_cancel" || !got.CancelAtPeriodEnd || len(items) != wantItems {
				t.Errorf("after the successor: from %s, cancel_at_period_end %v, %d items; want evt_tie_cancel, true, %d",
					got.LastEventID, got.CancelAtPeriodEnd, len(items), wantItems)
			}
			if n := r.api.Calls(stripetest.RetrieveSubscription); n != 0 {
				t.Errorf("the successor was settled by retrieving the subscription (%d calls): taken for unordered", n)
			}
			if n := r.metric(t, "entitlements_unordered_events_total"); n != 0 {
				t.Errorf("entitlements_unordered_events_total = %v after a successor, want 0", n)
			}

			// Past due in the same second, without saying what changed:
			// unordered.
			m.sub.Status = "past_due"
			r.api.PutSubscription(r.fx.Subscription(m.sub))
			unordered := m.event(r.fx, "evt_tie_unordered", second, map[string]any{"metadata": map[string]any{}})
			assertAnswer(t, r.post(t, unordered, time.Now()), 200, "first")
			got, items = r.subscription(t, m.sub.ID)
			if withKey {
				if got.LastEventID != "api:evt_tie_unordered" || got.Status != "past_due" || len(items) != len(m.ids) ||
					!got.PeriodEnd.Equal(m.earliest) {
					t.Errorf("revalidated: from %s, %s, %d items, period end %v; want Stripe's state with all %d items",
						got.LastEventID, got.Status, len(items), got.PeriodEnd, len(m.ids))
				}
				return
			}
			if got.LastEventID != "evt_tie_cancel" || r.metric(t, "entitlements_unordered_events_total") != 1 {
				t.Errorf("offline: row from %s, unordered %v; want evt_tie_cancel kept and counted",
					got.LastEventID, r.metric(t, "entitlements_unordered_events_total"))
			}
		})
	}
}
