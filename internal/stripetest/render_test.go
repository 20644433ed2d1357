package stripetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// periods is where an answer carries the billing period: the
// subscription's, and each item's, as "start-end" ("" when absent).
type periods struct {
	Subscription string
	Items        []string
}

func periodsOf(t *testing.T, raw []byte) periods {
	t.Helper()
	var s struct {
		Start *int64 `json:"current_period_start"`
		End   *int64 `json:"current_period_end"`
		Items struct {
			Data []struct {
				Start *int64 `json:"current_period_start"`
				End   *int64 `json:"current_period_end"`
			} `json:"data"`
		} `json:"items"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	span := func(a, b *int64) string {
		if a == nil && b == nil {
			return ""
		}
		if a == nil || b == nil {
			return "half"
		}
		return fmt.Sprintf("%dd", (*b-*a)/86400)
	}
	p := periods{Subscription: span(s.Start, s.End)}
	for _, it := range s.Items.Data {
		p.Items = append(p.Items, span(it.Start, it.End))
	}
	return p
}

// get answers a GET on the fake naming version in Stripe-Version ("":
// none).
func get(t *testing.T, a *API, path, version string) []byte {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, a.URL().String()+path, nil)
	req.Header.Set("Authorization", "Bearer "+Key)
	if version != "" {
		req.Header.Set("Stripe-Version", version)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v %s", path, resp.StatusCode, err, body)
	}
	return body
}

// A subscription put in either shape is answered, retrieved and listed,
// in the shape of the version the request names: before basil the period
// on the subscription only (the first item's), from basil on on the items
// only (the subscription's where an item had none). No Stripe-Version:
// as put.
func TestAnswersRenderTheRequestedVersion(t *testing.T) {
	t.Parallel()
	fake := New(t)
	fx := LoadFixtures(t)
	const start = 1700000000
	// Items of 3 and 5 days, to tell which period went where.
	basil := fx.Subscription(Subscription{ID: "sub_basil", Customer: "cus_1", Status: "active", PriceID: "price_0",
		Created: start, PeriodEnd: start + 3*86400, More: []Item{{ID: "si_2", PriceID: "price_2", PeriodEnd: start + 5*86400}}})
	fake.PutSubscription(basil)
	old := Render(fx.Subscription(Subscription{ID: "sub_old", Customer: "cus_1", Status: "active", PriceID: "price_0",
		Created: start, PeriodEnd: start + 3*86400, More: []Item{{ID: "si_3", PriceID: "price_2", PeriodEnd: start + 3*86400}}}), "2024-06-20")
	fake.PutSubscription(old)

	tests := []struct {
		id, version string
		want        periods
	}{
		{"sub_basil", "2024-06-20", periods{"3d", []string{"", ""}}},
		{"sub_basil", "2025-02-24.acacia", periods{"3d", []string{"", ""}}},
		{"sub_basil", Basil, periods{"", []string{"3d", "5d"}}},
		{"sub_basil", "2026-07-29.dahlia", periods{"", []string{"3d", "5d"}}},
		{"sub_basil", "", periods{"", []string{"3d", "5d"}}},
		{"sub_old", "2024-06-20", periods{"3d", []string{"", ""}}},
		{"sub_old", "2025-09-30.clover", periods{"", []string{"3d", "3d"}}},
		{"sub_old", "", periods{"3d", []string{"", ""}}},
	}
	for _, tt := range tests {
		retrieved := periodsOf(t, get(t, fake, "/v1/subscriptions/"+tt.id, tt.version))
		if d := cmp.Diff(tt.want, retrieved); d != "" {
			t.Errorf("retrieve %s in %q (-want +got):\n%s", tt.id, tt.version, d)
		}
		var list struct{ Data []json.RawMessage }
		if err := json.Unmarshal(get(t, fake, "/v1/subscriptions?status=all", tt.version), &list); err != nil {
			t.Fatal(err)
		}
		for _, raw := range list.Data {
			var head struct{ ID string }
			_ = json.Unmarshal(raw, &head)
			if head.ID == tt.id {
				if d := cmp.Diff(tt.want, periodsOf(t, raw)); d != "" {
					t.Errorf("list %s in %q (-want +got):\n%s", tt.id, tt.version, d)
				}
			}
		}
		// The items list renders each item as the embedded one.
		items := periodsOf(t, []byte(`{"items":`+string(get(t, fake, "/v1/subscription_items?subscription="+tt.id, tt.version))+`}`))
		if d := cmp.Diff(tt.want.Items, items.Items); d != "" {
			t.Errorf("items of %s in %q (-want +got):\n%s", tt.id, tt.version, d)
		}
	}
}
