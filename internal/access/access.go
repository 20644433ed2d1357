// Package access owns the app's one question, "may this customer use
// this?", answered whole: a customer's every customer_access row, read in
// one statement from the view's indexes, as one Answer. The read API
// (GET /v1/access) and the access.changed webhooks both send it, so an
// app that does not share the database keeps the same answer the view
// gives.
//
// Version: an Answer's version is the database's clock when it was read
// (now(), in microseconds since 1970), the same instant at which the
// view computed has_access. A later read sees every commit an earlier one
// saw, and time only moves on, so an app that keeps, per customer, the
// answer with the highest version keeps the newest, whatever order
// answers arrive in. Every change that moves an answer is followed by a
// webhook read after that change committed, so the highest version an app
// holds is never older than the last change. The rule needs the
// database's clock not to step back (NTP slews it).
package access

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Subscription is one customer_access row.
type Subscription struct {
	StripeSubscriptionID string     `json:"stripe_subscription_id"`
	ClientReferenceID    *string    `json:"client_reference_id"`
	Status               string     `json:"status"`
	HasAccess            bool       `json:"has_access"`
	AccessEndsAt         *time.Time `json:"access_ends_at"`
	PriceLookupKeys      []string   `json:"price_lookup_keys"`
	Features             []string   `json:"features"`
}

// Answer is a customer's whole access answer: the data of access.changed
// and one object of GET /v1/access.
// Its JSON puts what is the same from read to read first, and version
// and at, which differ with each read, last.
type Answer struct {
	StripeCustomerID string `json:"stripe_customer_id"`
	// HasAccess is true when any subscription's is.
	HasAccess     bool           `json:"has_access"`
	Subscriptions []Subscription `json:"subscriptions"`
	// Version grows with each answer for the customer (see the package
	// comment): an app keeps the highest.
	Version int64 `json:"version"`
	// At is when the answer was read, Version's instant.
	At time.Time `json:"at"`
}

// Key is what a lookup goes by: one of customer_access's three ids.
type Key string

// The keys of a lookup, named as the read API's parameters.
const (
	ByClientReference Key = "client_reference_id"
	ByCustomer        Key = "stripe_customer_id"
	BySubscription    Key = "stripe_subscription_id"
)

// Keys lists every Key.
var Keys = []Key{ByClientReference, ByCustomer, BySubscription}

// Store reads answers from customer_access.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore reads answers over pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// The statements below select the customers first and then every row of
// theirs: a client_reference_id names only the subscriptions its checkout
// sessions paid for, but the answer is the customer's. The first step
// goes by the view's index for the key (checkout_sessions_client_reference,
// entitlements' primary key), the second by entitlements_customer.
// version and at are now(), the instant the view's has_access is computed
// at (one statement: now() is its start).
const (
	answerColumns = `(extract(epoch FROM now()) * 1000000)::bigint, now(),
    a.stripe_customer_id, a.stripe_subscription_id, a.client_reference_id, a.status,
    a.has_access, a.access_ends_at, a.price_lookup_keys, a.features`
	answerOrder = ` ORDER BY a.stripe_customer_id, a.stripe_subscription_id`

	lookupByClientReferenceSQL = `SELECT ` + answerColumns + ` FROM customer_access a
WHERE a.stripe_customer_id IN (SELECT c.stripe_customer_id FROM customer_access c WHERE c.client_reference_id = $1)` + answerOrder
	lookupByCustomerSQL = `SELECT ` + answerColumns + ` FROM customer_access a
WHERE a.stripe_customer_id = $1` + answerOrder
	lookupBySubscriptionSQL = `SELECT ` + answerColumns + ` FROM customer_access a
WHERE a.stripe_customer_id IN (SELECT e.stripe_customer_id FROM entitlements e WHERE e.stripe_subscription_id = $1)` + answerOrder

	// pageSQL: the next customers after $1 in stripe_customer_id order,
	// from entitlements_customer, and all their rows. The page's customers
	// are an array (an init plan), looked up by index: as IN (subquery),
	// a generic plan, which cannot know LIMIT $2, hash-joined the page to
	// a sequential scan of entitlements.
	pageSQL = `SELECT ` + answerColumns + ` FROM customer_access a
WHERE a.stripe_customer_id = ANY (ARRAY(
    SELECT DISTINCT e.stripe_customer_id FROM entitlements e
    WHERE e.stripe_customer_id > $1 ORDER BY e.stripe_customer_id LIMIT $2))` + answerOrder

	// customerSQL is lookupByCustomerSQL for a customer who may have no
	// row: a customer_features change of a customer without subscriptions
	// still has an answer (none, no access), and its version.
	customerSQL = `SELECT (extract(epoch FROM now()) * 1000000)::bigint, now(),
    $1::text, a.stripe_subscription_id, a.client_reference_id, a.status,
    a.has_access, a.access_ends_at, a.price_lookup_keys, a.features
FROM (SELECT) one LEFT JOIN customer_access a ON a.stripe_customer_id = $1
ORDER BY a.stripe_subscription_id`
)

// ErrKey is a lookup by a key that is not one of Keys.
var ErrKey = errors.New("access: unknown key")

// Lookup returns the answer of every customer that key's value names
// (none: an empty slice), in stripe_customer_id order.
func (s *Store) Lookup(ctx context.Context, key Key, value string) ([]Answer, error) {
	q := LookupSQL(key)
	if q == "" {
		return nil, fmt.Errorf("%w: %q", ErrKey, key)
	}
	answers, err := s.read(ctx, q, value)
	if err != nil {
		return nil, fmt.Errorf("access: lookup by %s: %w", key, err)
	}
	return answers, nil
}

// LookupSQL is the statement Lookup runs for key, its value as $1 ("" for
// an unknown key): tools/bench times it at scale (make bench-scale).
func LookupSQL(key Key) string {
	switch key {
	case ByClientReference:
		return lookupByClientReferenceSQL
	case ByCustomer:
		return lookupByCustomerSQL
	case BySubscription:
		return lookupBySubscriptionSQL
	}
	return ""
}

// Customer returns the customer's answer now, with no subscriptions when
// it has none.
func (s *Store) Customer(ctx context.Context, customer string) (Answer, error) {
	answers, err := s.read(ctx, customerSQL, customer)
	if err != nil {
		return Answer{}, fmt.Errorf("access: answer of %s: %w", customer, err)
	}
	return answers[0], nil
}

// MaxPage bounds a page of Page.
const MaxPage = 1000

// Page returns the answers of up to limit customers after the cursor
// after ("" : from the first), in stripe_customer_id order, and the
// cursor of the next page ("" when this one is the last). The cursor is
// the page's last stripe_customer_id: stable whatever changes meanwhile
// (a customer added before it is seen by the next pass, not this one).
func (s *Store) Page(ctx context.Context, after string, limit int) ([]Answer, string, error) {
	limit = min(max(limit, 1), MaxPage)
	answers, err := s.read(ctx, pageSQL, after, limit)
	if err != nil {
		return nil, "", fmt.Errorf("access: page after %q: %w", after, err)
	}
	next := ""
	if len(answers) == limit {
		next = answers[len(answers)-1].StripeCustomerID
	}
	return answers, next, nil
}

// read runs q and folds its rows, in customer order, into answers.
func (s *Store) read(ctx context.Context, q string, args ...any) ([]Answer, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	answers := []Answer{}
	var r struct {
		version                      int64
		at                           time.Time
		customer                     string
		subscription, status         *string
		clientReference              *string
		hasAccess                    *bool
		endsAt                       *time.Time
		priceLookupKeys, featureKeys []string
	}
	_, err = pgx.ForEachRow(rows, []any{&r.version, &r.at, &r.customer, &r.subscription, &r.clientReference,
		&r.status, &r.hasAccess, &r.endsAt, &r.priceLookupKeys, &r.featureKeys}, func() error {
		if n := len(answers); n == 0 || answers[n-1].StripeCustomerID != r.customer {
			answers = append(answers, Answer{
				Version: r.version, StripeCustomerID: r.customer, At: r.at.UTC(), Subscriptions: []Subscription{},
			})
		}
		if r.subscription == nil {
			return nil // customerSQL's customer with no row
		}
		a := &answers[len(answers)-1]
		sub := Subscription{
			StripeSubscriptionID: *r.subscription, ClientReferenceID: r.clientReference, Status: *r.status,
			HasAccess: *r.hasAccess, PriceLookupKeys: nonNil(r.priceLookupKeys), Features: nonNil(r.featureKeys),
		}
		if r.endsAt != nil {
			t := r.endsAt.UTC()
			sub.AccessEndsAt = &t
		}
		a.Subscriptions = append(a.Subscriptions, sub)
		a.HasAccess = a.HasAccess || sub.HasAccess
		return nil
	})
	if err != nil {
		return nil, err
	}
	return answers, nil
}

// nonNil is a copy of s (the scan reuses its target), never nil: the
// JSON says [] rather than null.
func nonNil(s []string) []string {
	return append([]string{}, s...)
}

// Expiry is a subscription whose access_ends_at has passed.
type Expiry struct {
	StripeCustomerID string
	EndsAt           time.Time
}

// expiredSQL lists the subscriptions whose access ended in ($1, now()],
// oldest first, and now(). Only those whose status gives access can move
// an answer by ending; the partial index entitlements_access_ends holds
// just them, so the cost is that of the window's rows, not the table's.
const expiredSQL = `SELECT e.stripe_customer_id, e.access_ends_at, now() FROM entitlements e
WHERE e.status IN ('active', 'trialing') AND e.access_ends_at > $1 AND e.access_ends_at <= now()
ORDER BY e.access_ends_at, e.stripe_customer_id
LIMIT $2`

// Expired returns up to limit subscriptions whose access ended after
// since and by now, oldest first, and the database's now: the end of the
// window when fewer than limit came back.
func (s *Store) Expired(ctx context.Context, since time.Time, limit int) ([]Expiry, time.Time, error) {
	rows, err := s.pool.Query(ctx, expiredSQL, since, limit)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("access: expired since %s: %w", since, err)
	}
	var out []Expiry
	var e Expiry
	var now time.Time
	_, err = pgx.ForEachRow(rows, []any{&e.StripeCustomerID, &e.EndsAt, &now}, func() error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("access: expired since %s: %w", since, err)
	}
	if len(out) == 0 {
		// No row carried now(): read it alone.
		if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return nil, time.Time{}, fmt.Errorf("access: the database's clock: %w", err)
		}
	}
	return out, now, nil
}
