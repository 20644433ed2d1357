package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// AccessConfig is the read API's part of the configuration. Exported only
// because caarlos0/env cannot set the fields of an unexported embedded
// struct.
type AccessConfig struct {
	// AppAPIToken holds the bearer tokens of GET /v1/access,
	// comma-separated (several, for rotation); empty: the API is off.
	AppAPIToken secret `env:"APP_API_TOKEN"`
}

// minAPIToken is the shortest token accepted: 16 bytes is 128 bits when
// random, as openssl rand -hex 16 gives.
const minAPIToken = 16

// apiTokens is APP_API_TOKEN split, without blanks.
func (c AccessConfig) apiTokens() []string {
	var out []string
	for t := range strings.SplitSeq(string(c.AppAPIToken), ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// check never quotes a token.
func (c AccessConfig) check(add addProblem) {
	if strings.TrimSpace(string(c.AppAPIToken)) != "" && len(c.apiTokens()) == 0 {
		add("APP_API_TOKEN has no token: want comma-separated tokens such as $(openssl rand -hex 32), or empty to turn GET /v1/access off")
	}
	for i, t := range c.apiTokens() {
		if len(t) < minAPIToken {
			add("APP_API_TOKEN's token %d is shorter than %d characters: want random tokens such as $(openssl rand -hex 32)", i+1, minAPIToken)
		}
	}
}

// accessAPI is GET /v1/access, or nil when APP_API_TOKEN is empty (the
// route is then not served: 404).
func accessAPI(cfg config, pool *pgxpool.Pool, logger *slog.Logger) http.Handler {
	tokens := cfg.apiTokens()
	if len(tokens) == 0 {
		logger.Info("GET /v1/access is off (APP_API_TOKEN is empty)")
		return nil
	}
	where := "METRICS_ADDR"
	if cfg.MetricsAddr == "" {
		where = "LISTEN_ADDR"
	}
	logger.Info("GET /v1/access is served", "listener", where, "tokens", len(tokens))
	return access.NewAPI(access.NewStore(pool), tokens, logger)
}

// relayRun is what runRelay runs under the relay's lease.
type relayRun func(ctx context.Context, fence relay.Fence) error

// withExpiry runs run and, when the app asked for access.changed, the
// pass that sends the ends of access, together under one lease: both
// stop when either stops, and the first error is returned.
func withExpiry(run relayRun, expiry *relay.Expiry) relayRun {
	if expiry == nil {
		return run
	}
	return func(ctx context.Context, fence relay.Fence) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errs := make(chan error, 2)
		go func() { errs <- run(ctx, fence) }()
		go func() { errs <- expiry.Run(ctx, fence) }()
		first := <-errs
		cancel()
		if second := <-errs; first == nil {
			first = second
		}
		return first
	}
}

// expiry is the pass that sends the ends of access, or nil when the app
// did not ask for access.changed.
func (c config) expiry(pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) *relay.Expiry {
	if c.appWebhook == nil || !c.appWebhook.Access() {
		return nil
	}
	return relay.NewExpiry(relay.ExpiryConfig{
		Pool: pool, App: c.appWebhook, Answers: access.NewStore(pool), Logger: logger, Registerer: reg,
	})
}

const backfillUsage = `usage: munchable-webhooks relay backfill app_webhook [--rate N] [--after CURSOR]

Sends every customer's current access answer to APP_WEBHOOK_URL once, as
access.changed (APP_WEBHOOK_KINDS must include access; app_access, the
consumer that sends access.changed, is accepted too), in stripe_customer_id
order, at most N a second (default 10): for an app that turns access on after
the fact. Needs the service's configuration. Prints progress to stderr, and a
summary JSON line to stdout ({"customers", "delivered", "failed": [ids],
"next"}); --after resumes from a summary's next. Exit 1 when any failed.`

func backfillCommand(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cmd := newCommand("relay backfill", backfillUsage, stdout, stderr)
	rate := cmd.flags.Float64("rate", 10, "answers a second at most")
	after := cmd.flags.String("after", "", "start after this customer (a summary's next)")
	pos, err := cmd.parse(args, 1)
	if err != nil {
		return err
	}
	if pos[0] != relay.AppWebhookConsumer && pos[0] != relay.AppAccessConsumer {
		return cmd.misuse("consumer %q: only app_webhook (app_access) has answers to backfill", pos[0])
	}
	if *rate <= 0 || *rate > 1000 {
		return cmd.misuse("--rate %v: want answers a second, above 0 and at most 1000", *rate)
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	if cfg.appWebhook == nil || !cfg.appWebhook.Access() {
		return errors.New("relay backfill: APP_WEBHOOK_URL is empty or APP_WEBHOOK_KINDS lacks access: want the app's webhook with access among its kinds")
	}
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := relay.Backfill(ctx, relay.BackfillConfig{
		App: cfg.appWebhook, Answers: access.NewStore(pool), Rate: *rate,
		Progress: func(r relay.BackfillResult) {
			fmt.Fprintf(stderr, "backfill: %d customers, %d delivered, %d failed\n", r.Customers, r.Delivered, len(r.Failed))
		},
	}, *after)
	if encErr := jsonLines(stdout).Encode(res); encErr != nil && err == nil {
		err = encErr
	}
	if err != nil {
		return fmt.Errorf("relay backfill: %w", err)
	}
	if len(res.Failed) > 0 {
		return fmt.Errorf("relay backfill: %d of %d answers not delivered: %w", len(res.Failed), res.Customers, errNotDelivered)
	}
	return nil
}

// publicAccess is GET /v1/access on the public listener: only when
// METRICS_ADDR is empty (else it is served there, beside /metrics).
func publicAccess(cfg config, api http.Handler) http.Handler {
	if cfg.MetricsAddr != "" {
		return nil
	}
	return api
}
