package stripehook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// Invariant 2 over Stripe's one-second created, proven by enumeration:
// sequences of two to four changes made to one subscription (or one
// customer's features, or one checkout session) in one second, each
// delivered in every order, after a customer.subscription.created of that
// second, after an event of an earlier second, or first; with and without
// an API to ask. After the last delivery the stored row is Stripe's final
// state, or, without an API, an event that could not be placed was
// counted unordered. Never a silent wrong row.
//
// Every event is built from the real Stripe objects kept in
// testdata/stripe/api (stripetest.Fixtures: subscription.json, event.json,
// active_entitlement.json) and testdata/stripe's checkout and summary
// events, with data.previous_attributes as Stripe writes it: the prior
// value of each attribute the change touched, a list (items) given whole.
// Events are decoded by the receiver and written through the store, as
// the webhook does after its claim.

// secondT is the one second every change of a sequence happens in.
const secondT = int64(1764590400) // 2025-12-01T12:00:00Z

// subModel is what a change moves: the fields a plan change, a seat
// change, a dunning status, a scheduled cancellation and an add-on touch.
type subModel struct {
	price  string // the base item's price
	qty    int64  // the base item's quantity
	status string
	cancel bool // cancel_at_period_end (with cancel_at and canceled_at)
	addon  bool // a second item
}

// field is one of subModel's, as a change of a sequence names it.
type field int

const (
	fPrice field = iota
	fQuantity
	fStatus
	fCancel
	fItems
	nFields
)

func (f field) String() string {
	return [...]string{"price", "quantity", "status", "cancel_at_period_end", "items"}[f]
}

// step is one change: the field, and for price and quantity whether it
// goes back to the value before its last change (an undo) or on to a
// third one. The other fields have two values: every change is an undo of
// the last.
type step struct {
	f    field
	undo bool
}

var prices = []string{"price_basic", "price_pro", "price_team"}

// apply is m after s; last remembers each field's value before its last
// change, for an undo.
func (m subModel) apply(s step, last map[field]any) subModel {
	switch s.f {
	case fPrice:
		next := prices[(slices.Index(prices, m.price)+1)%len(prices)]
		if prev, ok := last[fPrice]; ok && s.undo {
			next = prev.(string)
		}
		last[fPrice], m.price = m.price, next
	case fQuantity:
		next := m.qty%3 + 1
		if prev, ok := last[fQuantity]; ok && s.undo {
			next = prev.(int64)
		}
		last[fQuantity], m.qty = m.qty, next
	case fStatus:
		m.status = map[string]string{"active": "past_due", "past_due": "active"}[m.status]
	case fCancel:
		m.cancel = !m.cancel
	case fItems:
		m.addon = !m.addon
	}
	return m
}

// patterns are the restricted growth strings of length n: every way n
// changes can touch fields, up to which fields they are (0 is the first
// field touched, 1 the next new one, ...). Equal states in a sequence, all
// the same-second rule can see, depend only on this pattern and the undos.
func patterns(n int) [][]int {
	var out [][]int
	var grow func(p []int, top int)
	grow = func(p []int, top int) {
		if len(p) == n {
			out = append(out, slices.Clone(p))
			return
		}
		for v := 0; v <= top+1; v++ {
			grow(append(p, v), max(top, v))
		}
	}
	grow([]int{0}, 0)
	return out
}

// sequences is every sequence the enumeration checks: each pattern of two
// to four changes, its labels given fields in turn so that every field is
// changed, and, up to three changes, each repeat of price or quantity both
// as an undo and as a move on to a third value (a move on makes states as
// distinct as a change of another field does, which the four-change
// patterns already cover).
func sequences() [][]step {
	var out [][]step
	rot := 0
	for n := 2; n <= 4; n++ {
		for _, p := range patterns(n) {
			rot++
			fieldOf := func(label int) field { return field((label + rot) % int(nFields)) }
			// repeats: positions of changes to a three-valued field
			// already changed, each of which may undo or move on.
			var repeats []int
			seen := map[int]bool{}
			for i, l := range p {
				if f := fieldOf(l); seen[l] && (f == fPrice || f == fQuantity) {
					repeats = append(repeats, i)
				}
				seen[l] = true
			}
			if n == 4 {
				repeats = nil
			}
			for mask := 0; mask < 1<<len(repeats); mask++ {
				seq := make([]step, n)
				for i, l := range p {
					seq[i] = step{f: fieldOf(l), undo: true}
				}
				for j, i := range repeats {
					seq[i].undo = mask&(1<<j) == 0
				}
				out = append(out, seq)
			}
		}
	}
	return out
}

// permutations is every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// subObject is m as a Stripe subscription object: the fixture's, with the
// base item (and the add-on) set as m says.
func subObject(fx stripetest.Fixtures, id string, m subModel) []byte {
	s := stripetest.Subscription{ID: id, Customer: "cus_" + id, Status: m.status, PriceID: m.price,
		Created: secondT - 86400, PeriodEnd: secondT + 30*86400, CancelAtPeriodEnd: m.cancel}
	if m.addon {
		s.More = []stripetest.Item{{ID: "si_addon_" + id, PriceID: "price_addon", PeriodEnd: secondT + 30*86400}}
	}
	var obj map[string]any
	if err := json.Unmarshal(fx.Subscription(s), &obj); err != nil {
		panic(err)
	}
	obj["items"].(map[string]any)["data"].([]any)[0].(map[string]any)["quantity"] = m.qty
	if m.cancel {
		// As Stripe schedules it: cancel_at the period's end, canceled_at
		// the request (https://docs.stripe.com/api/subscriptions/object#subscription_object-canceled_at).
		obj["cancel_at"], obj["canceled_at"] = secondT+30*86400, secondT
	}
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return b
}

// previous is data.previous_attributes of the change from a to b: the
// prior value of every top-level attribute that differs, items whole.
func previous(before, after []byte) map[string]any {
	var a, b map[string]any
	if err := json.Unmarshal(before, &a); err != nil {
		panic(err)
	}
	if err := json.Unmarshal(after, &b); err != nil {
		panic(err)
	}
	out := map[string]any{}
	for k, v := range a {
		if x, _ := json.Marshal(v); string(x) != string(mustJSON(b[k])) {
			out[k] = v
		}
	}
	return out
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// enumRig delivers events straight to the store through the receiver's
// decoding, one receiver per run so that each run's counters are its own.
type enumRig struct {
	pool *pgxpool.Pool
	api  *stripetest.API
	fx   stripetest.Fixtures
}

// runResult is what one run of one order saw.
type runResult struct {
	verdicts  []entitlements.Verdict
	unordered float64 // entitlements_unordered_events_total
}

// deliver decodes each event and applies it, in order, with a receiver of
// its own (with the fake API when withAPI).
func (g enumRig) deliver(ctx context.Context, withAPI bool, events [][]byte) (runResult, error) {
	reg := prometheus.NewRegistry()
	cfg := Config{Store: entitlements.NewStore(g.pool, reg), Registerer: reg}
	if withAPI {
		cfg.API = NewAPI(stripetest.Key, g.api.URL(), nil, nil)
	}
	r := New(cfg)
	var out runResult
	for _, raw := range events {
		var h head
		if err := json.Unmarshal(raw, &h); err != nil {
			return out, err
		}
		at, err := created(h.Created, time.Now())
		if err != nil {
			return out, err
		}
		var apply applyFunc
		switch kindOf(h.Type) {
		case kindSubscription:
			apply, err = r.subscriptionEvent(h, at)
		case kindFeatures:
			apply, err = r.featuresEvent(h, at)
		case kindCheckout:
			apply, err = r.checkoutEvent(h, at)
		}
		if err != nil {
			return out, err
		}
		res, err := apply(ctx)
		if err != nil {
			return out, fmt.Errorf("%s: %w", h.ID, err)
		}
		out.verdicts = append(out.verdicts, res.Verdict)
	}
	families, err := reg.Gather()
	if err != nil {
		return out, err
	}
	for _, f := range families {
		if f.GetName() == "entitlements_unordered_events_total" {
			out.unordered = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return out, nil
}

// placeholder stands for a run's subscription id in the objects and events
// built once per sequence.
const placeholder = "sub_PLACEHOLDER"

// withID is raw with the placeholder replaced by id.
func withID(raw []byte, id string) []byte {
	return bytes.ReplaceAll(raw, []byte(placeholder), []byte(id))
}

// tally counts what the enumeration checked.
type tally struct {
	sequences, orders, runs     atomic.Int64
	unorderedRuns, apiRuns      atomic.Int64
	apiCalls, deliveries, wrong atomic.Int64

	mu sync.Mutex
	// by counts runs by changes, prefix and API: runs, runs that ended
	// with an event counted unordered, runs that asked Stripe, and the
	// states read from Stripe.
	by map[string]*[4]int
}

func (c *tally) log(t *testing.T, what string) {
	t.Logf("%s: %d sequences, %d orders, %d runs (orders x prefixes x with/without API), %d deliveries; "+
		"without API %d runs ended with an event counted unordered; with API %d runs asked Stripe (%d calls)",
		what, c.sequences.Load(), c.orders.Load(), c.runs.Load(), c.deliveries.Load(),
		c.unorderedRuns.Load(), c.apiRuns.Load(), c.apiCalls.Load())
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := slices.Sorted(maps.Keys(c.by))
	for _, k := range keys {
		n := c.by[k]
		t.Logf("%s %s: %d runs, %d counted unordered, %d asked Stripe, %d reads", what, k, n[0], n[1], n[2], n[3])
	}
}

// work runs jobs on a few goroutines: deliveries wait on Postgres, so more
// than GOMAXPROCS keep it busy, and each run uses its own row.
func work(t *testing.T, jobs []func() error) {
	t.Helper()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	errs := make(chan error, len(jobs))
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if int(i) >= len(jobs) {
					return
				}
				if err := jobs[i](); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 20 {
			t.Error(err)
		}
	}
	if n > 20 {
		t.Errorf("... and %d more", n-20)
	}
}

func newEnumRig(t *testing.T) enumRig {
	t.Helper()
	return enumRig{pool: dbtest.NewPool(t), api: stripetest.New(t), fx: stripetest.LoadFixtures(t)}
}

// storedSub is what a run checks of the stored subscription.
func storedSub(ctx context.Context, pool *pgxpool.Pool, id string) (string, error) {
	var s string
	err := pool.QueryRow(ctx, `
SELECT concat_ws(' ', status, price_id, cancel_at_period_end, cancel_at IS NOT NULL, canceled_at IS NOT NULL,
    (SELECT string_agg(price_id || 'x' || coalesce(quantity::text, '-'), ',' ORDER BY position)
     FROM entitlement_items WHERE stripe_subscription_id = $1))
FROM entitlements WHERE stripe_subscription_id = $1`, id).Scan(&s)
	return s, err
}

func (m subModel) want() string {
	items := fmt.Sprintf("%sx%d", m.price, m.qty)
	if m.addon {
		items += ",price_addonx1"
	}
	tf := map[bool]string{true: "t", false: "f"}[m.cancel] // as Postgres prints a boolean in text
	return fmt.Sprintf("%s %s %s %s %s %s", m.status, m.price, tf, tf, tf, items)
}

func TestSameSecondEnumeration(t *testing.T) {
	t.Parallel()
	g := newEnumRig(t)
	ctx := t.Context()
	var c tally
	var jobs []func() error
	base := subModel{price: "price_basic", qty: 1, status: "active"}
	for si, seq := range sequences() {
		c.sequences.Add(1)
		states := []subModel{base}
		last := map[field]any{}
		for _, s := range seq {
			states = append(states, states[len(states)-1].apply(s, last))
		}
		// Built once per sequence under a placeholder id, which each run
		// replaces with its own: a change's event is the same in every
		// order.
		objs := make([][]byte, len(states))
		for i, m := range states {
			objs[i] = subObject(g.fx, placeholder, m)
		}
		prefixEvent := map[string][]byte{
			"created": g.fx.Event("evt_"+placeholder+"_c", "customer.subscription.created", secondT, objs[0], nil),
			"older": g.fx.Event("evt_"+placeholder+"_o", "customer.subscription.updated", secondT-60, objs[0],
				map[string]any{"status": "incomplete"}),
		}
		changes := make([][]byte, len(seq))
		for k := range seq {
			changes[k] = g.fx.Event(fmt.Sprintf("evt_%s_%d", placeholder, k), "customer.subscription.updated", secondT,
				objs[k+1], previous(objs[k], objs[k+1]))
		}
		final := states[len(states)-1]
		for oi, order := range permutations(len(seq)) {
			c.orders.Add(1)
			for _, prefix := range []string{"none", "created", "older"} {
				for _, withAPI := range []bool{false, true} {
					// Four changes, kept to what CI can afford (under
					// -race): after an event of an earlier second only. A
					// row a creation event of the second wrote is succeeded
					// like one of an earlier second, and a first event
					// that is an update leaves a past no later event of
					// its second can follow; three changes check both.
					if len(seq) == 4 && prefix != "older" {
						continue
					}
					id := fmt.Sprintf("sub_enum_%d_%d_%s_%v", si, oi, prefix, withAPI)
					var events [][]byte
					if ev, ok := prefixEvent[prefix]; ok {
						events = append(events, withID(ev, id))
					}
					for _, k := range order {
						events = append(events, withID(changes[k], id))
					}
					if withAPI {
						g.api.PutSubscription(withID(objs[len(objs)-1], id))
					}
					what := fmt.Sprintf("%v delivered %v after %s, API %v", seq, order, prefix, withAPI)
					jobs = append(jobs, func() error {
						res, err := g.deliver(ctx, withAPI, events)
						if err != nil {
							return fmt.Errorf("%s: %w", what, err)
						}
						c.runs.Add(1)
						c.deliveries.Add(int64(len(events)))
						key := fmt.Sprintf("changes=%d prefix=%s api=%v", len(seq), prefix, withAPI)
						return c.check(ctx, g.pool, id, what, key, withAPI, res, final.want(), storedSub)
					})
				}
			}
		}
	}
	work(t, jobs)
	c.apiCalls.Store(int64(g.api.Calls(stripetest.RetrieveSubscription)))
	c.log(t, "subscriptions")
}

// check is one run's verdict: Stripe's final state stored, or (without an
// API) an event counted unordered; with an API, always the final state.
func (c *tally) check(ctx context.Context, pool *pgxpool.Pool, id, what, key string, withAPI bool, res runResult,
	want string, read func(context.Context, *pgxpool.Pool, string) (string, error)) error {
	got, err := read(ctx, pool, id)
	if err != nil {
		return fmt.Errorf("%s: read: %w", what, err)
	}
	n := 0
	for _, v := range res.verdicts {
		if v == entitlements.Unordered {
			n++
		}
	}
	if res.unordered != float64(n) {
		return fmt.Errorf("%s: entitlements_unordered_events_total = %v, %d unordered verdicts", what, res.unordered, n)
	}
	if withAPI && n > 0 {
		return fmt.Errorf("%s: unordered with an API: %v", what, res.verdicts)
	}
	reads := 0
	for _, v := range res.verdicts {
		if v == entitlements.Revalidated {
			reads++
		}
	}
	if reads > 0 {
		c.apiRuns.Add(1)
	}
	if n > 0 {
		c.unorderedRuns.Add(1)
	}
	c.mu.Lock()
	if c.by == nil {
		c.by = map[string]*[4]int{}
	}
	k := c.by[key]
	if k == nil {
		k = &[4]int{}
		c.by[key] = k
	}
	k[0]++
	k[1] += min(n, 1)
	k[2] += min(reads, 1)
	k[3] += reads
	c.mu.Unlock()
	if got != want && n == 0 {
		c.wrong.Add(1)
		return fmt.Errorf("%s: silent wrong row: stored %q, Stripe has %q (verdicts %v)", what, got, want, res.verdicts)
	}
	return nil
}
