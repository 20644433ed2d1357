// Package stripesync brings the service's tables to Stripe's state by
// reading Stripe's API, for what webhooks did not deliver: Sync stores a
// snapshot of every subscription and each customer's features, Replay runs
// listed events through the claim flow as deliveries. They live apart from
// stripehook, which verifies and decodes one delivery, because they are
// whole-account walks that the operator starts (and, later, the service
// on a schedule); the binary only parses their flags and prints their
// counts, so they are tested here without it.
package stripesync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// Progress hears how far a walk has got: done items of what (total 0
// when unknown: Stripe's lists do not say how long they are). Each phase
// begins with done 0.
type Progress func(what string, done, total int)

// SyncConfig is what Sync works with.
type SyncConfig struct {
	API   *client.API
	Store *entitlements.Store
	// A nil Logger discards; a nil Progress reports nothing.
	Logger   *slog.Logger
	Progress Progress
}

// SyncCounts is what a sync did; its String is the summary line.
type SyncCounts struct {
	Subscriptions, SubscriptionsKept int // listed; of those, kept as stored (a newer event, or canceled)
	Invalid                          int // listed but not decodable
	Customers, CustomersKept         int // whose entitlements were listed; kept as stored
	SkippedCustomers                 int // Accounts v2 (acct_): no active-entitlements list
	Requests                         int
}

func (n SyncCounts) String() string {
	return fmt.Sprintf("%d subscriptions (%d stored, %d kept, %d invalid), %d customers' entitlements (%d stored, %d kept, %d skipped), %d API requests",
		n.Subscriptions, n.Subscriptions-n.SubscriptionsKept-n.Invalid, n.SubscriptionsKept, n.Invalid,
		n.Customers, n.Customers-n.CustomersKept, n.CustomersKept, n.SkippedCustomers, n.Requests)
}

// Sync stores every subscription, then each customer's active
// entitlements, as a snapshot taken when the listing began (Stripe's clock:
// the first page's Date). The store keeps a stored event from that second
// or later, so a webhook applied during the sync is never overwritten by
// the older state a page carried; a second sync rewrites the same state.
func Sync(ctx context.Context, cfg SyncConfig) (n SyncCounts, err error) {
	cfg.defaults()
	l := stripehook.NewLister(cfg.API)
	defer func() { n.Requests = l.Requests() }()

	customers, err := syncSubscriptions(ctx, cfg, l, &n)
	if err != nil {
		return n, err
	}
	if err := syncFeatures(ctx, cfg, l, customers, &n); err != nil {
		return n, err
	}
	if n.Invalid > 0 {
		return n, fmt.Errorf("%d subscriptions could not be read; the rest are stored", n.Invalid)
	}
	return n, nil
}

func (cfg *SyncConfig) defaults() {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, int, int) {}
	}
}

// syncSubscriptions stores every listed subscription and returns their
// customers, sorted.
func syncSubscriptions(ctx context.Context, cfg SyncConfig, l *stripehook.Lister, n *SyncCounts) ([]string, error) {
	params := &stripe.SubscriptionListParams{Status: stripe.String("all")}
	params.Limit = stripe.Int64(100)
	seen := map[string]bool{}
	var customers []string
	cfg.Progress("subscriptions", 0, 0)
	err := l.List(ctx, "/v1/subscriptions", params, func(id string, raw []byte) error {
		n.Subscriptions++
		cfg.Progress("subscriptions", n.Subscriptions, 0)
		sub, err := l.Subscription(ctx, raw)
		if err != nil && !errors.Is(err, stripehook.ErrUnreadable) {
			return err // the API failed listing its items
		}
		if err != nil {
			// One unreadable object should not stop the rest; the summary
			// counts it and the exit status says so.
			n.Invalid++
			cfg.Logger.Error("sync: unreadable subscription", "subscription_id", id, "err", err)
			return nil
		}
		res, err := cfg.Store.SnapshotSubscription(ctx, sub, l.TakenAt())
		if err != nil {
			return fmt.Errorf("store subscription %s: %w", sub.ID, err)
		}
		if res.Verdict == entitlements.Stale {
			n.SubscriptionsKept++
		}
		if !seen[sub.CustomerID] {
			seen[sub.CustomerID] = true
			customers = append(customers, sub.CustomerID)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	slices.Sort(customers)
	return customers, nil
}

// syncFeatures stores each customer's active entitlements. Stripe lists
// them per customer only; an Accounts v2 customer (acct_...) has no such
// list.
func syncFeatures(ctx context.Context, cfg SyncConfig, l *stripehook.Lister, customers []string, n *SyncCounts) error {
	cfg.Progress("customers", 0, len(customers))
	for i, c := range customers {
		cfg.Progress("customers", i+1, len(customers))
		if !strings.HasPrefix(c, "cus_") {
			n.SkippedCustomers++
			continue
		}
		keys, err := l.LookupKeys(ctx, c)
		if err != nil {
			return err
		}
		f := entitlements.Features{CustomerID: c, LookupKeys: keys, Complete: true}
		res, err := cfg.Store.SnapshotFeatures(ctx, f, l.TakenAt())
		if err != nil {
			return fmt.Errorf("store entitlements of %s: %w", c, err)
		}
		n.Customers++
		if res.Verdict == entitlements.Stale {
			n.CustomersKept++
		}
	}
	return nil
}
