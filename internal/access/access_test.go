package access_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// fillSQL adds subscriptions $1 to $2 as the service stores them: two per
// customer (cus_<g/2>), each with an item whose price has a lookup key, a
// complete checkout session naming the user (user_<g/2>), every tenth
// canceled, every seventh ending within the next days; and the features
// of every other customer.
var fillSQL = []string{`
INSERT INTO entitlements (stripe_subscription_id, stripe_customer_id, status, price_id, current_period_end,
    cancel_at_period_end, last_event_id, last_event_created, updated_at, access_ends_at)
SELECT 'sub_' || g, 'cus_' || (g / 2), CASE WHEN g % 10 = 0 THEN 'canceled' ELSE 'active' END, 'price_' || (g % 5),
    now() + interval '20 days', g % 7 = 0, 'evt_' || g, now() - interval '1 day', now(),
    CASE WHEN g % 7 = 0 THEN now() + (g % 10000) * interval '1 minute' END
FROM generate_series($1::int, $2::int) g`, `
INSERT INTO entitlement_items (stripe_subscription_id, stripe_item_id, price_id, price_lookup_key)
SELECT 'sub_' || g, 'si_' || g, 'price_' || (g % 5), 'plan_' || (g % 5) FROM generate_series($1::int, $2::int) g`, `
INSERT INTO checkout_sessions (stripe_checkout_session_id, client_reference_id, stripe_customer_id,
    stripe_subscription_id, mode, status, last_event_id, last_event_created, updated_at)
SELECT 'cs_' || g, 'user_' || (g / 2), 'cus_' || (g / 2), 'sub_' || g, 'subscription', 'complete',
    'evt_cs_' || g, now() - interval '2 days', now()
FROM generate_series($1::int, $2::int) g`, `
INSERT INTO customer_features (stripe_customer_id, lookup_keys, complete, last_event_id, last_event_created, updated_at)
SELECT 'cus_' || c, ARRAY['feature_' || (c % 3), 'export'], true, 'evt_f_' || c, now(), now()
FROM generate_series($1::int / 2, $2::int / 2) c WHERE c % 2 = 0
ON CONFLICT DO NOTHING`}

// fill adds subscriptions from to to (numbers), in batches, and analyzes.
func fill(tb testing.TB, pool *pgxpool.Pool, from, to int) {
	tb.Helper()
	ctx := context.Background()
	for lo := from; lo <= to; lo += 100_000 {
		hi := min(lo+100_000-1, to)
		for _, q := range fillSQL {
			if _, err := pool.Exec(ctx, q, lo, hi); err != nil {
				tb.Fatalf("fill %d-%d: %v", lo, hi, err)
			}
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE entitlements, entitlement_items, checkout_sessions, customer_features`); err != nil {
		tb.Fatal(err)
	}
}

// viewAnswers is customer_access read plainly, grouped by customer, for
// the customers of ids.
func viewAnswers(t *testing.T, pool *pgxpool.Pool, customers ...string) []access.Answer {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT stripe_customer_id, stripe_subscription_id, client_reference_id,
    status, has_access, access_ends_at, price_lookup_keys, features
FROM customer_access WHERE stripe_customer_id = ANY($1) ORDER BY 1, 2`, customers)
	if err != nil {
		t.Fatal(err)
	}
	out := []access.Answer{}
	var c string
	var s access.Subscription
	_, err = pgx.ForEachRow(rows, []any{&c, &s.StripeSubscriptionID, &s.ClientReferenceID, &s.Status, &s.HasAccess,
		&s.AccessEndsAt, &s.PriceLookupKeys, &s.Features}, func() error {
		if len(out) == 0 || out[len(out)-1].StripeCustomerID != c {
			out = append(out, access.Answer{StripeCustomerID: c, Subscriptions: []access.Subscription{}})
		}
		sub := s
		sub.PriceLookupKeys = append([]string{}, s.PriceLookupKeys...)
		sub.Features = append([]string{}, s.Features...)
		if sub.AccessEndsAt != nil {
			u := sub.AccessEndsAt.UTC()
			sub.AccessEndsAt = &u
		}
		a := &out[len(out)-1]
		a.Subscriptions = append(a.Subscriptions, sub)
		a.HasAccess = a.HasAccess || sub.HasAccess
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noVersion drops what only a read has: its version and instant.
var noVersion = cmp.Transformer("noVersion", func(a access.Answer) access.Answer {
	a.Version, a.At = 0, time.Time{}
	return a
})

// TestLookup: each key answers the whole answer of the customers it
// names, as customer_access has them; a user named by one of a
// customer's two subscriptions gets both; an unknown id gets none.
func TestLookup(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	fill(t, pool, 1, 40)
	// user_x paid for sub_21 only; cus_10 also has sub_20 (user_10's).
	if _, err := pool.Exec(context.Background(), `UPDATE checkout_sessions SET client_reference_id = 'user_x' WHERE stripe_subscription_id = 'sub_21'`); err != nil {
		t.Fatal(err)
	}
	store := access.NewStore(pool)
	tests := []struct {
		key   access.Key
		value string
		want  []string
	}{
		{access.ByClientReference, "user_3", []string{"cus_3"}},
		{access.ByClientReference, "user_x", []string{"cus_10"}},
		{access.ByCustomer, "cus_7", []string{"cus_7"}},
		{access.BySubscription, "sub_14", []string{"cus_7"}},
		{access.ByClientReference, "user_nobody", nil},
		{access.ByCustomer, "cus_nobody", nil},
		{access.BySubscription, "sub_nobody", nil},
	}
	for _, tt := range tests {
		got, err := store.Lookup(context.Background(), tt.key, tt.value)
		if err != nil {
			t.Fatal(err)
		}
		want := viewAnswers(t, pool, tt.want...)
		if diff := cmp.Diff(want, got, noVersion); diff != "" {
			t.Errorf("Lookup(%s, %s) (-view +got):\n%s", tt.key, tt.value, diff)
		}
		for _, a := range got {
			if len(a.Subscriptions) != 2 {
				t.Errorf("Lookup(%s, %s): %s has %d subscriptions, want its 2", tt.key, tt.value, a.StripeCustomerID, len(a.Subscriptions))
			}
		}
	}
}

// TestCustomerVersionGrows: each read of one customer's answer has a
// higher version than the one before, and a customer with no
// subscription has an answer with none and no access.
func TestCustomerVersionGrows(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	fill(t, pool, 1, 4)
	store := access.NewStore(pool)
	var last int64
	for range 3 {
		a, err := store.Customer(context.Background(), "cus_1")
		if err != nil {
			t.Fatal(err)
		}
		if a.Version <= last || len(a.Subscriptions) != 2 {
			t.Fatalf("answer %+v after version %d: want a higher version and 2 subscriptions", a, last)
		}
		if got, want := a.Version, a.At.UnixMicro(); got != want {
			t.Errorf("version %d, at %s (%d µs): want the same instant", got, a.At, want)
		}
		last = a.Version
	}
	a, err := store.Customer(context.Background(), "cus_without_subscriptions")
	if err != nil {
		t.Fatal(err)
	}
	if a.StripeCustomerID != "cus_without_subscriptions" || a.HasAccess || a.Subscriptions == nil || len(a.Subscriptions) != 0 {
		t.Errorf("answer of a customer with no subscription: %+v, want it, no access, []", a)
	}
}

// TestPageCoversEveryCustomer: following next from the first page reads
// every customer once, in order, with its whole answer.
func TestPageCoversEveryCustomer(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	fill(t, pool, 0, 13) // cus_0 to cus_6
	store := access.NewStore(pool)
	var got []string
	after, pages := "", 0
	for {
		page, next, err := store.Page(context.Background(), after, 3)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, a := range page {
			got = append(got, a.StripeCustomerID)
			if len(a.Subscriptions) != 2 {
				t.Errorf("%s has %d subscriptions on its page, want 2", a.StripeCustomerID, len(a.Subscriptions))
			}
		}
		if next == "" {
			break
		}
		after = next
		if pages > 10 {
			t.Fatal("paging does not end")
		}
	}
	want := []string{"cus_0", "cus_1", "cus_2", "cus_3", "cus_4", "cus_5", "cus_6"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("customers over the pages (-want +got):\n%s", diff)
	}
	if pages != 3 {
		t.Errorf("%d pages of 3 for 7 customers, want 3", pages)
	}
}

// TestExpired: the window (since, now] of access that ended, oldest
// first; a canceled subscription's end moves no answer and is left out.
func TestExpired(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	fill(t, pool, 1, 30)
	if _, err := pool.Exec(ctx, `UPDATE entitlements SET access_ends_at = CASE stripe_subscription_id
        WHEN 'sub_1' THEN now() - interval '2 minutes' WHEN 'sub_2' THEN now() - interval '1 minute'
        WHEN 'sub_10' THEN now() - interval '1 minute' WHEN 'sub_3' THEN now() - interval '1 hour'
        ELSE now() + interval '1 day' END`); err != nil {
		t.Fatal(err)
	}
	got, now, err := access.NewStore(pool).Expired(ctx, time.Now().Add(-10*time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	var customers []string
	for _, e := range got {
		customers = append(customers, e.StripeCustomerID)
		if e.EndsAt.After(now) {
			t.Errorf("%+v ends after now %s", e, now)
		}
	}
	// sub_1 is cus_0's, sub_2 cus_1's; sub_10 is canceled, sub_3 before the window.
	if diff := cmp.Diff([]string{"cus_0", "cus_1"}, customers); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
}

const (
	token1 = "tok_0123456789abcdef"
	token2 = "tok_fedcba9876543210"
)

func apiGet(t *testing.T, h http.Handler, target, token string) (int, map[string]json.RawMessage) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, target, nil)
	if token != "" {
		r.Header.Set("Authorization", token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q, want application/json", target, ct)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("GET %s: body %q: %v", target, w.Body, err)
	}
	return w.Code, body
}

// TestAPI: the read API refuses without one of its tokens (401, JSON),
// refuses a query without exactly one key (400), answers a key with the
// answers customer_access gives, and accepts every token of a rotation.
func TestAPI(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	fill(t, pool, 1, 10)
	var logs strings.Builder
	api := access.NewAPI(access.NewStore(pool), []string{token1, token2}, slog.New(slog.NewTextHandler(&logs, nil)))
	refusals := []struct {
		target, auth string
		want         int
	}{
		{"/v1/access?client_reference_id=user_1", "", http.StatusUnauthorized},
		{"/v1/access?client_reference_id=user_1", "Bearer tok_wrong_wrong_wrong", http.StatusUnauthorized},
		{"/v1/access?client_reference_id=user_1", "Bearer " + token1 + "x", http.StatusUnauthorized},
		{"/v1/access?client_reference_id=user_1", "Basic " + token1, http.StatusUnauthorized},
		{"/v1/access?client_reference_id=user_1", token1, http.StatusUnauthorized},
		{"/v1/access", "Bearer " + token1, http.StatusBadRequest},
		{"/v1/access?client_reference_id=user_1&stripe_customer_id=cus_1", "Bearer " + token1, http.StatusBadRequest},
		{"/v1/access?client_reference_id=user_1&after=", "Bearer " + token1, http.StatusBadRequest},
		{"/v1/access?client_reference_id=", "Bearer " + token1, http.StatusBadRequest},
		{"/v1/access?after=&limit=0", "Bearer " + token1, http.StatusBadRequest},
	}
	for _, tt := range refusals {
		code, body := apiGet(t, api, tt.target, tt.auth)
		if code != tt.want || len(body["error"]) == 0 {
			t.Errorf("GET %s with %q: %d %v, want %d and an error", tt.target, tt.auth, code, body, tt.want)
		}
	}
	for _, tok := range []string{token1, token2} {
		code, body := apiGet(t, api, "/v1/access?client_reference_id=user_2", "Bearer "+tok)
		if code != http.StatusOK {
			t.Fatalf("GET with a valid token: %d %v", code, body)
		}
		var got []access.Answer
		if err := json.Unmarshal(body["data"], &got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(viewAnswers(t, pool, "cus_2"), got, noVersion); diff != "" {
			t.Errorf("GET ?client_reference_id=user_2 (-view +api):\n%s", diff)
		}
	}
	code, body := apiGet(t, api, "/v1/access?stripe_customer_id=cus_nobody", "Bearer "+token2)
	if code != http.StatusOK || string(body["data"]) != "[]" {
		t.Errorf("an unknown customer: %d %s, want 200 and []", code, body["data"])
	}
	code, body = apiGet(t, api, "/v1/access?after=&limit=4", "Bearer "+token1)
	if code != http.StatusOK || string(body["next"]) != `"cus_3"` {
		t.Errorf("the first page of 4: %d, next %s; want 200 and \"cus_3\"", code, body["next"])
	}
	code, body = apiGet(t, api, "/v1/access?after=cus_3", "Bearer "+token1)
	if code != http.StatusOK || string(body["next"]) != "null" {
		t.Errorf("the last page: %d, next %s; want 200 and null", code, body["next"])
	}
	for _, tok := range []string{token1, token2, "tok_wrong"} {
		if strings.Contains(logs.String(), tok) {
			t.Errorf("the log holds a token: %s", logs.String())
		}
	}
}

// TestPlans: every statement reads by index under a generic plan (as a
// prepared statement settles on), at a size where a sequential scan would
// be chosen were no index usable.
func TestPlans(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	fill(t, pool, 1, 20_000)
	for _, s := range access.Statements() {
		plan := genericPlan(t, pool, s, "EXPLAIN")
		if strings.Contains(plan, "Seq Scan on entitlements") || strings.Contains(plan, "Seq Scan on checkout_sessions") {
			t.Errorf("%s: a sequential scan under a generic plan:\n%s", s.Name, plan)
		}
	}
}

// genericPlan is explain's output (EXPLAIN, with options) for s, prepared
// under plan_cache_mode=force_generic_plan.
func genericPlan(tb testing.TB, pool *pgxpool.Pool, s access.Statement, explain string) string {
	tb.Helper()
	ctx := context.Background()
	var plan []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `PREPARE q AS `+s.SQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, explain+` EXECUTE q(`+s.Args+`)`)
		if err != nil {
			return err
		}
		if plan, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DEALLOCATE q`)
		return err
	})
	if err != nil {
		tb.Fatalf("%s: %v", s.Name, err)
	}
	return strings.Join(plan, "\n")
}
