package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

const claimsUsage = `usage: munchable-webhooks claims COMMAND [flags] ARGS

Looks at and settles idempotency claims in Redis (REDIS_URL, REDIS_KEY_PREFIX,
REDIS_TIMEOUT; STRIPE_DEDUPE_TTL and RESEND_DEDUPE_TTL for done).

commands:
  show PROVIDER EVENT_ID              state, owner, age and TTL left of the event's key, or "absent"
  release [-force] PROVIDER EVENT_ID  delete the event's processing claim, whoever holds it, so the
                                      provider's next retry runs at once; -force also deletes a done key
                                      (the next retry then applies the event again)
  done PROVIDER EVENT_ID              mark the event done for the provider's dedupe TTL: later
                                      deliveries are answered as duplicates
  stuck [-older-than 1m]              list processing claims older than the bound (SCAN, never KEYS): a
                                      claim older than HANDLER_TIMEOUT has outlived its handler, so its
                                      holder died; it expires at CLAIM_PROCESSING_TTL

PROVIDER is stripe or resend; EVENT_ID is the Stripe event id or the svix-id.`

// claimsConfig is what the claims tool needs: Redis and the dedupe TTLs,
// nothing of the webhook secrets or Postgres.
type claimsConfig struct {
	RedisURL        secret        `env:"REDIS_URL"`
	RedisTimeout    time.Duration `env:"REDIS_TIMEOUT" envDefault:"250ms"`
	RedisKeyPrefix  string        `env:"REDIS_KEY_PREFIX" envDefault:"webhook"`
	StripeDedupeTTL time.Duration `env:"STRIPE_DEDUPE_TTL" envDefault:"72h"`
	ResendDedupeTTL time.Duration `env:"RESEND_DEDUPE_TTL" envDefault:"30h"`
}

func (c claimsConfig) validate() []error {
	var p []error
	if c.RedisURL == "" {
		p = append(p, errors.New("REDIS_URL is required"))
	} else if _, err := redis.ParseURL(string(c.RedisURL)); err != nil {
		p = append(p, errors.New("REDIS_URL is invalid: want redis://host:port[/db] or rediss://host:port[/db]"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"REDIS_TIMEOUT", c.RedisTimeout}, {"STRIPE_DEDUPE_TTL", c.StripeDedupeTTL}, {"RESEND_DEDUPE_TTL", c.ResendDedupeTTL}} {
		if d.v <= 0 {
			p = append(p, fmt.Errorf("%s must be positive", d.name))
		}
	}
	return p
}

func (c claimsConfig) dedupeTTL(provider string) time.Duration {
	if provider == "resend" {
		return c.ResendDedupeTTL
	}
	return c.StripeDedupeTTL
}

func claims(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(stdout, claimsUsage)
		return nil
	}
	sub := args[0]
	fs := flag.NewFlagSet("claims "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, claimsUsage) }
	force := fs.Bool("force", false, "release: delete a done key too")
	// The default is past the default HANDLER_TIMEOUT (30s) and under the
	// default CLAIM_PROCESSING_TTL (120s), older than which no claim lives.
	olderThan := fs.Duration("older-than", time.Minute, "stuck: list claims older than this")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	wantArgs := 2
	switch sub {
	case "show", "release", "done":
	case "stuck":
		wantArgs = 0
	default:
		fmt.Fprintln(stderr, claimsUsage)
		return fmt.Errorf("claims: unknown command %q", sub)
	}
	if len(pos) != wantArgs {
		fmt.Fprintln(stderr, claimsUsage)
		return fmt.Errorf("claims %s: want %d arguments, got %d", sub, wantArgs, len(pos))
	}
	var provider, eventID string
	if wantArgs == 2 {
		provider, eventID = pos[0], pos[1]
	}
	if wantArgs == 2 && provider != "stripe" && provider != "resend" {
		return fmt.Errorf("claims %s: provider %q: want stripe or resend", sub, provider)
	}

	cfg, err := parseEnv[claimsConfig](environ)
	if err != nil {
		return err
	}
	rdb, err := openRedis(string(cfg.RedisURL), cfg.RedisTimeout, newLogger(stderr, slog.LevelWarn))
	if err != nil {
		return err
	}
	defer rdb.Close()
	store := claim.NewStore(rdb, claim.StoreConfig{Prefix: cfg.RedisKeyPrefix, Timeout: cfg.RedisTimeout})
	now := time.Now()

	switch sub {
	case "show":
		e, err := store.Inspect(ctx, provider, eventID)
		if errors.Is(err, claim.ErrAbsent) {
			fmt.Fprintf(stdout, "%s absent\n", store.Key(provider, eventID))
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, describeEntry(e, now))
		return nil

	case "release":
		e, err := store.ForceRelease(ctx, provider, eventID, *force)
		if errors.Is(err, claim.ErrAbsent) {
			fmt.Fprintf(stdout, "%s absent: nothing to release\n", store.Key(provider, eventID))
			return nil
		}
		if errors.Is(err, claim.ErrNotProcessing) {
			return fmt.Errorf("%w; not deleted (use -force to delete it: the next delivery then applies the event again)", err)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "released: %s\n", describeEntry(e, now))
		return nil

	case "done":
		ttl := cfg.dedupeTTL(provider)
		if err := store.MarkDone(ctx, provider, eventID, ttl); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s marked done for %s\n", store.Key(provider, eventID), ttl)
		return nil
	}

	stuck, err := store.Stuck(ctx, *olderThan, now)
	if err != nil {
		return err
	}
	for _, e := range stuck {
		fmt.Fprintln(stdout, describeEntry(e, now))
	}
	fmt.Fprintf(stdout, "%d processing claims older than %s\n", len(stuck), *olderThan)
	return nil
}

// describeEntry is one line about a key, for people and for grep.
func describeEntry(e claim.Entry, now time.Time) string {
	ttl := "-" // a deleted key's
	switch {
	case e.TTL > 0:
		ttl = e.TTL.Round(time.Second).String()
	case e.TTL < 0:
		ttl = "none"
	}
	fields := []string{e.Key}
	switch e.State {
	case claim.Processing:
		fields = append(fields, "processing", "owner="+e.Owner)
	case claim.Done:
		fields = append(fields, "done")
	default:
		return fmt.Sprintf("%s unreadable value %.60q ttl=%s", e.Key, e.Raw, ttl)
	}
	fields = append(fields,
		"age="+now.Sub(e.At).Round(time.Second).String(),
		"at="+e.At.UTC().Format(time.RFC3339),
		"ttl="+ttl,
		"fingerprint="+orDash(e.Fingerprint))
	return strings.Join(fields, " ")
}

// parseInterspersed parses flags wherever they stand ("release stripe evt_1
// -force" as well as "release -force stripe evt_1") and returns the other
// arguments in order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
