package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

const stripeUsage = `usage: munchable-webhooks stripe COMMAND [flags]

Brings the database to Stripe's state through the Stripe API
(STRIPE_API_KEY, STRIPE_API_URL, DATABASE_URL).

commands:
  sync                 store every subscription (status=all), then the active entitlements
                       of each customer seen, as a snapshot taken when the listing began:
                       a stored event newer than that is kept. Safe while the service
                       runs, and to repeat. Progress on stderr, a summary on stdout
  replay --since DURATION [--undelivered]
                       run the events of the handled types created in the last DURATION
                       (at most 720h, Stripe's 30 days), oldest first, through the claim
                       flow exactly like webhook deliveries (same keys, REDIS_URL): an
                       event already done is a duplicate. --undelivered asks only for
                       events whose webhook delivery has not succeeded`

// replayWindow is how far back Stripe keeps events.
const replayWindow = 30 * 24 * time.Hour

// stripeArgs is a parsed stripe command line.
type stripeArgs struct {
	command     string // "sync" or "replay"; "" when only help was asked for
	since       time.Duration
	undelivered bool
}

// parseStripeArgs reads "stripe COMMAND [flags]" the way every command
// line is read (command in main.go): help goes to stdout and returns
// flag.ErrHelp; a bad line prints usage to stderr and wraps errUsage.
func parseStripeArgs(args []string, stdout, stderr io.Writer) (stripeArgs, error) {
	top := newCommand("stripe", stripeUsage, stdout, stderr)
	if len(args) == 0 {
		return stripeArgs{}, top.misuse("missing command")
	}
	var out stripeArgs
	switch out.command = args[0]; out.command {
	case "help", "-h", "-help", "--help":
		top.printUsage(stdout)
		return stripeArgs{}, flag.ErrHelp
	case "sync", "replay":
	default:
		return stripeArgs{}, top.misuse("unknown command %q", out.command)
	}
	cmd := newCommand("stripe "+out.command, stripeUsage, stdout, stderr)
	if out.command == "replay" {
		cmd.flags.DurationVar(&out.since, "since", 0, "")
		cmd.flags.BoolVar(&out.undelivered, "undelivered", false, "")
	}
	if _, err := cmd.parse(args[1:], 0); err != nil {
		return stripeArgs{}, err
	}
	if out.command == "replay" && (out.since <= 0 || out.since > replayWindow) {
		return stripeArgs{}, cmd.misuse("--since %s: want a duration above 0 and at most 720h (Stripe keeps 30 days of events)", out.since)
	}
	return out, nil
}

// stripeConfig is what the stripe commands need: the database, the API,
// and for replay the claims; none of the webhook secrets.
type stripeConfig struct {
	DatabaseURL  secret `env:"DATABASE_URL"`
	StripeAPIKey secret `env:"STRIPE_API_KEY"`
	StripeAPIURL string `env:"STRIPE_API_URL" envDefault:"https://api.stripe.com"`
	LogLevel     string `env:"LOG_LEVEL" envDefault:"info"`
	ClaimConfig

	stripeAPIURL *url.URL
	logLevel     slog.Level
}

func (c *stripeConfig) validate() []error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	if strings.TrimSpace(string(c.DatabaseURL)) == "" {
		add("DATABASE_URL is required")
	}
	if strings.TrimSpace(string(c.StripeAPIKey)) == "" {
		add("STRIPE_API_KEY is required: a restricted key that can read subscriptions, events, entitlements and checkout sessions")
	}
	var ok bool
	if c.stripeAPIURL, ok = parseHTTPURL(c.StripeAPIURL); !ok {
		add("STRIPE_API_URL is invalid: want an http(s) URL")
	}
	c.check(add)
	var err error
	if c.logLevel, err = parseLevel(c.LogLevel); err != nil {
		add("LOG_LEVEL is %q: want debug, info, warn or error", c.LogLevel)
	}
	return p
}

// stripeCommand runs "munchable-webhooks stripe ...".
func stripeCommand(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	a, err := parseStripeArgs(args, stdout, stderr)
	if err != nil {
		return err
	}
	cfg, err := parseEnv[stripeConfig](environ)
	if err != nil {
		return err
	}
	if a.command == "replay" && cfg.RedisURL == "" {
		return errors.New("REDIS_URL is required for stripe replay: events run through the same claims as webhook deliveries")
	}
	logger := newLogger(stderr, cfg.logLevel)
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	api := stripehook.NewAPI(string(cfg.StripeAPIKey), cfg.stripeAPIURL, logger)
	store := entitlements.NewStore(pool, prometheus.NewRegistry())
	start := time.Now()

	if a.command == "sync" {
		n, err := syncStripe(ctx, api, store, logger, stderr)
		fmt.Fprintf(stdout, "stripe sync: %s in %s\n", n, time.Since(start).Round(time.Millisecond))
		return err
	}

	claims, closeRedis, err := cfg.openStore()
	if err != nil {
		return err
	}
	defer closeRedis()
	flow := claim.NewFlow(claims, claim.FlowConfig{
		HandlerTimeout: cfg.HandlerTimeout, PoisonAfter: cfg.PoisonAfter, Logger: logger,
		Ledger: ledger.New(pool, cfg.PoisonAfter),
	})
	endpoint := flow.Endpoint(cfg.provider("stripe"))
	receiver := stripehook.New(stripehook.Config{Store: store, API: api, Logger: logger})
	n, err := replayStripe(ctx, api, receiver, endpoint, logger, stderr, time.Now().Add(-a.since), a.undelivered)
	fmt.Fprintf(stdout, "stripe replay: %s in %s\n", n, time.Since(start).Round(time.Millisecond))
	return err
}

// syncCounts is what a sync did; its String is the summary line.
type syncCounts struct {
	subscriptions, subscriptionsKept int // listed; of those, kept as stored (a newer event, or canceled)
	invalid                          int // listed but not decodable
	customers, customersKept         int // whose entitlements were listed; kept as stored
	skippedCustomers                 int // Accounts v2 (acct_): no active-entitlements list
	requests                         int
}

func (n syncCounts) String() string {
	return fmt.Sprintf("%d subscriptions (%d stored, %d kept, %d invalid), %d customers' entitlements (%d stored, %d kept, %d skipped), %d API requests",
		n.subscriptions, n.subscriptions-n.subscriptionsKept-n.invalid, n.subscriptionsKept, n.invalid,
		n.customers, n.customers-n.customersKept, n.customersKept, n.skippedCustomers, n.requests)
}

// syncStripe stores every subscription, then each customer's active
// entitlements, as a snapshot taken when the listing began (Stripe's clock:
// the first page's Date). The store keeps a stored event from that second
// or later, so a webhook applied during the sync is never overwritten by
// the older state a page carried; a second sync rewrites the same state.
func syncStripe(ctx context.Context, api *client.API, store *entitlements.Store, logger *slog.Logger, stderr io.Writer) (n syncCounts, err error) {
	l := stripehook.NewLister(api)
	defer func() { n.requests = l.Requests() }()

	params := &stripe.SubscriptionListParams{Status: stripe.String("all")}
	params.Limit = stripe.Int64(100)
	subs := newProgress(stderr, "stripe sync: subscriptions", 0)
	seen := map[string]bool{}
	var customers []string
	err = l.List(ctx, "/v1/subscriptions", params, func(id string, raw []byte) error {
		subs.step()
		n.subscriptions++
		sub, err := l.Subscription(ctx, raw)
		if err != nil && !errors.Is(err, stripehook.ErrUnreadable) {
			return err // the API failed listing its items
		}
		if err != nil {
			// One unreadable object should not stop the rest; the summary
			// counts it and the exit status says so.
			n.invalid++
			logger.Error("sync: unreadable subscription", "subscription_id", id, "err", err)
			return nil
		}
		res, err := store.SnapshotSubscription(ctx, sub, l.TakenAt())
		if err != nil {
			return fmt.Errorf("store subscription %s: %w", sub.ID, err)
		}
		if res.Verdict == entitlements.Stale {
			n.subscriptionsKept++
		}
		if !seen[sub.CustomerID] {
			seen[sub.CustomerID] = true
			customers = append(customers, sub.CustomerID)
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("list subscriptions: %w", err)
	}

	// Stripe lists active entitlements per customer only; an Accounts v2
	// customer (acct_...) has no such list.
	slices.Sort(customers)
	features := newProgress(stderr, "stripe sync: customers", len(customers))
	for _, c := range customers {
		features.step()
		if !strings.HasPrefix(c, "cus_") {
			n.skippedCustomers++
			continue
		}
		keys, err := l.LookupKeys(ctx, c)
		if err != nil {
			return n, err
		}
		f := entitlements.Features{CustomerID: c, LookupKeys: keys, Complete: true}
		res, err := store.SnapshotFeatures(ctx, f, l.TakenAt())
		if err != nil {
			return n, fmt.Errorf("store entitlements of %s: %w", c, err)
		}
		n.customers++
		if res.Verdict == entitlements.Stale {
			n.customersKept++
		}
	}
	if n.invalid > 0 {
		return n, fmt.Errorf("%d subscriptions could not be read; the rest are stored", n.invalid)
	}
	return n, nil
}

// replayCounts is what a replay did; its String is the summary line.
type replayCounts struct {
	listed                                             int
	processed, duplicate, stale, unordered, inProgress int
	failed, ignored                                    int
	requests                                           int
}

func (n replayCounts) String() string {
	return fmt.Sprintf("%d events: %d processed, %d duplicate, %d stale, %d unordered, %d in progress, %d failed, %d ignored; %d API requests",
		n.listed, n.processed, n.duplicate, n.stale, n.unordered, n.inProgress, n.failed, n.ignored, n.requests)
}

// replayStripe runs the handled events created since through the claim,
// oldest first. Stripe lists newest first, so a first pass finds the oldest
// event and a second walks from it towards the newest with ending_before
// (stripe-go hands those pages over oldest first): two listings, and memory
// for one page, however many events the window holds.
func replayStripe(ctx context.Context, api *client.API, receiver *stripehook.Receiver, ep *claim.Endpoint, logger *slog.Logger, stderr io.Writer, since time.Time, undelivered bool) (n replayCounts, err error) {
	// replay runs one event through the claim exactly as a delivery would,
	// with the same key. The body goes unfingerprinted (nil): the API
	// renders an event in other bytes than the webhook did, and a
	// fingerprint would report every duplicate as an id reused with
	// another body.
	var done *progress
	replay := func(id string, raw []byte) error {
		done.step()
		n.listed++
		ev, err := receiver.Event(raw)
		if err != nil {
			n.failed++
			logger.Error("replay: unreadable event", "event_id", id, "err", err)
			return nil
		}
		res, _ := ep.Process(ctx, nil, ev) // the flow logs each outcome
		switch {
		case res.Outcome == claim.Processed && res.Effect == claim.Stale:
			n.stale++
		case res.Outcome == claim.Processed && res.Effect == claim.Unordered:
			n.unordered++
		case res.Outcome == claim.Processed:
			n.processed++
		case res.Outcome == claim.Duplicate:
			n.duplicate++
		case res.Outcome == claim.InProgress:
			n.inProgress++
		case res.Outcome == claim.Ignored:
			n.ignored++
		default:
			n.failed++
		}
		return nil
	}
	l := stripehook.NewLister(api)
	defer func() { n.requests = l.Requests() }()
	params := func() *stripe.EventListParams {
		p := &stripe.EventListParams{
			Types:        stripe.StringSlice(stripehook.HandledTypes()),
			CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()},
		}
		if undelivered {
			p.DeliverySuccess = stripe.Bool(false)
		}
		p.Limit = stripe.Int64(100)
		return p
	}

	var oldestID string
	var oldest []byte
	total := 0
	err = l.List(ctx, "/v1/events", params(), func(id string, raw []byte) error {
		oldestID, oldest = id, raw
		total++
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("list events: %w", err)
	}
	if oldest == nil {
		return n, nil
	}
	done = newProgress(stderr, "stripe replay: events", total)
	_ = replay(oldestID, oldest)
	p := params()
	p.EndingBefore = stripe.String(oldestID)
	if err := l.List(ctx, "/v1/events", p, replay); err != nil {
		return n, fmt.Errorf("list events after %s: %w", oldestID, err)
	}
	// An event another attempt holds is not done: after an outage its
	// holder may be a dead process, and Stripe may have stopped retrying.
	if n.failed > 0 || n.inProgress > 0 {
		return n, fmt.Errorf("%d events failed (logged above) and %d were held by another attempt; replay again once their claims end (claims stuck): done ones are duplicates", n.failed, n.inProgress)
	}
	return n, nil
}

// progress writes "done/total (rate/s)" to w at most once a second.
type progress struct {
	w           io.Writer
	what        string
	done, total int
	start, last time.Time
}

func newProgress(w io.Writer, what string, total int) *progress {
	now := time.Now()
	return &progress{w: w, what: what, total: total, start: now, last: now}
}

func (p *progress) step() {
	p.done++
	now := time.Now()
	if now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	total := "?" // Stripe's lists do not say how long they are
	if p.total > 0 {
		total = fmt.Sprint(p.total)
	}
	fmt.Fprintf(p.w, "%s %d/%s (%.0f/s)\n", p.what, p.done, total, float64(p.done)/now.Sub(p.start).Seconds())
}
