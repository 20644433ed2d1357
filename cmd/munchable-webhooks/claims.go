package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

const claimsUsage = `usage: munchable-webhooks claims COMMAND [flags] ARGS

Looks at and settles idempotency claims in Redis (REDIS_URL, REDIS_KEY_PREFIX,
REDIS_TIMEOUT; STRIPE_DEDUPE_TTL and RESEND_DEDUPE_TTL for done).

commands:
  show PROVIDER EVENT_ID              state, owner, age and TTL left of the event's key, and its
                                      failed attempts (failures=N: a poison event shows here), or "absent"
  release [-force] PROVIDER EVENT_ID  delete the event's processing claim, whoever holds it, so the
                                      provider's next retry runs at once; -force also deletes a done key
                                      (the next retry then applies the event again)
  done PROVIDER EVENT_ID              mark the event done for the provider's dedupe TTL: later
                                      deliveries are answered as duplicates
  stuck [-older-than 1m]              list processing claims older than the bound (SCAN, never KEYS): a
                                      claim older than HANDLER_TIMEOUT has outlived its handler, so its
                                      holder died; it expires at CLAIM_PROCESSING_TTL. Each line
                                      shows the event's failed attempts too

PROVIDER is stripe or resend; EVENT_ID is the Stripe event id or the svix-id.
Each command answers -h with its own usage.`

// The usage of each claims command, for its -h.
const (
	claimsShowUsage = `usage: munchable-webhooks claims show PROVIDER EVENT_ID

Prints the event's key and its state: processing (with its owner) or done,
its age, when it was set, the TTL left, and the event's failed attempts
(failures=N: a poison event shows here); "absent" when there is no key.
PROVIDER is stripe or resend; EVENT_ID is the Stripe event id or the svix-id.
Reads REDIS_URL and REDIS_KEY_PREFIX.`

	claimsReleaseUsage = `usage: munchable-webhooks claims release [-force] PROVIDER EVENT_ID

Deletes the event's processing claim, whoever holds it, so that the
provider's next retry runs at once instead of waiting for the claim to
expire. A done key is kept unless -force is given (the next delivery then
applies the event again). PROVIDER is stripe or resend; EVENT_ID is the
Stripe event id or the svix-id.`

	claimsDoneUsage = `usage: munchable-webhooks claims done PROVIDER EVENT_ID

Marks the event done for the provider's dedupe TTL (STRIPE_DEDUPE_TTL or
RESEND_DEDUPE_TTL): later deliveries of it are answered as duplicates and
not applied. PROVIDER is stripe or resend; EVENT_ID is the Stripe event id
or the svix-id.`

	claimsStuckUsage = `usage: munchable-webhooks claims stuck [-older-than DURATION]

Lists the processing claims older than DURATION (SCAN, never KEYS), one
line each with the event's failed attempts, then a count. A claim older
than HANDLER_TIMEOUT has outlived its handler, so its holder died; it
expires at CLAIM_PROCESSING_TTL, or claims release frees it now.`
)

// claimsConfig is what the claims tool needs: Redis and the dedupe TTLs,
// nothing of the webhook secrets or Postgres.
type claimsConfig struct {
	ClaimConfig
}

func (c claimsConfig) validate() []error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	if c.RedisURL == "" {
		add("REDIS_URL is required: the service's own, %s", claim.RedisURLForms)
	}
	c.check(add)
	return p
}

// claimsRequest is one parsed claims command line.
type claimsRequest struct {
	sub               string
	provider, eventID string
	force             bool          // release
	olderThan         time.Duration // stuck
}

func claims(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	req, err := parseClaims(args, stdout, stderr)
	if err != nil {
		return err
	}
	cfg, store, closeRedis, err := openClaimStore(environ)
	if err != nil {
		return err
	}
	defer closeRedis()
	now := time.Now()
	switch req.sub {
	case "show":
		return showClaim(ctx, store, req.provider, req.eventID, now, stdout)
	case "release":
		return releaseClaim(ctx, store, req.provider, req.eventID, req.force, now, stdout)
	case "done":
		return markDone(ctx, store, req.provider, req.eventID, cfg.provider(req.provider).DedupeTTL, stdout)
	}
	return listStuck(ctx, store, req.olderThan, now, stdout)
}

// parseClaims reads the subcommand, its flags and its arguments.
func parseClaims(args []string, stdout, stderr io.Writer) (claimsRequest, error) {
	top := newCommand("claims", claimsUsage, stdout, stderr)
	if len(args) == 0 {
		return claimsRequest{}, top.misuse("want a command")
	}
	req := claimsRequest{sub: args[0]}
	usages := map[string]string{
		"show": claimsShowUsage, "release": claimsReleaseUsage,
		"done": claimsDoneUsage, "stuck": claimsStuckUsage,
	}
	cmd := newCommand("claims "+req.sub, usages[req.sub], stdout, stderr)
	want := 2 // PROVIDER EVENT_ID
	switch req.sub {
	case "help", "-h", "-help", "--help":
		top.printUsage(stdout)
		return req, flag.ErrHelp
	case "show", "done":
	case "release":
		cmd.flags.BoolVar(&req.force, "force", false, "also delete a done key: the next delivery then applies the event again")
	case "stuck":
		want = 0
		// The default is past the default HANDLER_TIMEOUT (30s) and under
		// the default CLAIM_PROCESSING_TTL (120s), older than which no claim
		// lives.
		cmd.flags.DurationVar(&req.olderThan, "older-than", time.Minute, "list processing claims older than `DURATION`")
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
	return req, nil
}

// openClaimStore reads the claims tool's configuration and connects to
// Redis; the returned func closes the connection.
func openClaimStore(environ []string) (claimsConfig, *claim.Store, func(), error) {
	cfg, err := parseEnv[claimsConfig](environ)
	if err != nil {
		return cfg, nil, nil, err
	}
	store, closeRedis, err := cfg.openStore()
	return cfg, store, closeRedis, err
}

func showClaim(ctx context.Context, store *claim.Store, provider, eventID string, now time.Time, stdout io.Writer) error {
	e, err := store.Inspect(ctx, provider, eventID)
	if errors.Is(err, claim.ErrAbsent) {
		fmt.Fprintf(stdout, "%s absent failures=%d\n", store.Key(provider, eventID), e.Failures)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, describeEntry(e, now))
	return nil
}

func releaseClaim(ctx context.Context, store *claim.Store, provider, eventID string, force bool, now time.Time, stdout io.Writer) error {
	e, err := store.ForceRelease(ctx, provider, eventID, force)
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
}

func markDone(ctx context.Context, store *claim.Store, provider, eventID string, ttl time.Duration, stdout io.Writer) error {
	if err := store.MarkDone(ctx, provider, eventID, ttl); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s marked done for %s\n", store.Key(provider, eventID), ttl)
	return nil
}

func listStuck(ctx context.Context, store *claim.Store, olderThan time.Duration, now time.Time, stdout io.Writer) error {
	stuck, err := store.Stuck(ctx, olderThan, now)
	if err != nil {
		return err
	}
	for _, e := range stuck {
		fmt.Fprintln(stdout, describeEntry(e, now))
	}
	fmt.Fprintf(stdout, "%d processing claims older than %s\n", len(stuck), olderThan)
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
		"fingerprint="+orDash(e.Fingerprint),
		// A poison event shows here: failures count its released attempts.
		"failures="+strconv.FormatInt(e.Failures, 10))
	return strings.Join(fields, " ")
}
