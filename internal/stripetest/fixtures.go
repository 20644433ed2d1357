package stripetest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Fixtures builds Stripe objects from the real ones kept in
// testdata/stripe/api (see its README for their sources), changing only the
// fields a test sets.
type Fixtures struct {
	subscription, event, entitlement map[string]any
}

// LoadFixtures reads testdata/stripe/api from the module's root, found by
// walking up from the test's working directory to go.mod.
func LoadFixtures(t testing.TB) Fixtures {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("stripetest: no go.mod above the working directory")
		}
		dir = parent
	}
	load := func(name string) map[string]any {
		raw, err := os.ReadFile(filepath.Join(dir, "testdata", "stripe", "api", name))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return m
	}
	return Fixtures{
		subscription: load("subscription.json"),
		event:        load("event.json"),
		entitlement:  load("active_entitlement.json"),
	}
}

// Subscription is what a test chooses of a subscription; the rest is the
// fixture's.
type Subscription struct {
	ID, Customer, Status string
	PriceID              string // the first item's price
	Created, PeriodEnd   int64  // PeriodEnd: the first item's current_period_end
	CancelAtPeriodEnd    bool
	// More are items after the first, in order, each a copy of the
	// fixture's item with these fields set.
	More []Item
}

// Item is what a test chooses of a subscription item.
type Item struct {
	ID, PriceID string
	PeriodEnd   int64 // current_period_end; current_period_start is the subscription's created
}

// Subscription returns a subscription object (API 2025-03-31 and later
// shape: the period on the items) with every item embedded; Embed cuts
// the list as Stripe would. A canceled one has canceled_at and ended_at a
// minute after it was created; nothing is scheduled or paused.
func (f Fixtures) Subscription(s Subscription) []byte {
	m := clone(f.subscription)
	m["id"], m["customer"], m["status"], m["created"] = s.ID, s.Customer, s.Status, s.Created
	m["cancel_at_period_end"] = s.CancelAtPeriodEnd
	for _, k := range []string{"cancel_at", "canceled_at", "ended_at", "pause_collection", "trial_start", "trial_end", "schedule"} {
		m[k] = nil
	}
	if s.Status == "canceled" {
		m["canceled_at"], m["ended_at"] = s.Created+60, s.Created+60
	}
	items := m["items"].(map[string]any)
	items["url"] = "/v1/subscription_items?subscription=" + s.ID
	fixture := items["data"].([]any)[0].(map[string]any)
	data := []any{}
	for _, it := range append([]Item{{"si_" + s.ID, s.PriceID, s.PeriodEnd}}, s.More...) {
		item := clone(fixture)
		item["id"], item["subscription"] = it.ID, s.ID
		item["created"], item["current_period_start"], item["current_period_end"] = s.Created, s.Created, it.PeriodEnd
		item["price"].(map[string]any)["id"] = it.PriceID
		item["plan"].(map[string]any)["id"] = it.PriceID
		data = append(data, item)
	}
	items["data"] = data
	return marshal(m)
}

// EmbeddedItems is how many items a subscription embeds here: the first
// page of a Stripe list at its default size (10). Past it, has_more says
// there are more to list (a subscription may have up to 20 items).
const EmbeddedItems = 10

// Embed returns a subscription object as Stripe sends it in an API answer
// or an event: its item list cut to the first EmbeddedItems items, with
// has_more set when that left some out. A shorter list is returned as it
// is.
func Embed(raw []byte) []byte {
	m, items, data := split(raw)
	if len(data) <= EmbeddedItems {
		return raw
	}
	items["data"], items["has_more"] = marshal(data[:EmbeddedItems]), marshal(true)
	m["items"] = marshal(items)
	return marshal(m)
}

// split decodes a subscription object one level down to its items: the
// object, its items list, and the list's data, each field kept raw.
func split(raw []byte) (sub, items map[string]json.RawMessage, data []json.RawMessage) {
	if err := json.Unmarshal(raw, &sub); err != nil {
		panic(fmt.Sprintf("stripetest: not a subscription: %v", err))
	}
	if err := json.Unmarshal(sub["items"], &items); err != nil {
		panic(fmt.Sprintf("stripetest: subscription items: %v", err))
	}
	if err := json.Unmarshal(items["data"], &data); err != nil {
		panic(fmt.Sprintf("stripetest: subscription items.data: %v", err))
	}
	return sub, items, data
}

// Event returns an event of type typ about object (a raw object), with
// data.previous_attributes when previous is not nil, as an account on
// basil sends it.
func (f Fixtures) Event(id, typ string, created int64, object []byte, previous map[string]any) []byte {
	return f.EventIn(Basil, id, typ, created, object, previous)
}

// EventIn is Event as an account on version sends it: its api_version
// says version. The object is taken as given: Render renders a
// subscription in version.
func (f Fixtures) EventIn(version, id, typ string, created int64, object []byte, previous map[string]any) []byte {
	m := clone(f.event)
	m["id"], m["type"], m["created"] = id, typ, created
	m["api_version"] = version
	data := map[string]any{"object": json.RawMessage(object)}
	if previous != nil {
		data["previous_attributes"] = previous
	}
	m["data"] = data
	return marshal(m)
}

// ActiveEntitlement returns an entitlements.active_entitlement object.
func (f Fixtures) ActiveEntitlement(id, feature, lookupKey string) []byte {
	m := clone(f.entitlement)
	m["id"], m["feature"], m["lookup_key"] = id, feature, lookupKey
	return marshal(m)
}

// clone deep-copies a decoded JSON value, so builders never share maps.
func clone(m map[string]any) map[string]any {
	var out map[string]any
	if err := json.Unmarshal(marshal(m), &out); err != nil {
		panic(err)
	}
	return out
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
