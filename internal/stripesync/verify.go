package stripesync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// The kinds of row Verify compares, as printed and as the
// stripe_drift_rows{kind} label.
const (
	KindSubscription     = "subscription"       // an entitlements row
	KindSubscriptionItem = "subscription_items" // a subscription's entitlement_items rows
	KindCustomerFeatures = "customer_features"
)

// Kinds lists every kind, in the order Verify reports them.
var Kinds = []string{KindSubscription, KindSubscriptionItem, KindCustomerFeatures}

// Drift is one row on which the tables and Stripe disagree: its kind, its
// id (the subscription's or the customer's), and each differing field.
// Repaired says --repair stored Stripe's state; a row that could not be
// repaired (a stored row Stripe does not list, a stored terminal status)
// stays false.
type Drift struct {
	Kind     string                `json:"kind"`
	ID       string                `json:"id"`
	Fields   map[string]DriftField `json:"fields"`
	Repaired bool                  `json:"repaired,omitempty"`
}

// DriftField is one field's two values.
type DriftField struct {
	Stored any `json:"stored"`
	Stripe any `json:"stripe"`
}

func newDrift(kind, id string, d []entitlements.Difference) Drift {
	out := Drift{Kind: kind, ID: id, Fields: make(map[string]DriftField, len(d))}
	for _, f := range d {
		out.Fields[f.Field] = DriftField{Stored: f.Stored, Stripe: f.Stripe}
	}
	return out
}

// VerifyConfig is what Verify works with.
type VerifyConfig struct {
	API   *client.API
	Store *entitlements.Store
	// Repair stores Stripe's state for each drifted row, as Sync does.
	Repair bool
	// Report hears each drifted row as it is found; nil: nobody.
	Report func(Drift)
	// A nil Logger discards; a nil Progress reports nothing.
	Logger   *slog.Logger
	Progress Progress
}

// VerifyCounts is what a verify found; its String is the summary line.
type VerifyCounts struct {
	Subscriptions, Customers int // compared
	// Newer counts rows written after the listing began (a webhook that
	// landed mid-listing): no drift, and kept.
	Newer int
	// Drift counts drifted rows by kind; Repaired those --repair mended.
	Drift    map[string]int
	Repaired int
	Invalid  int // subscriptions Stripe listed that could not be read
	Requests int
}

// Drifted is the number of drifted rows of every kind.
func (n VerifyCounts) Drifted() int {
	t := 0
	for _, v := range n.Drift {
		t += v
	}
	return t
}

func (n VerifyCounts) String() string {
	kinds := make([]string, len(Kinds))
	for i, k := range Kinds {
		kinds[i] = fmt.Sprintf("%d %s", n.Drift[k], k)
	}
	return fmt.Sprintf("%d subscriptions and %d customers compared, %d newer than the listing; %d rows drifted (%s), %d repaired, %d invalid; %d API requests",
		n.Subscriptions, n.Customers, n.Newer, n.Drifted(), strings.Join(kinds, ", "), n.Repaired, n.Invalid, n.Requests)
}

// pageSize is a Stripe list page, and so the batch of stored rows read at
// a time.
const pageSize = 100

// verifier is one walk.
type verifier struct {
	cfg    VerifyConfig
	l      *stripehook.Lister
	census *entitlements.Census
	n      *VerifyCounts
}

// Verify compares every subscription (status=all) with its stored row and
// items, and each of their customers' active entitlements with the stored
// features, a page at a time: a page of Stripe's list is read, then the
// stored rows of that page, so memory holds one page however large the
// account. Stored rows Stripe did not list are read back afterwards in
// batches. A row written after the listing began (Stripe's clock at its
// first answer) is newer than what the listing can say, and is no drift.
// With Repair, each drifted row is stored as Sync stores it, under the
// same tie rule: a stored event newer than the listing is kept.
func Verify(ctx context.Context, cfg VerifyConfig) (n VerifyCounts, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, int, int) {}
	}
	if cfg.Report == nil {
		cfg.Report = func(Drift) {}
	}
	n.Drift = map[string]int{}
	v := &verifier{cfg: cfg, l: stripehook.NewLister(cfg.API), n: &n}
	defer func() { n.Requests = v.l.Requests() }()
	if v.census, err = cfg.Store.NewCensus(ctx); err != nil {
		return n, err
	}
	defer v.census.Close()

	params := &stripe.SubscriptionListParams{Status: stripe.String("all")}
	params.Limit = stripe.Int64(pageSize)
	var page []rawSubscription
	cfg.Progress("subscriptions", 0, 0)
	err = v.l.List(ctx, "/v1/subscriptions", params, func(id string, raw []byte) error {
		page = append(page, rawSubscription{id, raw})
		if len(page) < pageSize {
			return nil
		}
		err := v.page(ctx, page)
		page = page[:0]
		return err
	})
	if err == nil && len(page) > 0 {
		err = v.page(ctx, page)
	}
	if err != nil {
		return n, fmt.Errorf("verify subscriptions: %w", err)
	}
	if err := v.unseen(ctx); err != nil {
		return n, err
	}
	if n.Invalid > 0 {
		return n, fmt.Errorf("%d subscriptions could not be read (logged above)", n.Invalid)
	}
	return n, nil
}

type rawSubscription struct {
	id  string
	raw []byte
}

// takenAt is the listing's second: rows from it or later are newer.
func (v *verifier) takenAt() time.Time { return v.l.TakenAt().UTC().Truncate(time.Second) }

// newer reports whether a stored row was written after this listing read
// Stripe, and so is no drift: its event is from the listing's second or
// later. A snapshot from the listing's very second is not: it was taken
// by an earlier listing (a sync, or the --repair just run), so this one
// read Stripe no earlier. Stripe's clock (the Date header) counts whole
// seconds, so without this a verify run at once after --repair, as its
// hint says, skipped every row the repair had written ("newer than the
// listing") instead of finding them in sync.
func (v *verifier) newer(eventID string, created time.Time) bool {
	if entitlements.IsSnapshot(eventID) {
		return created.After(v.takenAt())
	}
	return !created.Before(v.takenAt())
}

// page compares one page of subscriptions, then their customers' features.
func (v *verifier) page(ctx context.Context, page []rawSubscription) error {
	subs := make([]entitlements.Subscription, 0, len(page))
	ids := make([]string, 0, len(page))
	for _, p := range page {
		sub, err := v.l.Subscription(ctx, p.raw)
		if errors.Is(err, stripehook.ErrUnreadable) {
			v.n.Invalid++
			v.cfg.Logger.Error("verify: unreadable subscription", "subscription_id", p.id, "err", err)
			continue
		}
		if err != nil {
			return err
		}
		subs = append(subs, sub)
		ids = append(ids, sub.ID)
	}
	stored, err := v.census.Subscriptions(ctx, ids)
	if err != nil {
		return err
	}
	var customers []string
	for _, sub := range subs {
		v.n.Subscriptions++
		v.cfg.Progress("subscriptions", v.n.Subscriptions, 0)
		customers = append(customers, sub.CustomerID)
		st, ok := stored[sub.ID]
		if ok && v.newer(st.EventID, st.EventCreated) {
			v.n.Newer++
			continue
		}
		var drifts []Drift
		if !ok {
			drifts = append(drifts, newDrift(KindSubscription, sub.ID, entitlements.PresenceDifference(false, true)))
		} else {
			fields, items := entitlements.SubscriptionDifferences(st.State, sub)
			if len(fields) > 0 {
				drifts = append(drifts, newDrift(KindSubscription, sub.ID, fields))
			}
			if len(items) > 0 {
				drifts = append(drifts, newDrift(KindSubscriptionItem, sub.ID, items))
			}
		}
		if len(drifts) == 0 {
			continue
		}
		repaired := false
		if v.cfg.Repair {
			res, err := v.cfg.Store.SnapshotSubscription(ctx, sub, v.takenAt())
			if err != nil {
				return fmt.Errorf("repair subscription %s: %w", sub.ID, err)
			}
			repaired = res.Verdict == entitlements.Applied
		}
		v.report(repaired, drifts...)
	}
	fresh, err := v.census.Customers(ctx, customers)
	if err != nil {
		return err
	}
	return v.features(ctx, fresh)
}

func (v *verifier) report(repaired bool, drifts ...Drift) {
	for _, d := range drifts {
		v.n.Drift[d.Kind]++
		if repaired {
			d.Repaired = true
			v.n.Repaired++
		}
		v.cfg.Report(d)
	}
}

// features compares the features of customers, seen for the first time in
// this walk, with their active entitlements at Stripe. An Accounts v2
// customer (acct_...) has no such list and is skipped, as Sync skips it.
func (v *verifier) features(ctx context.Context, customers []string) error {
	customers = onlyCustomers(customers)
	stored, err := v.census.Features(ctx, customers)
	if err != nil {
		return err
	}
	for _, c := range customers {
		st, ok := stored[c]
		if err := v.feature(ctx, c, st, ok); err != nil {
			return err
		}
	}
	return nil
}

func onlyCustomers(ids []string) []string {
	out := ids[:0:0]
	for _, c := range ids {
		if strings.HasPrefix(c, "cus_") {
			out = append(out, c)
		}
	}
	return out
}

// feature compares one customer's stored features (ok: a row exists)
// with Stripe's. A customer without a row and without active entitlements
// is in sync: Stripe's empty list and no row say the same.
func (v *verifier) feature(ctx context.Context, customer string, st entitlements.Stored[entitlements.Features], ok bool) error {
	keys, err := v.l.LookupKeys(ctx, customer)
	if err != nil {
		return err
	}
	v.n.Customers++
	if ok && v.newer(st.EventID, st.EventCreated) {
		v.n.Newer++
		return nil
	}
	stripeState := entitlements.Features{CustomerID: customer, LookupKeys: keys, Complete: true}
	var d []entitlements.Difference
	switch {
	case !ok && len(keys) == 0:
		return nil
	case !ok:
		d = entitlements.FeatureDifferences(entitlements.Features{CustomerID: customer, Complete: true}, stripeState)
	default:
		d = entitlements.FeatureDifferences(st.State, stripeState)
	}
	if len(d) == 0 {
		return nil
	}
	repaired := false
	if v.cfg.Repair {
		res, err := v.cfg.Store.SnapshotFeatures(ctx, stripeState, v.takenAt())
		if err != nil {
			return fmt.Errorf("repair entitlements of %s: %w", customer, err)
		}
		repaired = res.Verdict == entitlements.Applied
	}
	v.report(repaired, newDrift(KindCustomerFeatures, customer, d))
	return nil
}

// unseen reports the stored subscriptions Stripe did not list (drift that
// repair cannot mend: Stripe has nothing to store), then compares the
// stored features of customers no listed subscription named.
func (v *verifier) unseen(ctx context.Context) error {
	for after := ""; ; {
		batch, err := v.census.UnseenSubscriptions(ctx, after, v.takenAt(), pageSize)
		if err != nil {
			return err
		}
		for _, st := range batch {
			v.report(false, newDrift(KindSubscription, st.State.ID, entitlements.PresenceDifference(true, false)))
			after = st.State.ID
		}
		if len(batch) < pageSize {
			break
		}
	}
	for after := ""; ; {
		batch, err := v.census.UnseenFeatures(ctx, after, v.takenAt(), pageSize)
		if err != nil {
			return err
		}
		for _, st := range batch {
			after = st.State.CustomerID
			if !strings.HasPrefix(after, "cus_") {
				continue
			}
			if err := v.feature(ctx, after, st, true); err != nil {
				return err
			}
		}
		if len(batch) < pageSize {
			return nil
		}
	}
}
