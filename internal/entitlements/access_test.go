package entitlements_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// seedAccessSQL stores n subscriptions with their checkout sessions in
// every shape the access view must tell apart, by g % 6: a later complete
// session (its reference wins); two complete in the same second (the
// smaller session id wins); a latest complete session without a
// reference (null, not the older one's); no session; a newer session
// still open (not complete, so not counted); one plain session. Then
// sessions of subscriptions not stored, and ANALYZE, so that the planner
// prices the tables as the rows they hold.
const seedAccessSQL = `
INSERT INTO entitlements (stripe_subscription_id, stripe_customer_id, status, price_id,
    current_period_end, cancel_at_period_end, last_event_id, last_event_created, updated_at)
SELECT 'sub_' || g, 'cus_' || (g / 2), 'active', 'price_1', now() + interval '20 days',
       false, 'evt_' || g, now(), now()
FROM generate_series(1, $1::int) g;
INSERT INTO entitlement_items (stripe_subscription_id, stripe_item_id, price_id, price_lookup_key)
SELECT 'sub_' || g, 'si_' || g, 'price_1', 'pro' FROM generate_series(1, $1::int) g;
INSERT INTO customer_features (stripe_customer_id, lookup_keys, complete, last_event_id,
    last_event_created, updated_at)
SELECT DISTINCT 'cus_' || (g / 2), '{pro}'::text[], true, 'evt_f', now(), now()
FROM generate_series(1, $1::int, 3) g;
INSERT INTO checkout_sessions (stripe_checkout_session_id, client_reference_id,
    stripe_customer_id, stripe_subscription_id, mode, status, last_event_id,
    last_event_created, updated_at)
SELECT s.id, s.ref, 'cus_' || (g / 2), 'sub_' || g, 'subscription', s.status, 'evt_c',
       now() - s.age, now()
FROM generate_series(1, $1::int) g
CROSS JOIN LATERAL (VALUES
    ('cs_' || g || '_a', 'user_' || g || '_old', 'complete', interval '2 days', g % 6 = 0),
    ('cs_' || g || '_b', 'user_' || g, 'complete', interval '1 day', g % 6 = 0),
    ('cs_' || g || '_b', 'user_' || g || '_b', 'complete', interval '1 day', g % 6 = 1),
    ('cs_' || g || '_a', 'user_' || g, 'complete', interval '1 day', g % 6 = 1),
    ('cs_' || g || '_a', 'user_' || g, 'complete', interval '2 days', g % 6 = 2),
    ('cs_' || g || '_b', NULL, 'complete', interval '1 day', g % 6 = 2),
    ('cs_' || g || '_a', 'user_' || g, 'complete', interval '2 days', g % 6 = 4),
    ('cs_' || g || '_b', 'user_' || g || '_open', 'open', interval '1 day', g % 6 = 4),
    ('cs_' || g || '_a', 'user_' || g, 'complete', interval '1 day', g % 6 = 5)
) AS s(id, ref, status, age, keep)
WHERE s.keep;
INSERT INTO checkout_sessions (stripe_checkout_session_id, client_reference_id,
    stripe_subscription_id, mode, status, last_event_id, last_event_created, updated_at)
SELECT 'cs_gone_' || g, 'user_gone_' || g, 'sub_gone_' || g, 'subscription', 'complete',
       'evt_c', now(), now()
FROM generate_series(1, $1::int / 10) g;
ANALYZE entitlements; ANALYZE entitlement_items; ANALYZE customer_features; ANALYZE checkout_sessions;`

// firstAccessSQL is client_reference_id as the first release's view
// computed it, with a correlated subquery: the meaning the view keeps.
const firstAccessSQL = `
SELECT e.stripe_subscription_id,
    (SELECT c.client_reference_id FROM checkout_sessions c
     WHERE c.stripe_subscription_id = e.stripe_subscription_id
       AND c.status = 'complete'
     ORDER BY c.last_event_created DESC, c.stripe_checkout_session_id
     LIMIT 1)
FROM entitlements e`

// TestCustomerAccessByIndex: customer_access answers each of the app's
// lookups (by client_reference_id, stripe_customer_id and
// stripe_subscription_id) from indexes, with a plan made for the value or
// a generic one, and its client_reference_id means what it always did.
// Before migration 00011 the lookup by client_reference_id scanned every
// subscription and, for each, every checkout session.
func TestCustomerAccessByIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	const n = 3000
	// Several statements: the simple protocol, which sends n inline.
	if _, err := pool.Exec(ctx, seedAccessSQL, pgx.QueryExecModeSimpleProtocol, n); err != nil {
		t.Fatal(err)
	}

	var differ, rows int
	if err := pool.QueryRow(ctx, `
WITH first(id, ref) AS (`+firstAccessSQL+`),
     now(id, ref) AS (SELECT stripe_subscription_id, client_reference_id FROM customer_access)
SELECT (SELECT count(*) FROM ((TABLE first EXCEPT TABLE now) UNION ALL (TABLE now EXCEPT TABLE first)) d),
       (SELECT count(*) FROM now)`).Scan(&differ, &rows); err != nil {
		t.Fatal(err)
	}
	if differ != 0 || rows != n {
		t.Errorf("customer_access has %d rows, %d differing from the first release's client_reference_id; want %d rows, none differing", rows, differ, n)
	}
	for sub, want := range map[string]any{"sub_6": "user_6", "sub_7": "user_7", "sub_8": nil, "sub_9": nil, "sub_10": "user_10", "sub_11": "user_11"} {
		var got any
		if err := pool.QueryRow(ctx, `SELECT client_reference_id FROM customer_access WHERE stripe_subscription_id = $1`, sub).Scan(&got); err != nil || got != want {
			t.Errorf("client_reference_id of %s = %v, %v; want %v", sub, got, err, want)
		}
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, lookup := range []struct{ column, value string }{
		{"client_reference_id", "user_42"},
		{"stripe_customer_id", "cus_21"},
		{"stripe_subscription_id", "sub_42"},
	} {
		query := `SELECT * FROM customer_access WHERE ` + lookup.column + ` = $1`
		stmt := "access_by_" + lookup.column
		if _, err := conn.Exec(ctx, `PREPARE `+stmt+`(text) AS `+query); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
				t.Fatal(err)
			}
			var plan []byte
			if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE `+stmt+`('`+lookup.value+`')`).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			if scans := seqScans(t, plan); len(scans) > 0 {
				t.Errorf("by %s (%s): sequential scans of %s, want none:\n%s", lookup.column, mode, strings.Join(scans, ", "), plan)
			}
		}
		var got []string
		rows, err := conn.Query(ctx, `SELECT stripe_subscription_id FROM customer_access WHERE `+lookup.column+` = $1 ORDER BY 1`, lookup.value)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := map[string][]string{"client_reference_id": {"sub_42"}, "stripe_customer_id": {"sub_42", "sub_43"}, "stripe_subscription_id": {"sub_42"}}[lookup.column]
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("by %s = %s (-want +got):\n%s", lookup.column, lookup.value, diff)
		}
	}
}

// seqScans returns the tables a JSON plan scans sequentially.
func seqScans(t *testing.T, plan []byte) []string {
	t.Helper()
	type node struct {
		Type     string `json:"Node Type"`
		Relation string `json:"Relation Name"`
		Plans    []node `json:"Plans"`
	}
	var top []struct{ Plan node }
	if err := json.Unmarshal(plan, &top); err != nil || len(top) != 1 {
		t.Fatalf("EXPLAIN: %v (%s)", err, plan)
	}
	var out []string
	var walk func(n node)
	walk = func(n node) {
		if n.Type == "Seq Scan" {
			out = append(out, n.Relation)
		}
		for _, p := range n.Plans {
			walk(p)
		}
	}
	walk(top[0].Plan)
	return out
}
