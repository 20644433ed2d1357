package stripesync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// rig is a fake Stripe API, a database, and the claim flow that webhook
// deliveries and replays share, as the service and the stripe commands
// share them.
type rig struct {
	api    *stripetest.API
	fx     stripetest.Fixtures
	pool   *pgxpool.Pool
	rdb    *redis.Client
	prefix string
	store  *entitlements.Store
	ep     *claim.Endpoint
	client *client.API
	// hook decodes webhook deliveries as the service does, without an API
	// key; replayer decodes listed events as stripe replay does.
	hook, replayer *stripehook.Receiver
	logger         *slog.Logger
}

func newRig(t testing.TB) *rig {
	t.Helper()
	return rigOn(t, stripetest.New(t))
}

// rigOn is a rig whose API is api, and a database and claim prefix of its
// own.
func rigOn(t testing.TB, api *stripetest.API) *rig {
	t.Helper()
	r := &rig{api: api, fx: stripetest.LoadFixtures(t), pool: dbtest.NewPool(t)}
	r.rdb, r.prefix = dbtest.Redis(t)
	r.logger = slog.New(slog.NewJSONHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r.store = entitlements.NewStore(r.pool, nil)
	claims := claim.NewStore(r.rdb, claim.StoreConfig{Prefix: r.prefix, Timeout: time.Second, ProcessingTTL: 2 * time.Minute})
	flow := claim.NewFlow(claims, claim.FlowConfig{HandlerTimeout: 30 * time.Second, Logger: r.logger})
	r.ep = flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: 72 * time.Hour})
	r.hook = stripehook.New(stripehook.Config{Store: r.store, Logger: r.logger})
	r.useAPI(r.api.URL())
	return r
}

// useAPI points sync and replay at the Stripe API at u.
func (r *rig) useAPI(u *url.URL) {
	r.client = stripehook.NewAPI(stripetest.Key, u, r.logger, nil)
	r.replayer = stripehook.New(stripehook.Config{Store: r.store, API: r.client, Logger: r.logger})
}

// sync runs Sync as stripe sync does.
func (r *rig) sync(t testing.TB) (SyncCounts, error) {
	t.Helper()
	return Sync(t.Context(), SyncConfig{API: r.client, Store: r.store, Logger: r.logger})
}

// replay runs Replay as stripe replay --since since [--undelivered] does.
func (r *rig) replay(t testing.TB, since time.Duration, undelivered bool) (ReplayCounts, error) {
	t.Helper()
	return Replay(t.Context(), ReplayConfig{API: r.client, Receiver: r.replayer, Endpoint: r.ep,
		Since: time.Now().Add(-since), Undelivered: undelivered, Logger: r.logger})
}

// deliver runs an event through the claim as a webhook delivery of it
// would, body fingerprinted.
func (r *rig) deliver(t testing.TB, event []byte) {
	t.Helper()
	ev, err := r.hook.Event(event)
	if err != nil {
		t.Fatalf("webhook delivery: %v", err)
	}
	if res, err := r.ep.Process(context.WithoutCancel(t.Context()), event, ev); err != nil || res.Outcome != claim.Processed {
		t.Fatalf("webhook delivery: %+v, %v", res, err)
	}
}

type row struct {
	Status, PriceID, LastEventID string
	CancelAtPeriodEnd            bool
}

func (r *rig) rows(t *testing.T) map[string]row {
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

func (r *rig) features(t *testing.T) map[string][]string {
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
	r := newRig(t)
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

	n, err := r.sync(t)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if got := r.api.Calls(stripetest.ListSubscriptions); got != 3 {
		t.Errorf("subscription pages requested = %d, want 3", got)
	}
	if summary := n.String(); !strings.Contains(summary, "250 subscriptions (249 stored, 1 kept, 0 invalid)") ||
		!strings.Contains(summary, "250 customers' entitlements (250 stored, 0 kept, 0 skipped), 253 API requests") {
		t.Errorf("summary = %q, want 250 subscriptions, 249 stored, the upgraded one kept", summary)
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
	if n, err = r.sync(t); err != nil {
		t.Fatalf("second sync: %v", err)
	}
	// The 50 canceled rows are kept as they are: a canceled subscription
	// never changes again.
	if summary := n.String(); !strings.Contains(summary, "250 subscriptions (200 stored, 50 kept, 0 invalid)") {
		t.Errorf("second summary = %q", summary)
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
	r := newRig(t)
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
	n, err := r.sync(t)
	if err == nil || !strings.Contains(err.Error(), "list items of subscription sub_items") || strings.Contains(n.String(), "1 invalid") {
		t.Errorf("sync with the items listing failing: err = %v, summary %q; want the listing named, nothing invalid", err, n)
	}

	r.api.OnCall(nil)
	n, err = r.sync(t)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if summary := n.String(); !strings.Contains(summary, "1 subscriptions (1 stored, 0 kept, 0 invalid)") || !strings.Contains(summary, ", 3 API requests") {
		t.Errorf("summary = %q, want 1 stored in 3 requests (subscriptions, items, entitlements)", summary)
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
	r := newRig(t)
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

	n, err := r.replay(t, 24*time.Hour, false)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if want := "52 events: 30 processed, 21 duplicate, 1 stale, 0 unordered, 0 in progress, 0 failed, 0 ignored"; !strings.Contains(n.String(), want) {
		t.Errorf("summary = %q, want %q", n, want)
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

	n, err = r.replay(t, 24*time.Hour, true)
	if err != nil {
		t.Fatalf("second replay: %v", err)
	}
	if want := "31 events: 0 processed, 31 duplicate"; !strings.Contains(n.String(), want) {
		t.Errorf("second summary = %q, want %q", n, want)
	}

	// An event whose claim another attempt holds (after an outage, perhaps
	// a dead process's) is not done: the run says so and fails.
	held := stripetest.Subscription{ID: "sub_held", Customer: "cus_held", Status: "active", PriceID: "price_pro", Created: base + 2000, PeriodEnd: base + 30*86400}
	r.api.AddEvent(r.fx.Event("evt_held", "customer.subscription.created", held.Created, r.fx.Subscription(held), nil), false)
	// A processing claim as claim's store writes it: owner, claim time.
	heldClaim := fmt.Sprintf("processing|%s|%d|%s", "crashed", time.Now().UnixMilli(), "")
	r.rdb.Set(t.Context(), r.prefix+":stripe:evt_held", heldClaim, time.Minute)
	n, err = r.replay(t, 24*time.Hour, true)
	if err == nil || !strings.Contains(err.Error(), "held by another attempt") {
		t.Errorf("replay with a held claim: err = %v, want one naming the held event", err)
	}
	if want := "1 in progress"; !strings.Contains(n.String(), want) {
		t.Errorf("summary with a held claim = %q, want %q", n, want)
	}
}

// TestStripeReplayStopped: a replay (or a sweep's pass) stopped in the
// middle of a page leaves the rest of it to the next run and says it
// stopped; it does not run the rest without their claims, beside the
// attempts that hold them.
func TestStripeReplayStopped(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	base := time.Now().Add(-time.Hour).Unix()
	for i := range 5 {
		s := stripetest.Subscription{ID: fmt.Sprintf("sub_stop%d", i), Customer: fmt.Sprintf("cus_stop%d", i), Status: "active",
			PriceID: "price_basic", Created: base + int64(i), PeriodEnd: base + 30*86400}
		r.api.AddEvent(r.fx.Event(fmt.Sprintf("evt_stop%d", i), "customer.subscription.created", s.Created, r.fx.Subscription(s), nil), false)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n, err := Replay(ctx, ReplayConfig{API: r.client, Receiver: r.replayer, Endpoint: r.ep,
		Since: time.Now().Add(-2 * time.Hour), Logger: r.logger,
		Progress: func(_ string, done, _ int) {
			if done == 2 { // the second event is under way: stop after it
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("stopped replay: err = %v, want context.Canceled", err)
	}
	if rows := r.rows(t); len(rows) > 1 || n.Processed > 1 {
		t.Errorf("stopped replay stored %d subscriptions (%s), want at most the first: none after the stop", len(rows), n)
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
	r := newRig(t)
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
		_, err := r.sync(t)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: sync failed: %v", tt.name, err)
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
	n, err := r.sync(t)
	if err == nil || !strings.Contains(err.Error(), "1 subscriptions could not be read") ||
		!strings.Contains(n.String(), "4 subscriptions (3 stored, 0 kept, 1 invalid)") {
		t.Errorf("sync with an unreadable subscription: err = %v, summary %q", err, n)
	}
}

// TestStripeCommandsAgainstStripeMock runs sync and replay against
// stripe-mock, which checks each request against Stripe's OpenAPI spec:
// every route and parameter they send exists at Stripe. (stripe-mock
// answers with fixtures and does not paginate, so only acceptance and the
// one fixture subscription are checked; the fake tests the rest.)
func TestStripeCommandsAgainstStripeMock(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.useAPI(stripetest.StartStripeMock(t))
	n, err := r.sync(t)
	if err != nil {
		t.Errorf("sync against stripe-mock: %v", err)
	}
	t.Log(n)
	if !strings.Contains(n.String(), "1 subscriptions (1 stored") {
		t.Errorf("sync against stripe-mock: %q, want its one fixture subscription stored", n)
	}
	m, err := r.replay(t, Window, true)
	if err != nil {
		t.Errorf("replay against stripe-mock: %v", err)
	}
	t.Log(m)
}

// BenchmarkStripeSync and BenchmarkStripeReplay run sync and replay
// against the fake API holding 10,000 subscriptions, each of its own
// customer with one active entitlement, and one
// customer.subscription.created event each. Run them once each:
// go test -run '^$' -bench Stripe -benchtime 1x. Each iteration gets a
// fresh database and claim prefix, so every run stores and processes
// everything.
const benchSubscriptions = 10_000

func BenchmarkStripeSync(b *testing.B) {
	benchmarkStripe(b, func(r *rig, p Progress) (fmt.Stringer, error) {
		return Sync(b.Context(), SyncConfig{API: r.client, Store: r.store, Logger: r.logger, Progress: p})
	})
}

func BenchmarkStripeReplay(b *testing.B) {
	benchmarkStripe(b, func(r *rig, p Progress) (fmt.Stringer, error) {
		return Replay(b.Context(), ReplayConfig{API: r.client, Receiver: r.replayer, Endpoint: r.ep,
			Since: time.Now().Add(-24 * time.Hour), Logger: r.logger, Progress: p})
	})
}

func benchmarkStripe(b *testing.B, walk func(*rig, Progress) (fmt.Stringer, error)) {
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
	var summary fmt.Stringer
	var progress string
	var rows int
	for b.Loop() {
		b.StopTimer()
		r := rigOn(b, api)
		calls := api.TotalCalls()
		b.StartTimer()
		n, err := walk(r, func(what string, done, total int) { progress = fmt.Sprintf("%s %d/%d", what, done, total) })
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		b.ReportMetric(float64(api.TotalCalls()-calls), "requests/op")
		if err := r.pool.QueryRow(b.Context(), `SELECT count(*) FROM entitlements`).Scan(&rows); err != nil {
			b.Fatal(err)
		}
		summary = n
		b.StartTimer()
	}
	b.ReportMetric(float64(rows), "rows")
	b.Log(summary)
	b.Log("last progress: ", progress)
}
