// Package stripetest is test support: a fake of the few Stripe API routes
// the service calls (retrieve and list subscriptions, list a subscription's
// items, retrieve and list events, list a customer's active entitlements),
// served by httptest (or, for make dev's stand-in, by the caller), holding
// the raw
// JSON objects a test puts in it. It answers the request shapes stripe-go
// sends, which stripetest_test.go checks against stripe-mock, paginates
// and filters as Stripe documents, fails on demand and counts calls.
// Subscriptions and their items are answered in the version the request's
// Stripe-Version names (Render); events as they were added, since Stripe
// never re-renders an event's data.
package stripetest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Key is an API key the fake accepts; any non-empty bearer token does.
const Key = "sk_test_stripetest"

// Routes, as counted by Calls.
const (
	RetrieveEvent          = "GET /v1/events/{id}"
	RetrieveSubscription   = "GET /v1/subscriptions/{id}"
	ListSubscriptions      = "GET /v1/subscriptions"
	ListSubscriptionItems  = "GET /v1/subscription_items"
	ListEvents             = "GET /v1/events"
	ListActiveEntitlements = "GET /v1/entitlements/active_entitlements"
)

// API is a fake Stripe API. Its methods are safe for concurrent use.
type API struct {
	srv     *httptest.Server // nil when the caller serves Handler
	handler http.Handler

	mu            sync.Mutex
	subscriptions []object            // in the order put; listed newest created first
	events        []object            // in the order added; listed newest created first
	entitlements  map[string][]object // customer -> active entitlements
	failures      []int               // statuses of the next answers
	calls         map[string]int
	onCall        func(route string, n int)
}

// object is one stored JSON object and the fields the fake filters on.
type object struct {
	ID        string          `json:"id"`
	Created   int64           `json:"created"`
	Status    string          `json:"status"` // subscriptions
	Type      string          `json:"type"`   // events
	delivered bool            // events: every webhook delivery succeeded
	raw       json.RawMessage // subscriptions: with every item; answers embed the first page
}

// New starts a fake API, closed in t.Cleanup.
func New(t testing.TB) *API {
	t.Helper()
	a := NewUnstarted()
	a.srv = httptest.NewServer(a.handler)
	t.Cleanup(a.srv.Close)
	return a
}

// NewUnstarted returns a fake API that the caller serves (Handler), for a
// program rather than a test: tools/devstripe, make dev's stand-in.
func NewUnstarted() *API {
	a := &API{entitlements: map[string][]object{}, calls: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/events/{id}", a.route(RetrieveEvent, a.retrieveEvent))
	mux.HandleFunc("GET /v1/subscriptions/{id}", a.route(RetrieveSubscription, a.retrieveSubscription))
	mux.HandleFunc("GET /v1/subscriptions", a.route(ListSubscriptions, a.listSubscriptions))
	mux.HandleFunc("GET /v1/subscription_items", a.route(ListSubscriptionItems, a.listSubscriptionItems))
	mux.HandleFunc("GET /v1/events", a.route(ListEvents, a.listEvents))
	mux.HandleFunc("GET /v1/entitlements/active_entitlements", a.route(ListActiveEntitlements, a.listActiveEntitlements))
	a.handler = mux
	return a
}

// Handler answers the API's routes; New serves it on a test server.
func (a *API) Handler() http.Handler { return a.handler }

// URL is the base URL to give stripe-go (STRIPE_API_URL), for an API
// started by New.
func (a *API) URL() *url.URL {
	u, _ := url.Parse(a.srv.URL) // httptest's own URL
	return u
}

// PutSubscription stores a subscription object with all its items,
// replacing the one with the same id, in any version's shape. Answers
// render it in the requested version (Render), embed its items as Stripe
// does (Embed), and list them all on GET /v1/subscription_items.
func (a *API) PutSubscription(raw []byte) {
	Render(raw, Basil) // panics here, not in an answer, on what is not a subscription
	o := decode(raw)
	a.mu.Lock()
	defer a.mu.Unlock()
	if i := slices.IndexFunc(a.subscriptions, func(s object) bool { return s.ID == o.ID }); i >= 0 {
		a.subscriptions[i] = o
		return
	}
	a.subscriptions = append(a.subscriptions, o)
}

// AddEvent stores an event object. delivered says whether every webhook
// delivery of it succeeded (the delivery_success filter).
func (a *API) AddEvent(raw []byte, delivered bool) {
	o := decode(raw)
	o.delivered = delivered
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, o)
}

// SetActiveEntitlements replaces a customer's active entitlements with the
// given entitlements.active_entitlement objects.
func (a *API) SetActiveEntitlements(customer string, raws ...[]byte) {
	objs := make([]object, len(raws))
	for i, r := range raws {
		objs[i] = decode(r)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.entitlements[customer] = objs
}

// FailNext makes the next n requests, on any route, answer status (500,
// 429, ...) with a Stripe error body. A 429 is Stripe's rate limit.
func (a *API) FailNext(n, status int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for range n {
		a.failures = append(a.failures, status)
	}
}

// OnCall sets a function called before each request is answered, with the
// route and its count so far (1 for the first). A test uses it to change
// Stripe's state, or deliver a webhook, in the middle of a listing.
func (a *API) OnCall(f func(route string, n int)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.onCall = f
}

// Calls is the number of requests made to route, failed ones included.
func (a *API) Calls(route string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[route]
}

// TotalCalls is the number of requests made to every route.
func (a *API) TotalCalls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.calls {
		n += c
	}
	return n
}

func decode(raw []byte) object {
	var o object
	if err := json.Unmarshal(raw, &o); err != nil || o.ID == "" {
		panic(fmt.Sprintf("stripetest: not a Stripe object with an id: %.80s", raw))
	}
	o.raw = json.RawMessage(slices.Clone(raw))
	return o
}

// route counts the call, runs the hook, checks the key, serves a queued
// failure if any, and otherwise the handler.
func (a *API) route(name string, h func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.calls[name]++
		n, hook := a.calls[name], a.onCall
		a.mu.Unlock()
		if hook != nil {
			hook(name, n)
		}
		if key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); !ok || key == "" {
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "", "You did not provide an API key.")
			return
		}
		a.mu.Lock()
		status := 0
		if len(a.failures) > 0 {
			status, a.failures = a.failures[0], a.failures[1:]
		}
		a.mu.Unlock()
		switch {
		case status == http.StatusTooManyRequests:
			writeError(w, status, "invalid_request_error", "rate_limit", "Too many requests hit the API too quickly.")
		case status != 0:
			writeError(w, status, "api_error", "", "stripetest: failure on demand")
		default:
			h(w, r)
		}
	}
}

func (a *API) retrieveEvent(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := r.PathValue("id")
	i := slices.IndexFunc(a.events, func(e object) bool { return e.ID == id })
	if i < 0 {
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "No such event: '"+id+"'")
		return
	}
	writeJSON(w, a.events[i].raw)
}

func (a *API) retrieveSubscription(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.subscription(w, r.PathValue("id")); ok {
		writeJSON(w, Embed(Render(s.raw, r.Header.Get("Stripe-Version"))))
	}
}

// subscription finds a stored subscription, or answers Stripe's 404. The
// caller holds a.mu.
func (a *API) subscription(w http.ResponseWriter, id string) (object, bool) {
	i := slices.IndexFunc(a.subscriptions, func(s object) bool { return s.ID == id })
	if i < 0 {
		writeError(w, http.StatusNotFound, "invalid_request_error", "resource_missing", "No such subscription: '"+id+"'")
		return object{}, false
	}
	return a.subscriptions[i], true
}

// required reads a query parameter Stripe requires, or answers its 400.
func required(w http.ResponseWriter, r *http.Request, name string) (string, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_missing", "Missing required param: "+name+".")
	}
	return v, v != ""
}

// listSubscriptions filters by status as Stripe documents it: no status
// lists every subscription that is not canceled; "all" lists every one;
// "ended" the canceled and incomplete_expired ones.
func (a *API) listSubscriptions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	status := q.Get("status")
	keep := func(s object) bool {
		switch status {
		case "":
			return s.Status != "canceled"
		case "all":
			return true
		case "ended":
			return s.Status == "canceled" || s.Status == "incomplete_expired"
		}
		return s.Status == status
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	version := r.Header.Get("Stripe-Version")
	a.writeList(w, r, "/v1/subscriptions", newestFirst(a.subscriptions, keep), func(raw []byte) []byte {
		return Embed(Render(raw, version))
	})
}

// listSubscriptionItems lists a subscription's items in their order;
// Stripe requires the subscription.
func (a *API) listSubscriptionItems(w http.ResponseWriter, r *http.Request) {
	id, ok := required(w, r, "subscription")
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.subscription(w, id); ok {
		a.writeList(w, r, "/v1/subscription_items", renderItems(s.raw, r.Header.Get("Stripe-Version")), asStored)
	}
}

// listEvents filters by type (types[] or type), created[gte|gt|lte|lt] and
// delivery_success, and lists newest first, as Stripe does.
func (a *API) listEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var types []string
	for k, vs := range q {
		if k == "type" || strings.HasPrefix(k, "types[") {
			types = append(types, vs...)
		}
	}
	created, err := createdFilter(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", err.Error())
		return
	}
	delivery := q.Get("delivery_success")
	keep := func(e object) bool {
		return (len(types) == 0 || slices.Contains(types, e.Type)) &&
			created(e.Created) &&
			(delivery == "" || strconv.FormatBool(e.delivered) == delivery)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writeList(w, r, "/v1/events", newestFirst(a.events, keep), asStored)
}

func (a *API) listActiveEntitlements(w http.ResponseWriter, r *http.Request) {
	customer, ok := required(w, r, "customer")
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writeList(w, r, "/v1/entitlements/active_entitlements", a.entitlements[customer], asStored)
}

// createdFilter reads created[gte], [gt], [lte], [lt] and a plain created.
func createdFilter(q url.Values) (func(int64) bool, error) {
	bounds := map[string]func(c, v int64) bool{
		"created":      func(c, v int64) bool { return c == v },
		"created[gte]": func(c, v int64) bool { return c >= v },
		"created[gt]":  func(c, v int64) bool { return c > v },
		"created[lte]": func(c, v int64) bool { return c <= v },
		"created[lt]":  func(c, v int64) bool { return c < v },
	}
	var tests []func(int64) bool
	for k, match := range bounds {
		if s := q.Get(k); s != "" {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("invalid integer: %s", s)
			}
			tests = append(tests, func(c int64) bool { return match(c, v) })
		}
	}
	return func(c int64) bool {
		for _, t := range tests {
			if !t(c) {
				return false
			}
		}
		return true
	}, nil
}

// newestFirst is Stripe's list order: created descending, the later added
// first within one second.
func newestFirst(objs []object, keep func(object) bool) []object {
	var out []object
	for i := len(objs) - 1; i >= 0; i-- {
		if keep(objs[i]) {
			out = append(out, objs[i])
		}
	}
	slices.SortStableFunc(out, func(x, y object) int { return cmp.Compare(y.Created, x.Created) })
	return out
}

// asStored answers an object as it was put: an event (Stripe never
// re-renders one), an item already rendered, an entitlement.
func asStored(raw []byte) []byte { return raw }

// writeList answers one page of objs, each rendered by render (only the
// page's: a listing of many pages stays linear), with Stripe's cursor
// pagination: limit (1 to 100, default 10), starting_after (the objects
// after that id) or ending_before (the objects just before it, still in
// list order).
func (a *API) writeList(w http.ResponseWriter, r *http.Request, path string, objs []object, render func([]byte) []byte) {
	q := r.URL.Query()
	limit := 10
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid_integer", "limit must be an integer from 1 to 100")
			return
		}
		limit = n
	}
	cursor := func(id string) (int, bool) {
		i := slices.IndexFunc(objs, func(o object) bool { return o.ID == id })
		if i < 0 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "resource_missing", "No such object: '"+id+"'")
		}
		return i, i >= 0
	}
	var page []object
	var more bool
	switch after, before := q.Get("starting_after"), q.Get("ending_before"); {
	case after != "":
		i, ok := cursor(after)
		if !ok {
			return
		}
		rest := objs[i+1:]
		page, more = rest[:min(limit, len(rest))], len(rest) > limit
	case before != "":
		i, ok := cursor(before)
		if !ok {
			return
		}
		page, more = objs[max(0, i-limit):i], i > limit
	default:
		page, more = objs[:min(limit, len(objs))], len(objs) > limit
	}
	data := make([]json.RawMessage, len(page))
	for i, o := range page {
		data[i] = render(o.raw)
	}
	body, _ := json.Marshal(map[string]any{"object": "list", "url": path, "has_more": more, "data": data})
	writeJSON(w, body)
}

func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_stripetest")
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	e := map[string]string{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	body, _ := json.Marshal(map[string]any{"error": e})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
