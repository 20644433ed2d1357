package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// stripeRig is a fake Stripe API, a database the service serves from,
// and the environment of the stripe commands against both.
type stripeRig struct {
	api  *stripetest.API
	fx   stripetest.Fixtures
	svc  *service
	pool *pgxpool.Pool
	env  map[string]string
}

func newStripeRig(t *testing.T) *stripeRig {
	t.Helper()
	api := stripetest.New(t)
	svc := startService(t, nil)
	pool, err := pgxpool.New(context.Background(), svc.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &stripeRig{
		api: api, fx: stripetest.LoadFixtures(t), svc: svc, pool: pool,
		env: map[string]string{
			"DATABASE_URL":     svc.databaseURL,
			"STRIPE_API_KEY":   stripetest.Key,
			"STRIPE_API_URL":   api.URL().String(),
			"REDIS_URL":        dbtest.RedisURL(t),
			"REDIS_KEY_PREFIX": svc.prefix, // the service's claims
			"LOG_LEVEL":        "warn",
		},
	}
}

// stripe runs "munchable-webhooks stripe args..." in-process.
func (r *stripeRig) stripe(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(t.Context(), append([]string{"munchable-webhooks", "stripe"}, args...), environ(r.env), &out, &errOut)
	return out.String(), errOut.String(), err
}

// deliver posts a signed event to the running service, as Stripe would.
func (r *stripeRig) deliver(t *testing.T, event []byte) {
	t.Helper()
	if resp := r.svc.postStripe(t, event); resp.StatusCode != http.StatusOK {
		t.Fatalf("webhook delivery: %d", resp.StatusCode)
	}
}

type row struct {
	Status, PriceID, LastEventID string
	CancelAtPeriodEnd            bool
}

func (r *stripeRig) rows(t *testing.T) map[string]row {
	t.Helper()
	const q = `SELECT stripe_subscription_id, status, coalesce(price_id, ''), last_event_id, cancel_at_period_end FROM entitlements`
	rows, err := r.pool.Query(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]row{}
	for rows.Next() {
		var id string
		var x row
		if err := rows.Scan(&id, &x.Status, &x.PriceID, &x.LastEventID, &x.CancelAtPeriodEnd); err != nil {
			t.Fatal(err)
		}
		out[id] = x
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (r *stripeRig) features(t *testing.T) map[string][]string {
	t.Helper()
	const q = `SELECT stripe_customer_id, lookup_keys FROM customer_features`
	rows, err := r.pool.Query(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var c string
		var keys []string
		if err := rows.Scan(&c, &keys); err != nil {
			t.Fatal(err)
		}
		out[c] = keys
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStripeSync lists three pages of subscriptions, a fifth of them
// canceled (which Stripe's default list leaves out), while a webhook
// changes one subscription that the first page already carried: the
// webhook's newer state must survive the snapshot, every other row must be
// Stripe's, and a second sync must change nothing.
func TestStripeSync(t *testing.T) {
	t.Parallel()
	r := newStripeRig(t)
	base := time.Now().Add(-24 * time.Hour).Unix()
	want := map[string]row{}
	wantFeatures := map[string][]string{}
	sub := func(i int, status, price string) stripetest.Subscription {
		return stripetest.Subscription{
			ID: fmt.Sprintf("sub_sync%03d", i), Customer: fmt.Sprintf("cus_sync%03d", i), Status: status,
			PriceID: price, Created: base + int64(i), PeriodEnd: base + 30*86400,
		}
	}
	for i := range 250 {
		status := "active"
		if i%5 == 0 {
			status = "canceled"
		}
		s := sub(i, status, "price_basic")
		r.api.PutSubscription(r.fx.Subscription(s))
		want[s.ID] = row{Status: status, PriceID: "price_basic"}
		if i%2 == 0 {
			r.api.SetActiveEntitlements(s.Customer, r.fx.ActiveEntitlement(fmt.Sprintf("ent_%d", i), "feat_recipes", "recipes"))
			wantFeatures[s.Customer] = []string{"recipes"}
		} else {
			wantFeatures[s.Customer] = []string{}
		}
	}

	// Stripe lists newest first: sub_sync101 is on the second page. Just
	// before that page is served it is upgraded and the webhook for that
	// lands, while the page still carries the state from before (the page
	// was read a moment before the change): the stored event is newer
	// than the snapshot and must be kept. The API shows the upgrade from
	// the next request on.
	upgraded := sub(101, "active", "price_pro")
	var upgradedAt int64 // set by the callback, during the sync
	r.api.OnCall(func(route string, n int) {
		switch {
		case route == stripetest.ListSubscriptions && n == 2:
			// Created now, during the sync, as a real event would be: a
			// time taken before the sync began could fall in a second
			// before the snapshot's on a slow machine, and the snapshot
			// would then rightly win.
			upgradedAt = time.Now().Unix()
			r.deliver(t, r.fx.Event("evt_upgrade", "customer.subscription.updated", upgradedAt, r.fx.Subscription(upgraded),
				map[string]any{"items": map[string]any{}}))
		case route == stripetest.ListSubscriptions && n == 3:
			r.api.PutSubscription(r.fx.Subscription(upgraded))
		}
	})
	want[upgraded.ID] = row{Status: "active", PriceID: "price_pro", LastEventID: "evt_upgrade"}

	stdout, stderr, err := r.stripe(t, "sync")
	if err != nil {
		t.Fatalf("stripe sync: %v\n%s", err, stderr)
	}
	if got := r.api.Calls(stripetest.ListSubscriptions); got != 3 {
		t.Errorf("subscription pages requested = %d, want 3", got)
	}
	if !strings.Contains(stdout, "250 subscriptions (249 stored, 1 kept, 0 invalid)") ||
		!strings.Contains(stdout, "250 customers' entitlements (250 stored, 0 kept, 0 skipped), 253 API requests") ||
		strings.Count(stdout, "\n") != 1 {
		t.Errorf("summary = %q, want one line: 250 subscriptions, 249 stored, the upgraded one kept", stdout)
	}
	check := func(when string) {
		got := r.rows(t)
		for id, w := range want {
			g, ok := got[id]
			if !ok {
				t.Errorf("%s: %s not stored", when, id)
				continue
			}
			if w.LastEventID == "" {
				g.LastEventID = "" // a snapshot's own marker
			}
			g.CancelAtPeriodEnd = false
			if g != w {
				t.Errorf("%s: %s = %+v, want %+v", when, id, g, w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d rows, want %d", when, len(got), len(want))
		}
		if diff := cmp.Diff(wantFeatures, r.features(t)); diff != "" {
			t.Errorf("%s: customer features (-want +got):\n%s", when, diff)
		}
	}
	check("after the first sync")

	// Again, with nothing changed at Stripe, from a later second than the
	// upgrade's event: the same state, the upgraded subscription now
	// stored from the API.
	r.api.OnCall(nil)
	time.Sleep(time.Until(time.Unix(upgradedAt+1, 0)))
	want[upgraded.ID] = row{Status: "active", PriceID: "price_pro"}
	if stdout, stderr, err = r.stripe(t, "sync"); err != nil {
		t.Fatalf("second stripe sync: %v\n%s", err, stderr)
	}
	// The 50 canceled rows are kept as they are: a canceled subscription
	// never changes again.
	if !strings.Contains(stdout, "250 subscriptions (200 stored, 50 kept, 0 invalid)") {
		t.Errorf("second summary = %q", stdout)
	}
	check("after the second sync")
}

// TestStripeSyncCompletesItems: a listed subscription of 12 items, of
// which the page embeds 10 with has_more, is stored with all 12 in order
// and the period end of the earliest, a missing one. Its items cost one
// request more; an API failure while listing them fails the sync (it is
// not an unreadable object).
func TestStripeSyncCompletesItems(t *testing.T) {
	t.Parallel()
	r := newStripeRig(t)
	base := time.Now().Add(-24 * time.Hour).Unix()
	s := stripetest.Subscription{ID: "sub_items", Customer: "cus_items", Status: "active", PriceID: "price_00",
		Created: base, PeriodEnd: base + 30*86400}
	want := []string{"si_sub_items"}
	for i := 1; i < 12; i++ {
		it := stripetest.Item{ID: fmt.Sprintf("si_items_%02d", i), PriceID: fmt.Sprintf("price_%02d", i), PeriodEnd: base + int64(30+i)*86400}
		if i == 11 {
			it.PeriodEnd = base + 10*86400
		}
		s.More = append(s.More, it)
		want = append(want, it.ID)
	}
	r.api.PutSubscription(r.fx.Subscription(s))

	r.api.OnCall(func(route string, n int) {
		if route == stripetest.ListSubscriptionItems && n == 1 {
			r.api.FailNext(3, http.StatusInternalServerError) // past stripe-go's two retries
		}
	})
	stdout, _, err := r.stripe(t, "sync")
	if err == nil || !strings.Contains(err.Error(), "list items of subscription sub_items") || strings.Contains(stdout, "1 invalid") {
		t.Errorf("sync with the items listing failing: err = %v, summary %q; want the listing named, nothing invalid", err, stdout)
	}

	r.api.OnCall(nil)
	stdout, stderr, err := r.stripe(t, "sync")
	if err != nil {
		t.Fatalf("stripe sync: %v\n%s", err, stderr)
	}
	if !strings.Contains(stdout, "1 subscriptions (1 stored, 0 kept, 0 invalid)") || !strings.Contains(stdout, ", 3 API requests") {
		t.Errorf("summary = %q, want 1 stored in 3 requests (subscriptions, items, entitlements)", stdout)
	}
	var items []string
	var periodEnd time.Time
	const q = `SELECT e.current_period_end, array_agg(i.stripe_item_id ORDER BY i.position)
		FROM entitlements e JOIN entitlement_items i USING (stripe_subscription_id)
		WHERE e.stripe_subscription_id = 'sub_items' GROUP BY e.current_period_end`
	if err := r.pool.QueryRow(t.Context(), q).Scan(&periodEnd, &items); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, items); diff != "" {
		t.Errorf("entitlement_items (-want +got):\n%s", diff)
	}
	if periodEnd.Unix() != base+10*86400 {
		t.Errorf("current_period_end = %s, want the earliest item end %s", periodEnd, time.Unix(base+10*86400, 0))
	}
}

// TestStripeReplay replays 50 events of which 20 were already delivered
// by webhook: those are duplicates and run nothing (their rows keep their
// updated_at), the other 30 are processed, oldest first; two more show a
// stale one counted. A second replay, of the undelivered ones only, finds
// every one done.
func TestStripeReplay(t *testing.T) {
	t.Parallel()
	r := newStripeRig(t)
	base := time.Now().Add(-2 * time.Hour).Unix()
	for i := range 25 {
		s := stripetest.Subscription{
			ID: fmt.Sprintf("sub_replay%02d", i), Customer: fmt.Sprintf("cus_replay%02d", i), Status: "active",
			PriceID: "price_basic", Created: base + int64(10*i), PeriodEnd: base + 30*86400,
		}
		created := r.fx.Event(fmt.Sprintf("evt_created%02d", i), "customer.subscription.created", s.Created, r.fx.Subscription(s), nil)
		s.PriceID, s.CancelAtPeriodEnd = "price_pro", true
		updated := r.fx.Event(fmt.Sprintf("evt_updated%02d", i), "customer.subscription.updated", s.Created+5, r.fx.Subscription(s),
			map[string]any{"cancel_at_period_end": false})
		delivered := i < 10
		if delivered {
			r.deliver(t, created)
			r.deliver(t, updated)
		}
		r.api.AddEvent(created, delivered)
		r.api.AddEvent(updated, delivered)
		r.api.AddEvent(r.fx.Event(fmt.Sprintf("evt_charge%02d", i), "charge.succeeded", s.Created, []byte(`{"id":"ch_1"}`), nil), false)
	}
	// One more subscription whose newer event was delivered while an older
	// one never was: replayed, the older one is stale and changes nothing.
	late := stripetest.Subscription{ID: "sub_replay25", Customer: "cus_replay25", Status: "active", PriceID: "price_pro", Created: base + 1000, PeriodEnd: base + 30*86400, CancelAtPeriodEnd: true}
	newer := r.fx.Event("evt_updated25", "customer.subscription.updated", base+1100, r.fx.Subscription(late), map[string]any{"items": map[string]any{}})
	r.deliver(t, newer)
	r.api.AddEvent(newer, true)
	older := late
	older.PriceID = "price_basic"
	r.api.AddEvent(r.fx.Event("evt_older25", "customer.subscription.created", base+1000, r.fx.Subscription(older), nil), false)

	r.api.AddEvent(r.fx.Event("evt_too_old", "customer.subscription.created", base-48*3600,
		r.fx.Subscription(stripetest.Subscription{ID: "sub_old", Customer: "cus_old", Status: "active"}), nil), false)
	before := updatedAt(t, r.pool)

	stdout, stderr, err := r.stripe(t, "replay", "--since", "24h")
	if err != nil {
		t.Fatalf("stripe replay: %v\n%s", err, stderr)
	}
	if want := "52 events: 30 processed, 21 duplicate, 1 stale, 0 unordered, 0 in progress, 0 failed, 0 ignored"; !strings.Contains(stdout, want) || strings.Count(stdout, "\n") != 1 {
		t.Errorf("summary = %q, want one line with %q", stdout, want)
	}
	after := updatedAt(t, r.pool)
	for id, at := range before {
		if !after[id].Equal(at) {
			t.Errorf("%s was written again (updated_at %s, then %s): a delivered event was applied twice", id, at, after[id])
		}
	}
	rows := r.rows(t)
	if len(rows) != 26 {
		t.Errorf("%d subscriptions stored, want 26 (not the one outside --since)", len(rows))
	}
	for id, g := range rows {
		want := row{Status: "active", PriceID: "price_pro", LastEventID: "evt_updated" + strings.TrimPrefix(id, "sub_replay"), CancelAtPeriodEnd: true}
		if g != want {
			t.Errorf("%s = %+v, want %+v (the later event, replayed oldest first)", id, g, want)
		}
	}

	stdout, stderr, err = r.stripe(t, "replay", "--since", "24h", "--undelivered")
	if err != nil {
		t.Fatalf("second stripe replay: %v\n%s", err, stderr)
	}
	if want := "31 events: 0 processed, 31 duplicate"; !strings.Contains(stdout, want) {
		t.Errorf("second summary = %q, want %q", stdout, want)
	}

	// An event whose claim another attempt holds (after an outage, perhaps
	// a dead process's) is not done: the run says so and fails.
	held := stripetest.Subscription{ID: "sub_held", Customer: "cus_held", Status: "active", PriceID: "price_pro", Created: base + 2000, PeriodEnd: base + 30*86400}
	r.api.AddEvent(r.fx.Event("evt_held", "customer.subscription.created", held.Created, r.fx.Subscription(held), nil), false)
	rdb, _ := dbtest.Redis(t)
	rdb.Set(t.Context(), r.svc.prefix+":stripe:evt_held", processingValue("crashed", time.Now(), ""), time.Minute)
	stdout, _, err = r.stripe(t, "replay", "--since", "24h", "--undelivered")
	if err == nil || !strings.Contains(err.Error(), "held by another attempt") {
		t.Errorf("replay with a held claim: err = %v, want one naming the held event", err)
	}
	if want := "1 in progress"; !strings.Contains(stdout, want) {
		t.Errorf("summary with a held claim = %q, want %q", stdout, want)
	}
}

func updatedAt(t *testing.T, pool *pgxpool.Pool) map[string]time.Time {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT stripe_subscription_id, updated_at FROM entitlements`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		out[id] = at
	}
	return out
}

// TestStripeAPIFailures: a 500 is retried by stripe-go and a 429 rate
// limit by the lister, so one of each costs a request and no failure; an
// API that keeps failing fails the command, naming the listing.
func TestStripeAPIFailures(t *testing.T) {
	t.Parallel()
	r := newStripeRig(t)
	for i := range 3 {
		r.api.PutSubscription(r.fx.Subscription(stripetest.Subscription{
			ID: fmt.Sprintf("sub_f%d", i), Customer: fmt.Sprintf("cus_f%d", i), Status: "active", PriceID: "price_basic", Created: 1700000000,
		}))
	}
	tests := []struct {
		name      string
		status, n int
		wantErr   string
		wantCalls int // 1 subscription page and 3 entitlement lists, plus the failed answers
	}{
		{"a 500", http.StatusInternalServerError, 1, "", 5},
		{"a 429", http.StatusTooManyRequests, 1, "", 5},
		{"500s past stripe-go's retries", http.StatusInternalServerError, 3, "list subscriptions", 3},
	}
	for _, tt := range tests {
		before := r.api.TotalCalls()
		r.api.FailNext(tt.n, tt.status)
		_, stderr, err := r.stripe(t, "sync")
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: sync failed: %v\n%s", tt.name, err, stderr)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: err = %v, want one naming %q", tt.name, err, tt.wantErr)
		}
		if got := r.api.TotalCalls() - before; got != tt.wantCalls {
			t.Errorf("%s: %d requests, want %d", tt.name, got, tt.wantCalls)
		}
	}
	if got := len(r.rows(t)); got != 3 {
		t.Errorf("%d rows, want 3", got)
	}

	// An object the service cannot read (no customer) is counted and
	// fails the command, and does not stop the others.
	r.api.PutSubscription(r.fx.Subscription(stripetest.Subscription{ID: "sub_unreadable", Status: "active", Created: 1700000001}))
	stdout, _, err := r.stripe(t, "sync")
	if err == nil || !strings.Contains(err.Error(), "1 subscriptions could not be read") ||
		!strings.Contains(stdout, "4 subscriptions (3 stored, 0 kept, 1 invalid)") {
		t.Errorf("sync with an unreadable subscription: err = %v, summary %q", err, stdout)
	}
}

// TestStripeCommandsAgainstStripeMock runs both commands against
// stripe-mock, which checks each request against Stripe's OpenAPI spec:
// every route and parameter they send exists at Stripe. (stripe-mock
// answers with fixtures and does not paginate, so only acceptance and the
// one fixture subscription are checked; the fake tests the rest.)
func TestStripeCommandsAgainstStripeMock(t *testing.T) {
	t.Parallel()
	mock := stripetest.StartStripeMock(t)
	_, prefix := dbtest.Redis(t)
	env := map[string]string{
		"DATABASE_URL": dbtest.NewDatabase(t), "STRIPE_API_KEY": stripetest.Key, "STRIPE_API_URL": mock.String(),
		"REDIS_URL": dbtest.RedisURL(t), "REDIS_KEY_PREFIX": prefix, "LOG_LEVEL": "warn",
	}
	for _, args := range [][]string{{"sync"}, {"replay", "--since", "720h", "--undelivered"}} {
		var stdout, stderr bytes.Buffer
		if err := run(t.Context(), append([]string{"munchable-webhooks", "stripe"}, args...), environ(env), &stdout, &stderr); err != nil {
			t.Errorf("stripe %s against stripe-mock: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		t.Log(strings.TrimSpace(stdout.String()))
		if args[0] == "sync" && !strings.Contains(stdout.String(), "1 subscriptions (1 stored") {
			t.Errorf("sync against stripe-mock: %q, want its one fixture subscription stored", stdout.String())
		}
	}
}

func TestStripeCommandLine(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none", "STRIPE_API_KEY": stripetest.Key}
	tests := []struct {
		args    []string
		env     map[string]string
		usage   string // "stdout", "stderr" or "" (none)
		wantErr string // "" for success
	}{
		{[]string{"-h"}, nil, "stdout", ""},
		{[]string{"--help"}, nil, "stdout", ""},
		{[]string{"sync", "-h"}, nil, "stdout", ""},
		{[]string{"replay", "--help"}, nil, "stdout", ""},
		{nil, nil, "stderr", "missing command"},
		{[]string{"frobnicate"}, nil, "stderr", "unknown command"},
		{[]string{"sync", "--since", "1h"}, nil, "stderr", "not defined"},
		{[]string{"replay"}, nil, "stderr", "--since"},
		{[]string{"replay", "--since", "721h"}, nil, "stderr", "at most 720h"},
		{[]string{"replay", "--since", "1h", "extra"}, nil, "stderr", "want 0 arguments"},
		{[]string{"sync"}, map[string]string{"DATABASE_URL": "postgres://x/y"}, "", "STRIPE_API_KEY is required"},
		{[]string{"replay", "--since", "1h"}, env, "", "REDIS_URL is required"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), append([]string{"munchable-webhooks", "stripe"}, tt.args...), environ(tt.env), &stdout, &stderr)
		name := strings.Join(tt.args, " ")
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("stripe %s: %v", name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("stripe %s: err = %v, want one with %q", name, err, tt.wantErr)
		}
		if usage := tt.usage == "stderr"; usage != errors.Is(err, errUsage) {
			t.Errorf("stripe %s: err = %v, usage error (exit 2) %v", name, err, usage)
		}
		out := map[string]string{"stdout": stdout.String(), "stderr": stderr.String()}
		for stream, text := range out {
			if has := strings.Contains(text, "usage: munchable-webhooks stripe"); has != (stream == tt.usage) {
				t.Errorf("stripe %s: usage on %s = %v, want it on %q only", name, stream, has, tt.usage)
			}
		}
		if tt.usage == "stdout" && stderr.Len() > 0 {
			t.Errorf("stripe %s: help wrote to stderr: %q", name, stderr.String())
		}
	}
}

// BenchmarkStripeSync and BenchmarkStripeReplay run the commands against
// the fake API holding 10,000 subscriptions, each of its own customer with
// one active entitlement, and one customer.subscription.created event
// each. Run them once each: go test -run '^$' -bench Stripe -benchtime 1x.
// Each iteration gets a fresh database and claim prefix, so every run
// stores and processes everything.
const benchSubscriptions = 10_000

func BenchmarkStripeSync(b *testing.B) { benchmarkStripe(b, "sync") }

func BenchmarkStripeReplay(b *testing.B) { benchmarkStripe(b, "replay", "--since", "24h") }

func benchmarkStripe(b *testing.B, args ...string) {
	api := stripetest.New(b)
	fx := stripetest.LoadFixtures(b)
	base := time.Now().Add(-12 * time.Hour).Unix()
	for i := range benchSubscriptions {
		s := stripetest.Subscription{
			ID: fmt.Sprintf("sub_bench%05d", i), Customer: fmt.Sprintf("cus_bench%05d", i), Status: "active",
			PriceID: "price_basic", Created: base + int64(i), PeriodEnd: base + 30*86400,
		}
		obj := fx.Subscription(s)
		api.PutSubscription(obj)
		api.SetActiveEntitlements(s.Customer, fx.ActiveEntitlement(fmt.Sprintf("ent_bench%05d", i), "feat_recipes", "recipes"))
		api.AddEvent(fx.Event(fmt.Sprintf("evt_bench%05d", i), "customer.subscription.created", s.Created, obj, nil), false)
	}
	redisURL := dbtest.RedisURL(b)
	var stdout, progress string
	var rows int
	for b.Loop() {
		b.StopTimer()
		dbURL := dbtest.NewDatabase(b)
		_, prefix := dbtest.Redis(b)
		env := map[string]string{
			"DATABASE_URL": dbURL, "STRIPE_API_KEY": stripetest.Key, "STRIPE_API_URL": api.URL().String(),
			"REDIS_URL": redisURL, "REDIS_KEY_PREFIX": prefix, "LOG_LEVEL": "warn",
		}
		calls := api.TotalCalls()
		var out, errOut bytes.Buffer
		b.StartTimer()
		if err := run(b.Context(), append([]string{"munchable-webhooks", "stripe"}, args...), environ(env), &out, &errOut); err != nil {
			b.Fatalf("%v\n%s", err, errOut.String())
		}
		b.StopTimer()
		b.ReportMetric(float64(api.TotalCalls()-calls), "requests/op")
		pool, err := pgxpool.New(b.Context(), dbURL)
		if err != nil {
			b.Fatal(err)
		}
		if err := pool.QueryRow(b.Context(), `SELECT count(*) FROM entitlements`).Scan(&rows); err != nil {
			b.Fatal(err)
		}
		pool.Close()
		stdout = out.String()
		lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
		progress = lines[len(lines)-1]
		b.StartTimer()
	}
	b.ReportMetric(float64(rows), "rows")
	b.Log(strings.TrimSpace(stdout))
	b.Log("last progress line: ", progress)
}
