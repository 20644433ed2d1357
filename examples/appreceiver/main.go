// Command appreceiver is an example app receiving munchable-webhooks'
// webhooks (docs/APP.md): it verifies each with the Standard Webhooks
// library (svix-webhooks' Go package), handles each webhook-id once, and
// answers "may this customer use this?" from the payloads alone, without
// the service's database.
//
//	APP_WEBHOOK_SECRET=whsec_... appreceiver [-addr 127.0.0.1:8090]
//
//	POST /hooks                          the webhooks (APP_WEBHOOK_URL=http://127.0.0.1:8090/hooks)
//	GET  /access?customer=cus_...&key=pro
//	GET  /access?user=42&key=pro         user: the client_reference_id the app gave Checkout
//
// It keeps everything in memory, so it forgets on restart: a real app keeps
// its state, and the webhook-ids it has handled, in its own database, the
// id written in the same transaction as what the webhook changed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	svix "github.com/svix/svix-webhooks/go"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "appreceiver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	flags := flag.NewFlagSet("appreceiver", flag.ContinueOnError)
	addr := flags.String("addr", "127.0.0.1:8090", "listen address")
	if err := flags.Parse(args); err != nil {
		return err
	}
	secret := getenv("APP_WEBHOOK_SECRET")
	if secret == "" {
		return errors.New("APP_WEBHOOK_SECRET is required: the service's whsec_... secret")
	}
	wh, err := svix.NewWebhook(secret)
	if err != nil {
		return errors.New("APP_WEBHOOK_SECRET is invalid: want whsec_ and base64")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: *addr, Handler: newApp(wh, time.Now, stdout).routes(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(stdout, "appreceiver: listening on http://%s/hooks\n", *addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// webhook is the body the service sends: {"type", "timestamp", "data"},
// data being one row of its change feed.
type webhook struct {
	Type string `json:"type"`
	Data struct {
		ID               int64                      `json:"id"`
		Kind             string                     `json:"kind"`
		Subject          string                     `json:"subject"`
		StripeCustomerID *string                    `json:"stripe_customer_id"`
		Before           json.RawMessage            `json:"before"`
		After            map[string]json.RawMessage `json:"after"`
	} `json:"data"`
}

// record is what the app knows of one row of the service (a subscription,
// a checkout session, a customer's features): the fields of its changes
// merged. A change holds only the fields that moved, and all of them only
// when the row is new (before is null): whole says the app saw that first
// change, so that a field it lacks is null, not unknown.
//
// The service sends one row's changes in order, but a change that went
// dead (the app refused it) and was retried by hand arrives after later
// ones: each field keeps the id of the change that set it, and an older
// change does not overwrite a newer one's value.
type record struct {
	fields map[string]json.RawMessage
	setBy  map[string]int64 // change id per field
	whole  bool
	// customer is the change's stripe_customer_id, which every change
	// carries, whatever fields moved.
	customer string
}

func (r *record) merge(id int64, customer *string, before json.RawMessage, after map[string]json.RawMessage) {
	if r.fields == nil {
		r.fields, r.setBy = map[string]json.RawMessage{}, map[string]int64{}
	}
	if customer != nil {
		r.customer = *customer
	}
	if string(before) == "null" || len(before) == 0 {
		r.whole = true
	}
	for k, v := range after {
		if id > r.setBy[k] {
			r.fields[k], r.setBy[k] = v, id
		}
	}
}

// str reads a string field; ok is false when the field is unknown.
func (r *record) str(k string) (s string, ok bool) {
	v, seen := r.fields[k]
	if !seen {
		return "", r.whole
	}
	_ = json.Unmarshal(v, &s) // null stays ""
	return s, true
}

type app struct {
	wh     *svix.Webhook
	now    func() time.Time
	stdout io.Writer

	mu            sync.Mutex
	handled       map[string]bool    // webhook-ids
	subscriptions map[string]*record // by subscription id
	sessions      map[string]*record // checkout sessions, by id
	features      map[string]*record // by customer
}

func newApp(wh *svix.Webhook, now func() time.Time, stdout io.Writer) *app {
	return &app{wh: wh, now: now, stdout: stdout, handled: map[string]bool{},
		subscriptions: map[string]*record{}, sessions: map[string]*record{}, features: map[string]*record{}}
}

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks", a.receive)
	mux.HandleFunc("GET /access", a.access)
	return mux
}

// receive verifies, dedupes and applies one webhook. A 2xx tells the
// service it is handled; anything else makes it retry later, the same
// webhook-id, so an error here loses nothing. A bad signature is a 4xx:
// the service does not retry it (fix the secret, then relay retry).
func (a *app) receive(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, "body too large or cut short", http.StatusRequestEntityTooLarge)
		return
	}
	// Verify the raw bytes before decoding anything; Verify also refuses a
	// webhook-timestamp more than 5 minutes off (a replay).
	if err := a.wh.Verify(body, r.Header); err != nil {
		http.Error(w, "signature: "+err.Error(), http.StatusUnauthorized)
		return
	}
	var hook webhook
	if err := json.Unmarshal(body, &hook); err != nil {
		http.Error(w, "not a change", http.StatusBadRequest)
		return
	}
	id := r.Header.Get("webhook-id")
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handled[id] {
		w.WriteHeader(http.StatusNoContent) // handled before: say so again, change nothing
		return
	}
	a.apply(hook)
	a.handled[id] = true // with the change it made, under one lock (a real app: one transaction)
	fmt.Fprintf(a.stdout, "appreceiver: %s %s %s\n", id, hook.Type, hook.Data.Subject)
	w.WriteHeader(http.StatusNoContent)
}

func (a *app) apply(hook webhook) {
	d := hook.Data
	var into map[string]*record
	switch hook.Type {
	case "subscription.changed":
		into = a.subscriptions
	case "checkout_session.changed":
		into = a.sessions
	case "customer_features.changed":
		into = a.features
	default: // support_message.changed and kinds to come: not this app's business
		return
	}
	rec := into[d.Subject]
	if rec == nil {
		rec = &record{}
		into[d.Subject] = rec
	}
	rec.merge(d.ID, d.StripeCustomerID, d.Before, d.After)
}

// subscriptionAccess is one subscription's answer.
type subscriptionAccess struct {
	ID              string   `json:"id"`
	Status          string   `json:"status"`
	AccessEndsAt    *string  `json:"access_ends_at"`
	HasAccess       bool     `json:"has_access"`
	PriceLookupKeys []string `json:"price_lookup_keys"`
	// Known is false when the app joined after the subscription began and
	// has not yet seen the fields the answer needs.
	Known bool `json:"known"`
}

// access answers as the service's customer_access view would: a
// subscription gives access while its status is active or trialing and
// access_ends_at is null or ahead; key is granted by such a subscription's
// price lookup keys or by the customer's features.
func (a *app) access(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a.mu.Lock()
	defer a.mu.Unlock()
	customers := a.customersOf(q.Get("customer"), q.Get("user"))
	answer := struct {
		Customers     []string             `json:"customers"`
		Subscriptions []subscriptionAccess `json:"subscriptions"`
		Features      []string             `json:"features"`
		HasAccess     bool                 `json:"has_access"`
		Key           string               `json:"key,omitempty"`
		MayUse        bool                 `json:"may_use"`
	}{Customers: customers, Subscriptions: []subscriptionAccess{}, Features: []string{}, Key: q.Get("key")}
	for _, c := range customers {
		if f := a.features[c]; f != nil {
			var keys []string
			_ = json.Unmarshal(f.fields["lookup_keys"], &keys)
			answer.Features = append(answer.Features, keys...)
		}
	}
	for _, id := range sortedKeys(a.subscriptions) {
		s := a.subscriptions[id]
		if !slices.Contains(customers, s.customer) {
			continue
		}
		sa := a.subscriptionAccess(id, s)
		answer.Subscriptions = append(answer.Subscriptions, sa)
		answer.HasAccess = answer.HasAccess || sa.HasAccess
		if sa.HasAccess && answer.Key != "" && (slices.Contains(sa.PriceLookupKeys, answer.Key) || slices.Contains(answer.Features, answer.Key)) {
			answer.MayUse = true
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(answer)
}

func (a *app) subscriptionAccess(id string, s *record) subscriptionAccess {
	status, knowStatus := s.str("status")
	ends, knowEnds := s.str("access_ends_at")
	sa := subscriptionAccess{ID: id, Status: status, Known: knowStatus && knowEnds, PriceLookupKeys: []string{}}
	if ends != "" {
		sa.AccessEndsAt = &ends
	}
	var items []struct {
		PriceLookupKey *string `json:"price_lookup_key"`
	}
	_ = json.Unmarshal(s.fields["items"], &items)
	for _, it := range items {
		if it.PriceLookupKey != nil {
			sa.PriceLookupKeys = append(sa.PriceLookupKeys, *it.PriceLookupKey)
		}
	}
	endsAhead := true
	if ends != "" {
		t, err := time.Parse(time.RFC3339, ends)
		endsAhead = err == nil && t.After(a.now())
	}
	sa.HasAccess = (status == "active" || status == "trialing") && endsAhead
	return sa
}

// customersOf is the customer asked for, or the customers of the app's
// user: those of its completed checkout sessions.
func (a *app) customersOf(customer, user string) []string {
	if customer != "" {
		return []string{customer}
	}
	out := []string{}
	for _, id := range sortedKeys(a.sessions) {
		s := a.sessions[id]
		ref, _ := s.str("client_reference_id")
		status, _ := s.str("status")
		if user != "" && ref == user && status == "complete" && s.customer != "" && !slices.Contains(out, s.customer) {
			out = append(out, s.customer)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
