package entitlements

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stored is a stored row as a comparison with Stripe reads it: its state
// and the time of the event (or snapshot) that wrote it.
type Stored[S any] struct {
	State   S
	EventID string
	// EventCreated: a row whose event is as new as a listing, or newer,
	// was written after the listing read Stripe, and is no drift.
	EventCreated time.Time
}

// Difference is one field on which a stored row and Stripe disagree, each
// side's value in the form it is printed (a string, a number, a bool, a
// map, or nil for null or absent).
type Difference struct {
	Field  string
	Stored any
	Stripe any
}

// Census reads stored rows for a walk over Stripe's lists (stripe verify)
// and notes which rows the walk saw, in the table drift_census under a
// run id of its own, so that the rows Stripe did not list can be read back
// in batches afterwards: memory for one batch, however many rows the tables
// hold. A plain table rather than a temporary one, so that it works through
// a transaction pooler too. Nothing it runs is a transaction held across a
// call to Stripe. One Census serves one walk; Close deletes its rows.
type Census struct {
	pool *pgxpool.Pool
	run  string
}

// The kinds of id a census notes.
const (
	censusSubscription = "subscription"
	censusCustomer     = "customer"
)

// NewCensus starts a census, first deleting what a walk that died left
// behind a day ago or more.
func (s *Store) NewCensus(ctx context.Context) (*Census, error) {
	var run string
	err := s.pool.QueryRow(ctx, `
WITH gone AS (DELETE FROM drift_census WHERE seen_at < now() - interval '1 day')
SELECT gen_random_uuid()::text`).Scan(&run)
	if err != nil {
		return nil, fmt.Errorf("census: %w", err)
	}
	return &Census{pool: s.pool, run: run}, nil
}

// Close deletes the census's rows.
func (c *Census) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = c.pool.Exec(ctx, `DELETE FROM drift_census WHERE run = $1`, c.run) // else NewCensus deletes them a day later
}

const censusSQL = `INSERT INTO drift_census (run, kind, id) SELECT $1, $2, unnest($3::text[]) ON CONFLICT DO NOTHING`

// Subscriptions notes ids as seen and reads those stored, by id.
func (c *Census) Subscriptions(ctx context.Context, ids []string) (map[string]Stored[Subscription], error) {
	if _, err := c.pool.Exec(ctx, censusSQL, c.run, censusSubscription, ids); err != nil {
		return nil, fmt.Errorf("census subscriptions: %w", err)
	}
	const q = selectSubscriptionSQL + `, stripe_subscription_id
FROM entitlements e WHERE stripe_subscription_id = ANY ($1)`
	return c.subscriptions(ctx, q, ids)
}

// UnseenSubscriptions reads up to limit stored subscriptions that the walk
// has not seen, written before the walk began (before), in id order after
// the id after: the rows Stripe did not list.
func (c *Census) UnseenSubscriptions(ctx context.Context, after string, before time.Time, limit int) ([]Stored[Subscription], error) {
	const q = selectSubscriptionSQL + `, stripe_subscription_id
FROM entitlements e
WHERE stripe_subscription_id > $1 AND last_event_created < $2
  AND NOT EXISTS (SELECT FROM drift_census c WHERE c.run = $4 AND c.kind = 'subscription' AND c.id = e.stripe_subscription_id)
ORDER BY stripe_subscription_id LIMIT $3`
	m, err := c.subscriptions(ctx, q, after, before, limit, c.run)
	if err != nil {
		return nil, err
	}
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b Stored[Subscription]) int { return compareStrings(a.State.ID, b.State.ID) })
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (c *Census) subscriptions(ctx context.Context, q string, args ...any) (map[string]Stored[Subscription], error) {
	rows, err := c.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read subscriptions: %w", err)
	}
	defer rows.Close()
	out := map[string]Stored[Subscription]{}
	for rows.Next() {
		var id string
		st, err := scanSubscription(rows, "", &id)
		if err != nil {
			return nil, fmt.Errorf("read subscriptions: %w", err)
		}
		st.state.ID = id
		out[id] = Stored[Subscription]{State: st.state, EventID: st.eventID, EventCreated: st.storedAt.UTC()}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read subscriptions: %w", err)
	}
	return out, nil
}

// Customers notes customers as seen and returns those not seen before, in
// the order given: a customer with several subscriptions is compared once.
func (c *Census) Customers(ctx context.Context, customers []string) ([]string, error) {
	rows, err := c.pool.Query(ctx, censusSQL+` RETURNING id`, c.run, censusCustomer, customers)
	if err != nil {
		return nil, fmt.Errorf("census customers: %w", err)
	}
	fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("census customers: %w", err)
	}
	isFresh := map[string]bool{}
	for _, f := range fresh {
		isFresh[f] = true
	}
	return slices.DeleteFunc(slices.Clone(customers), func(c string) bool { return !isFresh[c] }), nil
}

const selectFeaturesSQL = `SELECT stripe_customer_id, lookup_keys, complete, last_event_id, last_event_created FROM customer_features f`

// Features reads the stored features of customers, by customer.
func (c *Census) Features(ctx context.Context, customers []string) (map[string]Stored[Features], error) {
	return c.features(ctx, selectFeaturesSQL+` WHERE stripe_customer_id = ANY ($1)`, customers)
}

// UnseenFeatures reads up to limit stored customer features whose customer
// the walk has not seen, written before the walk began, in customer order
// after the customer after.
func (c *Census) UnseenFeatures(ctx context.Context, after string, before time.Time, limit int) ([]Stored[Features], error) {
	m, err := c.features(ctx, selectFeaturesSQL+`
WHERE stripe_customer_id > $1 AND last_event_created < $2
  AND NOT EXISTS (SELECT FROM drift_census c WHERE c.run = $4 AND c.kind = 'customer' AND c.id = f.stripe_customer_id)
ORDER BY stripe_customer_id LIMIT $3`, after, before, limit, c.run)
	if err != nil {
		return nil, err
	}
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b Stored[Features]) int { return compareStrings(a.State.CustomerID, b.State.CustomerID) })
	return out, nil
}

func (c *Census) features(ctx context.Context, q string, args ...any) (map[string]Stored[Features], error) {
	rows, err := c.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read customer features: %w", err)
	}
	out := map[string]Stored[Features]{}
	var st Stored[Features]
	_, err = pgx.ForEachRow(rows, []any{&st.State.CustomerID, &st.State.LookupKeys, &st.State.Complete, &st.EventID, &st.EventCreated}, func() error {
		st.State.LookupKeys = sortedKeys(st.State.LookupKeys)
		st.EventCreated = st.EventCreated.UTC()
		out[st.State.CustomerID] = st
		st = Stored[Features]{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read customer features: %w", err)
	}
	return out, nil
}

// SubscriptionDifferences compares a stored subscription with Stripe's,
// field by field: the entitlements row's fields, then its items (kept
// apart: they are entitlement_items rows), each item's field named
// "<item id>.<column>", an item on one side only named by its id.
func SubscriptionDifferences(stored, stripe Subscription) (fields, items []Difference) {
	for _, f := range diff(stored, stripe) {
		if f == "items" {
			continue
		}
		fields = append(fields, Difference{Field: string(f), Stored: fieldValue(stored, f), Stripe: fieldValue(stripe, f)})
	}
	return fields, itemDifferences(stored.Items, stripe.Items)
}

// PresenceDifference is the one difference of a row on one side only.
func PresenceDifference(stored, stripe bool) []Difference {
	return []Difference{{Field: "exists", Stored: stored, Stripe: stripe}}
}

// FeatureDifferences compares a customer's stored features with Stripe's.
func FeatureDifferences(stored, stripe Features) []Difference {
	var out []Difference
	for _, f := range featureDiff(stored, stripe) {
		switch f {
		case "lookup_keys":
			out = append(out, Difference{Field: string(f), Stored: sortedKeys(stored.LookupKeys), Stripe: sortedKeys(stripe.LookupKeys)})
		case "complete":
			out = append(out, Difference{Field: string(f), Stored: stored.Complete, Stripe: stripe.Complete})
		}
	}
	return out
}

func fieldValue(s Subscription, f Field) any {
	switch f {
	case "stripe_customer_id":
		return s.CustomerID
	case "status":
		return s.Status
	case "price_id":
		return printString(s.PriceID)
	case "current_period_end":
		return printTime(s.CurrentPeriodEnd)
	case "cancel_at_period_end":
		return s.CancelAtPeriodEnd
	case "cancel_at":
		return printTime(s.CancelAt)
	case "canceled_at":
		return printTime(s.CanceledAt)
	case "ended_at":
		return printTime(s.EndedAt)
	case "trial_start":
		return printTime(s.TrialStart)
	case "trial_end":
		return printTime(s.TrialEnd)
	case "pause_collection":
		return printString(s.PauseCollection)
	case "livemode":
		return s.Livemode
	case "metadata":
		if s.Metadata == nil {
			return map[string]string{}
		}
		return s.Metadata
	}
	return nil
}

func itemDifferences(stored, stripe []Item) []Difference {
	var out []Difference
	pos := func(items []Item) map[string]int {
		m := make(map[string]int, len(items))
		for i, it := range items {
			m[it.ID] = i
		}
		return m
	}
	storedAt, stripeAt := pos(stored), pos(stripe)
	for j, b := range stripe {
		i, ok := storedAt[b.ID]
		if !ok {
			out = append(out, Difference{Field: b.ID, Stored: nil, Stripe: "present"})
			continue
		}
		a := stored[i]
		add := func(col string, x, y any) {
			if x != y {
				out = append(out, Difference{Field: b.ID + "." + col, Stored: x, Stripe: y})
			}
		}
		add("price_id", a.PriceID, b.PriceID)
		add("product_id", printString(a.ProductID), printString(b.ProductID))
		add("price_lookup_key", printString(a.PriceLookupKey), printString(b.PriceLookupKey))
		add("quantity", printQuantity(a.Quantity), printQuantity(b.Quantity))
		add("current_period_start", printTime(a.CurrentPeriodStart), printTime(b.CurrentPeriodStart))
		add("current_period_end", printTime(a.CurrentPeriodEnd), printTime(b.CurrentPeriodEnd))
		add("position", i+1, j+1)
	}
	for _, a := range stored {
		if _, ok := stripeAt[a.ID]; !ok {
			out = append(out, Difference{Field: a.ID, Stored: "present", Stripe: nil})
		}
	}
	return out
}

// The printed forms: null for what is stored as null.
func printString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func printTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339)
}

func printQuantity(q *int64) any {
	if q == nil {
		return nil
	}
	return *q
}
