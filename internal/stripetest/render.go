package stripetest

import (
	"encoding/json"
	"fmt"
)

// Basil is the first API version in which a subscription's billing period
// is each item's, not the subscription's
// (https://docs.stripe.com/changelog/basil/2025-03-31/deprecate-subscription-current-period-start-and-end).
const Basil = "2025-03-31.basil"

// before says whether version is older than basil. Stripe's versions are
// dates first, so they order as strings; "" (no Stripe-Version sent) is
// not a version and is never older.
func before(version, than string) bool {
	return version != "" && version[:min(len(version), 10)] < than[:10]
}

// Render returns a subscription object as Stripe renders it in version,
// whichever shape it was put in: before basil the period is the
// subscription's, shared by its items, which carry none; from basil on it
// is each item's, and the subscription carries none. Moving a period to
// the subscription takes the first item's: before basil all items shared
// one. An empty version returns raw as it is. Everything else is kept as
// it was put: the fields the service reads did not change shape between
// 2024-06-20 and dahlia otherwise.
func Render(raw []byte, version string) []byte {
	if version == "" {
		return raw
	}
	sub, items, raws := split(raw)
	data := make([]map[string]json.RawMessage, len(raws))
	for i, it := range raws {
		if err := json.Unmarshal(it, &data[i]); err != nil {
			panic(fmt.Sprintf("stripetest: subscription items.data[%d]: %v", i, err))
		}
	}
	periods := []string{"current_period_start", "current_period_end"}
	if before(version, Basil) {
		for _, k := range periods {
			if isNull(sub[k]) && len(data) > 0 {
				sub[k] = data[0][k]
			}
			for _, it := range data {
				delete(it, k)
			}
		}
	} else {
		for _, k := range periods {
			for _, it := range data {
				if isNull(it[k]) {
					it[k] = sub[k]
				}
			}
			delete(sub, k)
		}
	}
	items["data"] = marshal(data)
	sub["items"] = marshal(items)
	return marshal(sub)
}

// renderItems is a subscription's item list as GET /v1/subscription_items
// answers it in version.
func renderItems(raw []byte, version string) []object {
	var sub struct {
		Items struct {
			Data []json.RawMessage `json:"data"`
		} `json:"items"`
	}
	if err := json.Unmarshal(Render(raw, version), &sub); err != nil {
		panic(fmt.Sprintf("stripetest: not a subscription: %v", err))
	}
	out := make([]object, len(sub.Items.Data))
	for i, it := range sub.Items.Data {
		out[i] = decode(it)
	}
	return out
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }
