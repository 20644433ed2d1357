package stripehook

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// randomID is an id of n bytes that does not compress: a repeated
// character would fit a btree entry once Postgres compressed it, and hide
// the poison a real attacker's random id makes.
func randomID(prefix string, n int) string {
	b := make([]byte, n/2)
	rand.Read(b) // never returns an error
	return (prefix + hex.EncodeToString(b))[:n]
}

// TestLongIDsRefused: a signed event naming an id of 200 KB (the event's
// own, its object's, its customer's, an item's, a session's client
// reference) is refused before the claim as malformed, 400, and writes
// nothing; the log names the field. On main such an event was applied
// while its id compressed under Postgres's btree limit and failed every
// retry when it did not. Ids at the bounds are applied.
func TestLongIDsRefused(t *testing.T) {
	t.Parallel()
	huge := func(prefix string) string { return randomID(prefix, 200<<10) }
	item := func(ev map[string]any) map[string]any {
		return object(ev)["items"].(map[string]any)["data"].([]any)[0].(map[string]any)
	}
	const sub, session, summary = "customer.subscription.updated.cancel_at.json", "checkout.session.completed.json", "entitlements.active_entitlement_summary.updated.json"
	tests := []struct {
		name, file string
		edit       func(ev map[string]any)
		reason     string // webhook_rejections_total's
		logged     string
	}{
		{"event id", sub, func(ev map[string]any) { ev["id"] = huge("evt_") }, "invalid_id", ""},
		{"subscription id", sub, func(ev map[string]any) { object(ev)["id"] = huge("sub_") }, "malformed", "subscription id is 204800 bytes"},
		{"subscription customer", sub, func(ev map[string]any) { object(ev)["customer"] = huge("cus_") }, "malformed", "customer is 204800 bytes"},
		{"expanded customer", sub, func(ev map[string]any) { object(ev)["customer"] = map[string]any{"id": huge("cus_")} }, "malformed", "customer is 204800 bytes"},
		{"customer account", sub, func(ev map[string]any) {
			object(ev)["customer"] = nil
			object(ev)["customer_account"] = huge("acct_")
		}, "malformed", "customer is 204800 bytes"},
		{"item id", sub, func(ev map[string]any) { item(ev)["id"] = huge("si_") }, "malformed", "items.data[0].id is 204800 bytes"},
		{"price id", sub, func(ev map[string]any) { item(ev)["price"].(map[string]any)["id"] = huge("price_") }, "malformed", "items.data[0].price.id is"},
		{"product id", sub, func(ev map[string]any) { item(ev)["price"].(map[string]any)["product"] = huge("prod_") }, "malformed", "items.data[0].price.product is"},
		{"summary customer", summary, func(ev map[string]any) { object(ev)["customer"] = huge("cus_") }, "malformed", "customer is 204800 bytes"},
		{"session id", session, func(ev map[string]any) { object(ev)["id"] = huge("cs_") }, "malformed", "checkout session id is 204800 bytes"},
		{"session customer", session, func(ev map[string]any) { object(ev)["customer"] = huge("cus_") }, "malformed", "customer is 204800 bytes"},
		{"session subscription", session, func(ev map[string]any) { object(ev)["subscription"] = huge("sub_") }, "malformed", "subscription is 204800 bytes"},
		{"client reference", session, func(ev map[string]any) { object(ev)["client_reference_id"] = huge("user_") }, "malformed", "client_reference_id is 204800 bytes"},
		{"client reference just over", session, func(ev map[string]any) { object(ev)["client_reference_id"] = strings.Repeat("é", 401) }, "malformed", "client_reference_id is 802 bytes, over 800"},
		{"subscription id just over", sub, func(ev map[string]any) { object(ev)["id"] = randomID("sub_", 256) }, "malformed", "subscription id is 256 bytes, over 255"},
	}
	// One database for all: each case is refused before writing anything.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A harness each: refusals are logged sampled, the first ten
			// of a kind a minute, and each case looks for its own line.
			h := newHarness(t, options{})
			before := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", tt.reason)
			w := h.post(t, edit(t, corpus(t, tt.file), tt.edit), time.Now())
			assertAnswer(t, w, 400, "")
			if keys := h.rdb.Keys(t.Context(), h.claims.Key("stripe", "*")).Val(); len(keys) != 0 {
				t.Errorf("took claims: %d", len(keys))
			}
			if got := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", tt.reason) - before; got != 1 {
				t.Errorf("webhook_rejections_total{reason=%q} rose by %v, want 1", tt.reason, got)
			}
			if logs := h.logs.String(); !strings.Contains(logs, tt.logged) {
				t.Errorf("log does not name %q", tt.logged)
			}
			var n int
			if err := h.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM entitlements) + (SELECT count(*) FROM customer_features)
				+ (SELECT count(*) FROM checkout_sessions) + (SELECT count(*) FROM webhook_events) + (SELECT count(*) FROM changes)`).Scan(&n); err != nil || n != 0 {
				t.Errorf("rows written: %d (%v), want none", n, err)
			}
		})
	}

	// At the bounds, everything is applied.
	at := []struct {
		file string
		edit func(ev map[string]any)
	}{
		{sub, func(ev map[string]any) {
			object(ev)["id"], object(ev)["customer"] = randomID("sub_", maxObjectID), randomID("cus_", maxObjectID)
			item(ev)["id"] = randomID("si_", maxObjectID)
			item(ev)["price"].(map[string]any)["id"] = randomID("price_", maxObjectID)
			item(ev)["price"].(map[string]any)["product"] = randomID("prod_", maxObjectID)
		}},
		{summary, func(ev map[string]any) { object(ev)["customer"] = randomID("cus_", maxObjectID) }},
		{session, func(ev map[string]any) {
			object(ev)["id"], object(ev)["subscription"] = randomID("cs_", maxObjectID), randomID("sub_", maxObjectID)
			object(ev)["client_reference_id"] = strings.Repeat("é", maxClientReference/2)
		}},
	}
	h := newHarness(t, options{})
	for _, a := range at {
		assertAnswer(t, h.post(t, edit(t, corpus(t, a.file), a.edit), time.Now()), 200, "first")
	}
}
