package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/stripe/stripe-go/v79"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// retryEvent runs a failed or dead event again through the claim, with
// the service's own configuration: the same keys, store and ledger as a
// delivery, so the outcome lands where a delivery's would. It prints one
// line: the flow's outcome and the store's effect.
func retryEvent(ctx context.Context, environ []string, provider, eventID string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	logger := newLogger(stderr, operatorLogLevel(environ, cfg.logLevel))
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	led := ledger.New(pool, cfg.PoisonAfter)
	row, err := led.Get(ctx, provider, eventID)
	if err != nil {
		return err
	}
	if row.Outcome != ledger.Failed && row.Outcome != ledger.Dead {
		return fmt.Errorf("%s %s is %s: only a failed or dead event is retried", provider, eventID, row.Outcome)
	}
	claims, closeRedis, err := cfg.openStore()
	if err != nil {
		return err
	}
	defer closeRedis()
	flow := claim.NewFlow(claims, claim.FlowConfig{
		HandlerTimeout: cfg.HandlerTimeout, PoisonAfter: cfg.PoisonAfter, Logger: logger, Ledger: led,
	})
	ep := flow.Endpoint(cfg.provider(provider))

	// fingerprinted is the body handed to the claim: the kept one is the
	// delivery's own bytes; one fetched from the API is rendered anew, so
	// it goes unfingerprinted as stripe replay's do (and a failure then
	// keeps the body already kept).
	body, fingerprinted, from := row.Body, row.Body, "the kept body"
	var ev claim.Event
	switch provider {
	case "stripe":
		api := stripeAPI(cfg, logger, nil) // only serve traces
		if api != nil {
			params := &stripe.EventParams{}
			params.Context = ctx
			se, err := api.Events.Get(eventID, params)
			if err != nil {
				return fmt.Errorf("retrieve event %s from Stripe: %w", eventID, err)
			}
			body, fingerprinted, from = se.LastResponse.RawJSON, nil, "Stripe's API"
		}
		if body == nil {
			return fmt.Errorf("stripe %s: no body kept and no STRIPE_API_KEY to retrieve it", eventID)
		}
		receiver := stripehook.New(stripehook.Config{Store: entitlements.NewStore(pool, nil), API: api, Logger: logger})
		ev, err = receiver.Event(body)
	case "resend":
		if body == nil {
			return fmt.Errorf("resend %s: no body kept", eventID)
		}
		ev, err = resendhook.New(resendhook.Config{
			Queue: support.NewQueue(pool), Webhook: cfg.resendWebhook,
			APIKey: string(cfg.ResendAPIKey), APIURL: cfg.resendAPIURL,
			Inbound: cfg.inbound, Logger: logger, AttachmentMaxBytes: cfg.SupportAttachmentMaxBytes,
			DownloadAllowPrivate: cfg.ResendDownloadAllowPrivate,
		}).Event(eventID, body)
	}
	if err != nil {
		return fmt.Errorf("%s %s from %s: %w", provider, eventID, from, err)
	}
	res, err := ep.Process(ctx, fingerprinted, ev)
	line := fmt.Sprintf("%s %s from %s: %s", provider, eventID, from, res.Outcome)
	if res.Effect != "" {
		line += " (" + string(res.Effect) + ")"
	}
	fmt.Fprintln(stdout, line)
	if err != nil {
		return fmt.Errorf("%s %s: %w", provider, eventID, err)
	}
	if res.Outcome != claim.Processed && res.Outcome != claim.Duplicate && res.Outcome != claim.Ignored {
		return fmt.Errorf("%s %s: %s", provider, eventID, res.Outcome)
	}
	return nil
}

// operatorLogLevel is the level of a command a person runs in a terminal:
// the delivery's own info lines (JSON, for the service's log pipeline)
// would only bury the one line it prints, so unless LOG_LEVEL asks for
// them, only warnings and errors are logged.
func operatorLogLevel(environ []string, level slog.Level) slog.Level {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "LOG_LEVEL=") {
			return level
		}
	}
	return max(level, slog.LevelWarn)
}
