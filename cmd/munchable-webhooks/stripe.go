package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
	"github.com/munchable/munchable-webhooks/internal/stripesync"
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
                       events whose webhook delivery has not succeeded
  verify [--repair]    compare every subscription, its items and its customer's active
                       entitlements with the stored rows: one JSON line per drifted row
                       and a summary on stdout; exit 0 in sync, 3 on drift, 1 on failure.
                       --repair stores Stripe's state as sync does

Each command answers -h with its own usage.`

// The usage of each stripe command, for its -h.
const (
	stripeSyncUsage = `usage: munchable-webhooks stripe sync

Stores every Stripe subscription (status=all), then the active entitlements
of each customer seen, as a snapshot taken when the listing began: a stored
event newer than that is kept. Safe while the service runs, and to repeat.
Progress on stderr, one summary line on stdout. Needs DATABASE_URL and
STRIPE_API_KEY (a restricted key that reads subscriptions and entitlements).`

	stripeReplayUsage = `usage: munchable-webhooks stripe replay -since DURATION [-undelivered]

Lists the Stripe events of the handled types created in the last DURATION,
oldest first, and runs each through the claim flow exactly like a webhook
delivery (same keys: an event already done is a duplicate). One summary
line: processed, duplicate, stale, unordered, failed. Needs DATABASE_URL,
STRIPE_API_KEY (reads events) and REDIS_URL.`

	stripeVerifyUsage = `usage: munchable-webhooks stripe verify [-repair]

Lists every Stripe subscription (status=all) with its items, and the active
entitlements of each customer seen, and compares them field by field with
entitlements, entitlement_items and customer_features. Prints one JSON line
per drifted row on stdout ({"kind", "id", "fields": {field: {"stored",
"stripe"}}}), then a summary line. A row written after the listing began is
newer than Stripe's answer and is not drift. Exit status: 0 in sync, 3 on
drift, 1 on failure. -repair stores Stripe's state for each drifted row as
stripe sync does (a stored event newer than the listing is kept) and counts
what it mended; a stored row Stripe does not list is reported, never
deleted. Needs DATABASE_URL and STRIPE_API_KEY.`
)

// errDrift is stripe verify's verdict when the tables and Stripe differ:
// exit status 3.
var errDrift = errors.New("stripe verify: the tables differ from Stripe")

// errRepaired is the verdict of a --repair that mended every drifted row:
// still drift found (exit status 3, which a scheduled run alerts on), but
// said in the past tense, so that the person who just repaired is not
// told the tables still differ.
var errRepaired = fmt.Errorf("stripe verify: the tables differed from Stripe; --repair stored Stripe's state for every drifted row (exit status 3: drift was found): %w", errDriftFound)

// errDriftFound is what errRepaired wraps, so that errors.Is(err, errDrift)
// holds for it too.
var errDriftFound = driftFound{}

type driftFound struct{}

func (driftFound) Error() string        { return "run stripe verify again to see it in sync" }
func (driftFound) Is(target error) bool { return target == errDrift }

// stripeArgs is a parsed stripe command line.
type stripeArgs struct {
	command     string // "sync", "replay" or "verify"; "" when only help was asked for
	since       time.Duration
	undelivered bool
	repair      bool
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
	case "sync", "replay", "verify":
	default:
		return stripeArgs{}, top.misuse("unknown command %q", out.command)
	}
	usage := map[string]string{"sync": stripeSyncUsage, "replay": stripeReplayUsage, "verify": stripeVerifyUsage}[out.command]
	cmd := newCommand("stripe "+out.command, usage, stdout, stderr)
	if out.command == "replay" {
		cmd.flags.DurationVar(&out.since, "since", 0, "replay the events created in the last `DURATION`, such as 72h (required; at most 720h, Stripe's 30 days)")
		cmd.flags.BoolVar(&out.undelivered, "undelivered", false, "only events whose webhook delivery has not succeeded (Stripe's delivery_success=false)")
	}
	if out.command == "verify" {
		cmd.flags.BoolVar(&out.repair, "repair", false, "store Stripe's state for each drifted row, as stripe sync does")
	}
	if _, err := cmd.parse(args[1:], 0); err != nil {
		return stripeArgs{}, err
	}
	if out.command == "replay" && (out.since <= 0 || out.since > stripesync.Window) {
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
		add("DATABASE_URL is required: %s", wantDatabaseURL)
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
	// Progress and the summary are the output; a replay's delivery lines
	// only at LOG_LEVEL's asking, as for events retry.
	logger := newLogger(stderr, operatorLogLevel(environ, cfg.logLevel))
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	api := stripehook.NewAPI(string(cfg.StripeAPIKey), cfg.stripeAPIURL, logger, nil) // only serve traces
	store := entitlements.NewStore(pool, prometheus.NewRegistry())
	start := time.Now()

	if a.command == "sync" {
		n, err := stripesync.Sync(ctx, stripesync.SyncConfig{
			API: api, Store: store, Logger: logger, Progress: newProgress(stderr, "stripe sync"),
		})
		fmt.Fprintf(stdout, "stripe sync: %s in %s\n", n, time.Since(start).Round(time.Millisecond))
		return err
	}
	if a.command == "verify" {
		return stripeVerify(ctx, stripesync.VerifyConfig{API: api, Store: store, Repair: a.repair, Logger: logger,
			Progress: newProgress(stderr, "stripe verify")}, stdout, start)
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
	n, err := stripesync.Replay(ctx, stripesync.ReplayConfig{
		API: api, Receiver: receiver, Endpoint: endpoint,
		Since: time.Now().Add(-a.since), Undelivered: a.undelivered,
		Logger: logger, Progress: newProgress(stderr, "stripe replay"),
	})
	fmt.Fprintf(stdout, "stripe replay: %s in %s\n", n, time.Since(start).Round(time.Millisecond))
	return err
}

// stripeVerify runs Verify, printing each drifted row as a JSON line and
// the summary; drift is errDrift.
func stripeVerify(ctx context.Context, cfg stripesync.VerifyConfig, stdout io.Writer, start time.Time) error {
	enc := jsonLines(stdout)
	cfg.Report = func(d stripesync.Drift) { _ = enc.Encode(d) }
	n, err := stripesync.Verify(ctx, cfg)
	fmt.Fprintf(stdout, "stripe verify: %s in %s\n", n, time.Since(start).Round(time.Millisecond))
	switch {
	case err != nil || n.Drifted() == 0:
	case cfg.Repair && n.Repaired == n.Drifted():
		err = errRepaired
	default:
		err = errDrift
	}
	return err
}

// progress writes each phase's "done/total (rate/s)" to w at most once a
// second, each line prefixed with the command ("stripe sync").
type progress struct {
	w           io.Writer
	command     string
	start, last time.Time
}

func newProgress(w io.Writer, command string) stripesync.Progress {
	p := &progress{w: w, command: command}
	return p.report
}

func (p *progress) report(what string, done, total int) {
	now := time.Now()
	if done == 0 {
		p.start, p.last = now, now
		return
	}
	if now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	all := "?" // Stripe's lists do not say how long they are
	if total > 0 {
		all = fmt.Sprint(total)
	}
	fmt.Fprintf(p.w, "%s: %s %d/%s (%.0f/s)\n", p.command, what, done, all, float64(done)/now.Sub(p.start).Seconds())
}
