package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

const eventsUsage = `usage: munchable-webhooks events COMMAND [flags] ARGS

Reads the ledger (webhook_events in DATABASE_URL): what happened to every
event that reached the claim, for EVENTS_RETENTION. An event that is not in
it never reached the claim (refused, or of a type the service ignores), or
is older than that.

commands:
  show PROVIDER EVENT_ID   one JSON object: the ledger row, the claim's state in Redis
                           (REDIS_URL, REDIS_KEY_PREFIX; "absent" once its done key expired)
                           and the changes the event made in the feed
  list [--outcome O] [--since D]
                           one JSON line per event first seen in the last D (default 24h),
                           oldest first; O is applied, unchanged, stale, unordered, failed
                           or dead; D a duration such as 90m or 168h
  retry PROVIDER EVENT_ID  run a failed or dead event again through the claim, exactly as a
                           delivery: Stripe's from the API when STRIPE_API_KEY is set, else
                           from the kept body; Resend's from the kept body. Needs the
                           service's configuration. Prints the outcome; exit 1 if it failed

PROVIDER is stripe or resend; EVENT_ID is the Stripe event id or the svix-id.
Each command answers -h with its own usage.`

// The usage of each events command, for its -h.
const (
	eventsShowUsage = `usage: munchable-webhooks events show PROVIDER EVENT_ID

Prints one JSON object: the event's ledger row (webhook_events in
DATABASE_URL), its claim's state in Redis (REDIS_URL, REDIS_KEY_PREFIX;
"absent" once its done key expired) and the changes it made in the feed,
each with the cursor that resumes just after it (changes tail --after).
With tracing on, the ledger row has trace_id: the event's last traced
attempt.
PROVIDER is stripe or resend; EVENT_ID is the Stripe event id or the svix-id.`

	eventsListUsage = `usage: munchable-webhooks events list [--outcome O] [--since D]

Prints one JSON line per event first seen in the last D (a duration such as
90m, 24h or 168h; default 24h), oldest first. O is one of the outcomes the
ledger records: ` + recordedOutcomes + `.`

	eventsRetryUsage = `usage: munchable-webhooks events retry PROVIDER EVENT_ID

Runs a failed or dead event again through the claim, exactly as a delivery:
Stripe's from the API when STRIPE_API_KEY is set, else from the kept body;
Resend's from the kept body. Needs the service's configuration. Prints the
outcome; exit 1 if it failed.`
)

// recordedOutcomes are the outcomes a ledger row can have: an ignored
// event writes no row, so filtering on it could only print nothing.
const recordedOutcomes = "applied, unchanged, stale, unordered, failed, dead"

// eventsRequest is one parsed events command line.
type eventsRequest struct {
	sub               string
	provider, eventID string
	outcome           string        // list
	since             time.Duration // list
}

// eventsUsages is each command's own usage, for its -h.
var eventsUsages = map[string]string{"show": eventsShowUsage, "list": eventsListUsage, "retry": eventsRetryUsage}

func parseEvents(args []string, stdout, stderr io.Writer) (eventsRequest, error) {
	top := newCommand("events", eventsUsage, stdout, stderr)
	if len(args) == 0 {
		return eventsRequest{}, top.misuse("want a command")
	}
	req := eventsRequest{sub: args[0]}
	cmd := newCommand("events "+req.sub, eventsUsages[req.sub], stdout, stderr)
	want := 2
	var since string
	switch req.sub {
	case "help", "-h", "-help", "--help":
		top.printUsage(stdout)
		return req, flag.ErrHelp
	case "show", "retry":
	case "list":
		want = 0
		cmd.flags.StringVar(&req.outcome, "outcome", "", "only events with this outcome")
		cmd.flags.StringVar(&since, "since", "24h", "only events first seen within this long: a `DURATION` such as 90m, 24h or 168h")
	default:
		return req, top.misuse("unknown command %q", req.sub)
	}
	pos, err := cmd.parse(args[1:], want)
	if err != nil {
		return req, err
	}
	if want == 2 {
		if req.provider, req.eventID, err = cmd.providerEvent(pos); err != nil {
			return req, err
		}
	}
	if req.outcome != "" && (req.outcome == string(ledger.Ignored) || !slices.Contains(ledger.Outcomes, ledger.Outcome(req.outcome))) {
		return req, cmd.misuse("--outcome %q: want one of %s (an ignored event has no ledger row)", req.outcome, recordedOutcomes)
	}
	if req.sub == "list" {
		if req.since, err = time.ParseDuration(since); err != nil || req.since <= 0 {
			return req, cmd.misuse("--since %q: want a positive duration such as 90m, 24h or 168h (hours at most: 7 days is 168h)", since)
		}
	}
	return req, nil
}

// ledgerConfig is what show and list need: the database, and Redis for
// the claim's state.
type ledgerConfig struct {
	DatabaseURL secret `env:"DATABASE_URL"`
	ClaimConfig
}

func (c *ledgerConfig) validate() []error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	if strings.TrimSpace(string(c.DatabaseURL)) == "" {
		add("DATABASE_URL is required: %s", wantDatabaseURL)
	}
	c.check(add)
	return p
}

func events(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	req, err := parseEvents(args, stdout, stderr)
	if err != nil {
		return err
	}
	if req.sub == "retry" {
		return retryEvent(ctx, environ, req.provider, req.eventID, stdout, stderr)
	}
	cfg, err := parseEnv[ledgerConfig](environ)
	if err != nil {
		return err
	}
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	led := ledger.New(pool, cfg.PoisonAfter)
	if req.sub == "list" {
		enc, n := jsonLines(stdout), 0
		err := led.List(ctx, ledger.Outcome(req.outcome), time.Now().Add(-req.since), func(e ledger.Event) error {
			n++
			return enc.Encode(e)
		})
		// On stderr, so that stdout stays one JSON object a line; an
		// empty list then still says it looked.
		if err == nil {
			fmt.Fprintf(stderr, "%d events\n", n)
		}
		return err
	}
	claims, closeRedis, err := cfg.openStore()
	if err != nil {
		return err
	}
	defer closeRedis()
	return showEvent(ctx, led, claims, req.provider, req.eventID, stdout)
}

// eventReport is what events show prints.
type eventReport struct {
	Event *ledger.Event `json:"event"` // null: not in the ledger
	// Claim is the claim's key as `claims show` describes it.
	Claim   string          `json:"claim"`
	Changes []ledger.Change `json:"changes"`
}

func showEvent(ctx context.Context, led *ledger.Ledger, claims *claim.Store, provider, eventID string, stdout io.Writer) error {
	var r eventReport
	e, err := led.Get(ctx, provider, eventID)
	switch {
	case err == nil:
		r.Event = &e
	case !errors.Is(err, ledger.ErrNotFound):
		return err
	}
	entry, err := claims.Inspect(ctx, provider, eventID)
	switch {
	case errors.Is(err, claim.ErrAbsent):
		r.Claim = claims.Key(provider, eventID) + " absent"
	case err != nil:
		// The ledger is the record; Redis only adds the live state.
		r.Claim = "unknown: " + err.Error()
	default:
		r.Claim = describeEntry(entry, time.Now())
	}
	if r.Event != nil {
		if r.Changes, err = led.ChangesOf(ctx, *r.Event); err != nil {
			return err
		}
	}
	enc := jsonLines(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
