package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/mail"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/leader"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// RelayConfig is the relay's part of the configuration: its retries and
// its consumers' far sides. Exported only because caarlos0/env cannot set
// the fields of an unexported embedded struct.
type RelayConfig struct {
	RelayRetrySchedule []time.Duration `env:"RELAY_RETRY_SCHEDULE" envDefault:"5s,5m,30m,2h,5h,10h,10h"`
	// SupportForwardTo empty: forwarding is off.
	SupportForwardTo   []string `env:"SUPPORT_FORWARD_TO"`
	SupportForwardFrom string   `env:"SUPPORT_FORWARD_FROM"`
	SupportForwardRate float64  `env:"SUPPORT_FORWARD_RATE" envDefault:"2"`
}

func (c RelayConfig) check(add addProblem) {
	if len(c.RelayRetrySchedule) == 0 {
		add("RELAY_RETRY_SCHEDULE is empty: want comma-separated waits such as 5s,5m,30m,2h,5h,10h,10h")
	}
	for _, d := range c.RelayRetrySchedule {
		if d <= 0 {
			add("RELAY_RETRY_SCHEDULE has %s: want positive waits such as 5s,5m,30m,2h,5h,10h,10h", d)
			break
		}
	}
	if len(c.SupportForwardTo) == 0 {
		return
	}
	for _, to := range c.SupportForwardTo {
		if a, err := mail.ParseAddress(strings.TrimSpace(to)); err != nil || a.Name != "" {
			add("SUPPORT_FORWARD_TO has %q: want comma-separated addresses such as support-team@munchable.app", to)
		}
	}
	from, err := mail.ParseAddress(c.SupportForwardFrom)
	switch {
	case strings.TrimSpace(c.SupportForwardFrom) == "":
		add("SUPPORT_FORWARD_FROM is required with SUPPORT_FORWARD_TO: want the sender, on a domain verified in Resend, such as Munchable Support <support-forward@munchable.app>")
	case err != nil:
		add("SUPPORT_FORWARD_FROM is %q: want an address such as Munchable Support <support-forward@munchable.app>", c.SupportForwardFrom)
	case slices.ContainsFunc(c.SupportForwardTo, func(to string) bool { return strings.EqualFold(strings.TrimSpace(to), from.Address) }):
		add("SUPPORT_FORWARD_FROM must not be one of SUPPORT_FORWARD_TO (each forward would come back and be skipped as a loop): want a sender address of its own, such as support-forward@munchable.app")
	}
	if c.SupportForwardRate <= 0 || c.SupportForwardRate > 100 {
		add("SUPPORT_FORWARD_RATE is %v: want sends a second, above 0 and at most 100, such as 2 (Resend's default team limit)", c.SupportForwardRate)
	}
}

// relayConfig is what relay.New builds the relay from.
func (c config) relayConfig(pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) relay.Config {
	var to []string
	for _, a := range c.SupportForwardTo {
		to = append(to, strings.TrimSpace(a))
	}
	var consumers []relay.Consumer
	if c.appWebhook != nil {
		consumers = append(consumers, relay.AppConsumers(c.appWebhook, access.NewStore(pool))...)
	}
	return relay.Config{
		Pool:      pool,
		Consumers: consumers,
		Forward: relay.ForwardConfig{
			To: to, From: c.SupportForwardFrom, Rate: c.SupportForwardRate,
			APIURL: c.resendAPIURL, APIKey: string(c.ResendAPIKey),
		},
		Schedule:   c.RelayRetrySchedule,
		Retention:  c.EventsRetention,
		Logger:     logger,
		Registerer: reg,
	}
}

// runRelay runs the relay on one replica at a time until ctx ends, under
// the lease "relay" in leader_leases (taken over the pool, so any pooler
// will do). Every record the relay writes checks the lease's fence in its
// own transaction, so a replica that lost the lease (frozen, partitioned)
// records nothing more once another holds it. A replica tries to take the
// lease as often as a holder renews it (TTL/3): a stopped holder is
// replaced within 4/3 of the TTL.
func runRelay(ctx context.Context, run relayRun, pool *pgxpool.Pool, cfg leader.LeaseConfig, logger *slog.Logger) {
	lease := leader.NewLease(pool, "relay", cfg)
	for {
		ran, err := lease.TryRun(ctx, func(runCtx context.Context, f leader.Fence) error {
			logger.Info("relay: this replica runs it", "token", f.Token())
			return run(runCtx, f.Check)
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			logger.Error("relay stopped", "ran", ran, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.Renew()):
		}
	}
}

const relayUsage = `usage: munchable-webhooks relay COMMAND [flags] ARGS

Reads and retries the relay's deliveries (relay_deliveries in DATABASE_URL):
one row per consumer (forward: support messages to SUPPORT_FORWARD_TO;
app_webhook: changes to the app; app_access: access.changed to the app, when
APP_WEBHOOK_KINDS has access) and change it sent or holds back.

commands:
  list [--consumer C] [--state S]
                           one JSON line per delivery, by consumer and change; S is
                           pending, delivered, failed, dead or skipped
  retry CONSUMER CHANGE_ID run a failed or dead delivery again at once, with the same
                           identity as its first try (Resend's Idempotency-Key, the
                           webhook-id); needs the service's configuration; prints the
                           delivery as it now stands; exit 1 unless it was delivered
                           (or skipped)
  retry --consumer C --state S [--since D] [--rate N]
                           run every failed or dead delivery of C again (S: failed or
                           dead; taken within D, a DURATION such as 72h or an RFC 3339
                           time), by change so each subject in order, N a second; one
                           JSON line per delivery as it now stands, progress and a
                           summary on stderr; stops after 10 failures in a row; exit 1
                           unless every one was delivered (or skipped)
  backfill app_webhook [--rate N] [--after CURSOR]
                           send every customer's current access answer to the app
                           once (access.changed), paced; see relay backfill -h

A change delivered at its first try has one row, delivered, kept for
EVENTS_RETENTION like every finished delivery; failed, dead and pending
ones are kept until they are delivered.`

func relayCommand(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	top := newCommand("relay", relayUsage, stdout, stderr)
	if len(args) == 0 {
		return top.misuse("want a command")
	}
	cmd := newCommand("relay "+args[0], relayUsage, stdout, stderr)
	switch args[0] {
	case "help", "-h", "-help", "--help":
		top.printUsage(stdout)
		return flag.ErrHelp
	case "list":
		consumer := cmd.flags.String("consumer", "", "only this consumer's deliveries")
		state := cmd.flags.String("state", "", "only deliveries in this state")
		if _, err := cmd.parse(args[1:], 0); err != nil {
			return err
		}
		if *state != "" && !slices.Contains(relay.States, relay.State(*state)) {
			return cmd.misuse("--state %q: want pending, delivered, failed, dead or skipped", *state)
		}
		return listDeliveries(ctx, environ, *consumer, relay.State(*state), stdout, stderr)
	case "backfill":
		return backfillCommand(ctx, args[1:], environ, stdout, stderr)
	case "retry":
		var f relay.RetryFilter
		var state, since string
		cmd.flags.StringVar(&f.Consumer, "consumer", "", "retry every matching delivery of this consumer")
		cmd.flags.StringVar(&state, "state", "", "with --consumer: failed or dead")
		cmd.flags.StringVar(&since, "since", "", "with --consumer: only deliveries taken within this `DURATION` (such as 72h) or since this RFC 3339 time")
		cmd.flags.Float64Var(&f.Rate, "rate", 10, "with --consumer: attempts a second at most")
		pos, err := cmd.parse(args[1:], -1)
		if err != nil {
			return err
		}
		if f.Consumer != "" || state != "" {
			if len(pos) != 0 {
				return cmd.misuse("want CONSUMER CHANGE_ID or --consumer C --state S, not both")
			}
			if err := f.Parse(state, since, time.Now()); err != nil {
				return cmd.misuse("%v", err)
			}
			return retryDeliveries(ctx, environ, f, stdout, stderr)
		}
		if len(pos) != 2 {
			return cmd.misuse("want CONSUMER CHANGE_ID, or --consumer C --state S")
		}
		changeID, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil || changeID <= 0 {
			return cmd.misuse("CHANGE_ID %q: want the change's id, as relay list prints it", pos[1])
		}
		return retryDelivery(ctx, environ, pos[0], changeID, stdout, stderr)
	}
	return top.misuse("unknown command %q", args[0])
}

func listDeliveries(ctx context.Context, environ []string, consumer string, state relay.State, stdout, stderr io.Writer) error {
	cfg, err := parseEnv[changesConfig](environ) // DATABASE_URL alone
	if err != nil {
		return err
	}
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	enc, n := jsonLines(stdout), 0
	err = relay.List(ctx, pool, consumer, state, func(d relay.Delivery) error {
		n++
		return enc.Encode(d)
	})
	// On stderr, so that stdout stays one JSON object a line; an empty
	// list then still says it looked.
	if err == nil {
		fmt.Fprintf(stderr, "%d deliveries\n", n)
	}
	return err
}

// errNotDelivered: relay retry ran, and the delivery failed again.
var errNotDelivered = errors.New("not delivered")

// commandRelay is the relay as relay retry runs it: built from the
// service's configuration, its loop not running, logging a failed attempt
// to stderr and tracing each attempt (the OTEL_* variables) as the
// service would. closeIt closes its pool and flushes its spans.
func commandRelay(ctx context.Context, environ []string, stderr io.Writer) (r *relay.Relay, closeIt func(), err error) {
	cfg, err := loadConfig(environ)
	if err != nil {
		return nil, nil, err
	}
	tp, logger, stopTracing, err := startTracing(ctx, environ, newLogger(stderr, operatorLogLevel(environ, cfg.logLevel)))
	if err != nil {
		return nil, nil, err
	}
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		stopTracing()
		return nil, nil, err
	}
	rc := cfg.relayConfig(pool, logger, nil)
	rc.Tracer = tp
	return relay.New(rc), func() { pool.Close(); stopTracing() }, nil
}

func retryDelivery(ctx context.Context, environ []string, consumer string, changeID int64, stdout, stderr io.Writer) error {
	r, closeIt, err := commandRelay(ctx, environ, stderr)
	if err != nil {
		return err
	}
	defer closeIt()
	d, err := r.Retry(ctx, consumer, changeID)
	if err != nil {
		return err
	}
	if err := jsonLines(stdout).Encode(d); err != nil {
		return err
	}
	if d.State != relay.Delivered && d.State != relay.Skipped {
		return fmt.Errorf("relay retry %s %d: %s: %w", consumer, changeID, d.State, errNotDelivered)
	}
	return nil
}

// retryDeliveries runs relay retry --consumer: every delivery f matches,
// printed as it now stands, with progress and a summary on stderr.
func retryDeliveries(ctx context.Context, environ []string, f relay.RetryFilter, stdout, stderr io.Writer) error {
	r, closeIt, err := commandRelay(ctx, environ, stderr)
	if err != nil {
		return err
	}
	defer closeIt()
	enc := jsonLines(stdout)
	done := 0
	sum, err := r.RetryMatching(ctx, f, func(d relay.Delivery, err error) {
		done++
		if err != nil {
			fmt.Fprintf(stderr, "relay retry: change %d: %v\n", d.ChangeID, err)
			return
		}
		_ = enc.Encode(d)
		if done%100 == 0 {
			fmt.Fprintf(stderr, "relay retry: %d done\n", done)
		}
	})
	fmt.Fprintf(stderr, "relay retry %s --state %s: %d matched, %d attempted: %s; %d left waiting for an older change of their subject\n",
		f.Consumer, f.State, sum.Matched, sum.Attempted, summaryStates(sum.States), sum.Waiting)
	if err != nil {
		return err
	}
	if sum.Attempted != sum.States[relay.Delivered]+sum.States[relay.Skipped] || sum.Waiting > 0 {
		return fmt.Errorf("relay retry %s --state %s: %w", f.Consumer, f.State, errNotDelivered)
	}
	return nil
}

// summaryStates prints a summary's counts by state, in a delivery's order.
func summaryStates(states map[relay.State]int) string {
	var parts []string
	for _, s := range relay.States {
		if n := states[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
