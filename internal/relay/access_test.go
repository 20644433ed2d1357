package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// accessApp is the app docs/APP.md describes: it verifies each webhook
// with the Standard Webhooks library, dedupes by webhook-id, and keeps,
// per customer, the answer with the highest version. Nothing else: no
// merging, no joins.
type accessApp struct {
	t  *testing.T
	wh *svix.Webhook

	mu       sync.Mutex
	seen     map[string]bool
	latest   map[string]access.Answer
	arrivals map[string][]int64 // versions per customer, as they came
}

func newAccessApp(t *testing.T) (*accessApp, *httptest.Server) {
	t.Helper()
	wh, err := svix.NewWebhook(appSecret)
	if err != nil {
		t.Fatal(err)
	}
	app := &accessApp{t: t, wh: wh, seen: map[string]bool{}, latest: map[string]access.Answer{}, arrivals: map[string][]int64{}}
	srv := httptest.NewServer(http.HandlerFunc(app.serve))
	t.Cleanup(srv.Close)
	return app, srv
}

func (a *accessApp) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := a.wh.Verify(body, r.Header); err != nil {
		a.t.Errorf("svix refuses a webhook: %v", err)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var msg struct {
		Type string
		Data access.Answer
	}
	if err := json.Unmarshal(body, &msg); err != nil || msg.Type != "access.changed" {
		a.t.Errorf("webhook %s: type %q, %v; want access.changed", body, msg.Type, err)
	}
	id := r.Header.Get("webhook-id")
	if want := relay.AccessWebhookID(msg.Data); id != want {
		a.t.Errorf("webhook-id %q, want %q", id, want)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen[id] {
		return
	}
	a.seen[id] = true
	c := msg.Data.StripeCustomerID
	a.arrivals[c] = append(a.arrivals[c], msg.Data.Version)
	if msg.Data.Version > a.latest[c].Version {
		a.latest[c] = msg.Data
	}
}

// copy is what the app holds: each customer's subscriptions.
func (a *accessApp) copy() map[string][]access.Subscription {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]access.Subscription{}
	for c, ans := range a.latest {
		if len(ans.Subscriptions) > 0 {
			out[c] = ans.Subscriptions
		}
	}
	return out
}

// viewCopy is customer_access as it stands, in the same shape.
func viewCopy(t *testing.T, pool *pgxpool.Pool) map[string][]access.Subscription {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT stripe_customer_id, stripe_subscription_id, client_reference_id,
    status, has_access, access_ends_at, price_lookup_keys, features FROM customer_access ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]access.Subscription{}
	var c string
	var s access.Subscription
	_, err = pgx.ForEachRow(rows, []any{&c, &s.StripeSubscriptionID, &s.ClientReferenceID, &s.Status, &s.HasAccess,
		&s.AccessEndsAt, &s.PriceLookupKeys, &s.Features}, func() error {
		sub := s
		sub.PriceLookupKeys = append([]string{}, s.PriceLookupKeys...)
		sub.Features = append([]string{}, s.Features...)
		if sub.AccessEndsAt != nil {
			u := sub.AccessEndsAt.UTC()
			sub.AccessEndsAt = &u
		}
		out[c] = append(out[c], sub)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// accessRelay runs the relay with the app's webhook asking for access,
// and the pass for the ends of access, as serve runs them, until the
// test ends. It returns the pass's metrics.
func accessRelay(t *testing.T, pool *pgxpool.Pool, url string) *prometheus.Registry {
	t.Helper()
	app := newAppWebhook(t, url, relay.KindAccess)
	answers := access.NewStore(pool)
	reg := prometheus.NewRegistry()
	r := relay.New(relay.Config{Pool: pool, Consumers: relay.AppConsumers(app, answers), Poll: 10 * time.Millisecond})
	ex := relay.NewExpiry(relay.ExpiryConfig{Pool: pool, App: app, Answers: answers, Every: 100 * time.Millisecond, Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context, relay.Fence) error{r.Run, ex.Run} {
		wg.Go(func() {
			if err := run(ctx, nil); err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitFor(t, "the app_access consumer and the expiry mark", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM feed_consumers WHERE name = 'app_access')
            + (SELECT count(*) FROM access_expiry WHERE consumer = 'app_access')`).Scan(&n)
		return n == 2
	})
	return reg
}

// stripeSub is a subscription event as Stripe sends it, with a price
// lookup key on its first item.
func stripeSub(t *testing.T, f stripetest.Fixtures, evt, typ string, created int64, s stripetest.Subscription, lookupKey string) []byte {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal(f.Subscription(s), &obj); err != nil {
		t.Fatal(err)
	}
	item := obj["items"].(map[string]any)["data"].([]any)[0].(map[string]any)
	item["price"].(map[string]any)["lookup_key"] = lookupKey
	raw, _ := json.Marshal(obj)
	return f.Event(evt, typ, created, raw, nil)
}

// bundledEvent is testdata/events/name.json with its id and created set
// and its object edited.
func bundledEvent(t *testing.T, name, evt string, created int64, edit func(obj map[string]any)) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../testdata/events/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["id"], m["created"] = evt, created
	edit(m["data"].(map[string]any)["object"].(map[string]any))
	out, _ := json.Marshal(m)
	return out
}

// checkoutCompleted is the bundled checkout.session.completed for sub.
func checkoutCompleted(t *testing.T, evt, session, customer, sub, user string, created int64) []byte {
	return bundledEvent(t, "checkout.session.completed", evt, created, func(o map[string]any) {
		o["id"], o["customer"], o["subscription"], o["client_reference_id"] = session, customer, sub, user
	})
}

// featuresUpdated is the bundled entitlements summary for customer.
func featuresUpdated(t *testing.T, evt, customer string, created int64) []byte {
	return bundledEvent(t, "entitlements.active_entitlement_summary.updated", evt, created, func(o map[string]any) {
		o["customer"] = customer
	})
}

// TestAccessChangedKeepsAnExactCopy: an app that keeps the latest answer
// per customer from access.changed alone holds exactly customer_access
// after a run of signed Stripe events (subscriptions created and moved,
// a checkout session naming the user, the customer's features), and again
// once a subscription's access runs out with no event at all: that one is
// sent by the expiry pass, counted, and adds no row to the feed.
func TestAccessChangedKeepsAnExactCopy(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	f := stripetest.LoadFixtures(t)
	stripe := stripeHandler(t, pool, false)
	app, srv := newAccessApp(t)
	reg := accessRelay(t, pool, srv.URL)

	now := time.Now()
	created := now.Unix() - 600
	far := now.Add(30 * 24 * time.Hour).Unix()
	// Access that ends a few seconds from now, with nothing to announce it.
	soon := now.Add(6 * time.Second).Truncate(time.Second).Add(time.Second)
	events := [][]byte{
		stripeSub(t, f, "evt_a1", "customer.subscription.created", created,
			stripetest.Subscription{ID: "sub_a1", Customer: "cus_a", Status: "active", PriceID: "price_pro", Created: created, PeriodEnd: far}, "pro"),
		checkoutCompleted(t, "evt_a1_cs", "cs_a1", "cus_a", "sub_a1", "user_a", created+1),
		featuresUpdated(t, "evt_a_f", "cus_a", created+2),
		stripeSub(t, f, "evt_a2", "customer.subscription.created", created+3,
			stripetest.Subscription{ID: "sub_a2", Customer: "cus_a", Status: "active", PriceID: "price_addon", Created: created,
				PeriodEnd: soon.Unix(), CancelAtPeriodEnd: true}, "addon"),
		stripeSub(t, f, "evt_b1", "customer.subscription.created", created,
			stripetest.Subscription{ID: "sub_b1", Customer: "cus_b", Status: "trialing", PriceID: "price_pro", Created: created, PeriodEnd: far}, "pro"),
		stripeSub(t, f, "evt_b2", "customer.subscription.updated", created+10,
			stripetest.Subscription{ID: "sub_b1", Customer: "cus_b", Status: "past_due", PriceID: "price_pro", Created: created, PeriodEnd: far}, "pro"),
		stripeSub(t, f, "evt_b3", "customer.subscription.updated", created+20,
			stripetest.Subscription{ID: "sub_b1", Customer: "cus_b", Status: "active", PriceID: "price_team", Created: created, PeriodEnd: far}, "team"),
	}
	for _, e := range events {
		if code := postStripe(t, stripe, e); code != http.StatusOK {
			t.Fatalf("stripe answered %d", code)
		}
	}

	same := func() bool { return cmp.Equal(viewCopy(t, pool), app.copy()) }
	waitFor(t, "the app's copy to match customer_access", same)
	// Before the add-on ends (unless a loaded machine took until then).
	if time.Now().Add(500 * time.Millisecond).Before(soon) {
		if got := app.copy()["cus_a"]; len(got) != 2 || !got[1].HasAccess || len(got[1].Features) != 3 {
			t.Fatalf("cus_a before its add-on ends: %+v; want two subscriptions with access and three features", got)
		}
	} else {
		t.Logf("the copy matched only %s before the add-on's end: its state before it is not checked", time.Until(soon))
	}
	var feed int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM changes`).Scan(&feed)

	// The add-on's access ends: no event, no change row.
	waitFor(t, "the add-on's end to reach the app", func() bool {
		subs := app.copy()["cus_a"]
		return len(subs) == 2 && !subs[1].HasAccess
	})
	if diff := cmp.Diff(viewCopy(t, pool), app.copy()); diff != "" {
		t.Errorf("after the end of access, the app's copy differs from customer_access (-view +app):\n%s", diff)
	}
	if late := time.Since(soon); late > 60*time.Second {
		t.Errorf("the end of access reached the app %s after it passed, want within 60 s", late)
	}
	var after int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM changes`).Scan(&after)
	if after != feed {
		t.Errorf("the feed grew from %d to %d rows for an end of access", feed, after)
	}
	app.mu.Lock()
	latest := app.latest["cus_a"]
	app.mu.Unlock()
	if !latest.HasAccess {
		t.Errorf("cus_a lost access with sub_a1 still active: %+v", latest)
	}
	if n := counterValue(t, reg, "relay_access_expiries_total", "delivered"); n < 1 {
		t.Errorf("relay_access_expiries_total{outcome=delivered} = %v, want at least 1", n)
	}

	// cus_b's answers came through the relay only: in order of version.
	app.mu.Lock()
	got := slices.Clone(app.arrivals["cus_b"])
	app.mu.Unlock()
	if !slices.IsSorted(got) || len(got) == 0 {
		t.Errorf("cus_b's versions arrived as %v, want growing", got)
	}
}

// counterValue is the counter name{outcome} in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if mf.GetName() == name && l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{outcome=%q}", name, outcome)
	return 0
}

// TestBackfill: every customer's current answer goes to the app once, in
// customer order; an answer the app refuses is tried, then listed as
// failed, and the rest still go.
func TestBackfill(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	f := stripetest.LoadFixtures(t)
	stripe := stripeHandler(t, pool, false)
	created := time.Now().Unix() - 600
	far := time.Now().Add(30 * 24 * time.Hour).Unix()
	for i, c := range []string{"cus_c", "cus_a", "cus_b", "cus_refused"} {
		for j := range 2 {
			sub := fmt.Sprintf("sub_%s_%d", c, j)
			e := stripeSub(t, f, "evt_"+sub, "customer.subscription.created", created+int64(i),
				stripetest.Subscription{ID: sub, Customer: c, Status: "active", PriceID: "price_pro", Created: created, PeriodEnd: far}, "pro")
			if code := postStripe(t, stripe, e); code != http.StatusOK {
				t.Fatalf("stripe answered %d", code)
			}
		}
	}
	app, _ := newAccessApp(t)
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"cus_refused"`) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		app.serve(w, r)
	}))
	t.Cleanup(refuse.Close)
	var progress []relay.BackfillResult
	res, err := relay.Backfill(context.Background(), relay.BackfillConfig{
		App: newAppWebhook(t, refuse.URL, relay.KindAccess), Answers: access.NewStore(pool), Rate: 1000,
		Tries: 2, Wait: time.Millisecond, Progress: func(r relay.BackfillResult) { progress = append(progress, r) },
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	want := relay.BackfillResult{Customers: 4, Delivered: 3, Failed: []string{"cus_refused"}, Next: ""}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if len(progress) == 0 {
		t.Error("no progress reported")
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	var order []string
	for c, versions := range app.arrivals {
		if len(versions) != 1 {
			t.Errorf("%s got %d answers, want 1", c, len(versions))
		}
		order = append(order, c)
	}
	slices.Sort(order)
	if diff := cmp.Diff([]string{"cus_a", "cus_b", "cus_c"}, order); diff != "" {
		t.Errorf("customers answered (-want +got):\n%s", diff)
	}
	var last int64
	for _, c := range order {
		if v := app.latest[c].Version; v <= last || len(app.latest[c].Subscriptions) != 2 {
			t.Errorf("%s: version %d after %d, %d subscriptions: want sent in customer order, whole", c, v, last, len(app.latest[c].Subscriptions))
		} else {
			last = v
		}
	}
}

// TestExpiryFenced: a replica that lost the relay's lease neither moves
// the mark nor goes on: its pass stops with ErrFenced.
func TestExpiryFenced(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	_, srv := newAccessApp(t)
	app := newAppWebhook(t, srv.URL, relay.KindAccess)
	ex := relay.NewExpiry(relay.ExpiryConfig{Pool: pool, App: app, Answers: access.NewStore(pool), Every: time.Millisecond})
	lost := func(context.Context, pgx.Tx) error { return errors.New("lease lost") }
	done := make(chan error, 1)
	go func() { done <- ex.Run(context.Background(), lost) }()
	select {
	case err := <-done:
		if !errors.Is(err, relay.ErrFenced) {
			t.Errorf("Run = %v, want ErrFenced", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run went on without the lease")
	}
	var n int
	_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM access_expiry`).Scan(&n)
	if n != 0 {
		t.Errorf("access_expiry has %d rows written without the lease, want 0", n)
	}
}

// TestAccessChangedInOrderPerCustomer: the changes of one customer's
// several subscriptions, session and features reach a slow app one at a
// time, each answer's version above the one before, while another
// customer's go beside them.
func TestAccessChangedInOrderPerCustomer(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	f := stripetest.LoadFixtures(t)
	stripe := stripeHandler(t, pool, false)
	app, _ := newAccessApp(t)
	var mu sync.Mutex
	inFlight, most := map[string]int{}, map[string]int{}
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct{ Data access.Answer }
		_ = json.Unmarshal(body, &msg)
		c := msg.Data.StripeCustomerID
		mu.Lock()
		inFlight[c]++
		most[c] = max(most[c], inFlight[c])
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		app.serve(w, r)
		mu.Lock()
		inFlight[c]--
		mu.Unlock()
	}))
	t.Cleanup(slow.Close)
	accessRelay(t, pool, slow.URL)

	created := time.Now().Unix() - 600
	far := time.Now().Add(30 * 24 * time.Hour).Unix()
	var events [][]byte
	for _, c := range []string{"cus_one", "cus_two"} {
		for j := range 4 {
			sub := fmt.Sprintf("sub_%s_%d", c, j)
			events = append(events, stripeSub(t, f, "evt_"+sub, "customer.subscription.created", created+int64(j),
				stripetest.Subscription{ID: sub, Customer: c, Status: "active", PriceID: "price_pro", Created: created, PeriodEnd: far}, "pro"),
				checkoutCompleted(t, "evt_cs_"+sub, "cs_"+sub, c, sub, "user_"+c, created+int64(j)))
		}
		events = append(events, featuresUpdated(t, "evt_f_"+c, c, created+10))
	}
	for _, e := range events {
		if code := postStripe(t, stripe, e); code != http.StatusOK {
			t.Fatalf("stripe answered %d", code)
		}
	}
	// The first answer of each customer may already hold all its changes:
	// wait for every delivery, not just for the copy.
	waitFor(t, "every change delivered", func() bool {
		delivered := 0
		_ = relay.List(context.Background(), pool, relay.AppAccessConsumer, relay.Delivered, func(relay.Delivery) error { delivered++; return nil })
		return delivered == len(events)
	})
	if diff := cmp.Diff(viewCopy(t, pool), app.copy()); diff != "" {
		t.Errorf("the app's copy differs from customer_access (-view +app):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	app.mu.Lock()
	defer app.mu.Unlock()
	for _, c := range []string{"cus_one", "cus_two"} {
		if most[c] != 1 {
			t.Errorf("%s: %d answers in flight at once, want 1", c, most[c])
		}
		if got := app.arrivals[c]; len(got) < 2 || !slices.IsSorted(got) {
			t.Errorf("%s: versions arrived as %v, want several, growing", c, got)
		}
	}
}

// TestExpiryRetriesAndPasses: an end of access the app cannot take now
// (503) stops the pass and is sent at the next; one it refuses for good
// (400) is counted and passed; each is sent once it is taken, and a pass
// after them sends nothing again.
func TestExpiryRetriesAndPasses(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	f := stripetest.LoadFixtures(t)
	stripe := stripeHandler(t, pool, false)
	created := time.Now().Unix() - 600
	far := time.Now().Add(30 * 24 * time.Hour).Unix()
	for _, c := range []string{"cus_x", "cus_y", "cus_z"} {
		e := stripeSub(t, f, "evt_"+c, "customer.subscription.created", created,
			stripetest.Subscription{ID: "sub_" + c, Customer: c, Status: "active", PriceID: "price_pro", Created: created, PeriodEnd: far}, "pro")
		if code := postStripe(t, stripe, e); code != http.StatusOK {
			t.Fatalf("stripe answered %d", code)
		}
	}
	var mu sync.Mutex
	taken := map[string]int{}
	tries := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct{ Data access.Answer }
		_ = json.Unmarshal(body, &msg)
		c := msg.Data.StripeCustomerID
		mu.Lock()
		defer mu.Unlock()
		tries[c]++
		switch {
		case c == "cus_y":
			w.WriteHeader(http.StatusBadRequest)
		case c == "cus_x" && tries[c] == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			taken[c]++
		}
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	ex := relay.NewExpiry(relay.ExpiryConfig{Pool: pool, App: newAppWebhook(t, srv.URL, relay.KindAccess),
		Answers: access.NewStore(pool), Registerer: reg})
	if err := ex.Pass(ctx, nil); err != nil { // places the mark at now
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE entitlements SET access_ends_at = now() + CASE stripe_customer_id
        WHEN 'cus_x' THEN interval '300 ms' WHEN 'cus_y' THEN interval '400 ms' ELSE interval '500 ms' END`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond)
	if err := ex.Pass(ctx, nil); err == nil {
		t.Error("a pass whose first send met a 503 returned nil, want its error")
	}
	if err := ex.Pass(ctx, nil); err != nil {
		t.Errorf("the next pass: %v", err)
	}
	if err := ex.Pass(ctx, nil); err != nil {
		t.Errorf("a pass with nothing new: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(map[string]int{"cus_x": 1, "cus_z": 1}, taken); diff != "" {
		t.Errorf("answers the app took (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"cus_x": 2, "cus_y": 1, "cus_z": 1}, tries); diff != "" {
		t.Errorf("sends (-want +got):\n%s", diff)
	}
	if d, f := counterValue(t, reg, "relay_access_expiries_total", "delivered"), counterValue(t, reg, "relay_access_expiries_total", "failed"); d != 2 || f != 2 {
		t.Errorf("relay_access_expiries_total delivered %v, failed %v; want 2 and 2", d, f)
	}
}
