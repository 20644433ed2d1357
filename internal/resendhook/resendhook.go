// Package resendhook receives Resend webhooks: it verifies each delivery's
// Svix signature, picks out the inbound mail addressed to support, fetches
// its body from the Resend API and queues it as a support message, all
// through the claim flow.
package resendhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/resend/resend-go/v3"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// Config configures the handler.
type Config struct {
	Secret string // whsec_... Svix signing secret
	APIKey string
	// APIURL is the base URL of the Resend API, e.g. https://api.resend.com.
	APIURL string
	// Inbound are the SUPPORT_INBOUND_ADDRESSES entries: "support@munchable.app"
	// or "@inbound.munchable.app", case-insensitive.
	Inbound    []string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

type handler struct {
	ep          *claim.Endpoint
	queue       *support.Queue
	wh          *svix.Webhook
	client      *resend.Client
	inbound     inbound
	logger      *slog.Logger
	ignored     prometheus.Counter
	unfetchable prometheus.Counter
}

// NewHandler returns the handler of POST /webhooks/resend.
func NewHandler(ep *claim.Endpoint, queue *support.Queue, cfg Config) (http.Handler, error) {
	if cfg.Secret == "" {
		return nil, errors.New("resend webhook secret is empty")
	}
	wh, err := svix.NewWebhook(cfg.Secret)
	if err != nil {
		// Not %w: the decoder's error could quote the secret.
		return nil, errors.New("resend webhook secret is not a whsec_ signing secret")
	}
	if cfg.APIKey == "" {
		return nil, errors.New("resend API key is empty")
	}
	client, err := newClient(cfg.APIURL, cfg.APIKey)
	if err != nil {
		return nil, err
	}
	in, err := parseInbound(cfg.Inbound)
	if err != nil {
		return nil, fmt.Errorf("support inbound addresses: %w", err)
	}
	h := &handler{
		ep:      ep,
		queue:   queue,
		wh:      wh,
		client:  client,
		inbound: in,
		logger:  cfg.Logger,
		ignored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "resend_inbound_ignored_total",
			Help: "email.received events addressed to no support address, acknowledged without a fetch.",
		}),
		unfetchable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "resend_emails_unfetchable_total",
			Help: "Received emails the Resend API answered 404 for, acknowledged without a support message.",
		}),
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{h.ignored, h.unfetchable} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register resend metrics: %w", err)
			}
		}
	}
	return h, nil
}

// ServeHTTP follows STYLE.md rule 4: cap and read the body, verify the
// signature on the raw bytes, and only then decode, claim and apply.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	pooled, err := claim.ReadPooledBody(w, r)
	if err != nil {
		h.ep.Reject(w, r, err)
		return
	}
	// Released once answered: decoding copies what it keeps (RawMessage
	// included) and the flow only fingerprints the body.
	defer pooled.Release()
	body := pooled.Bytes()
	// Verify applies the library's 5 minute tolerance on svix-timestamp.
	if err := h.wh.Verify(body, r.Header); err != nil {
		h.ep.Reject(w, r, fmt.Errorf("svix signature: %w", err))
		return
	}
	eventID := messageID(r.Header)
	ev, err := decode(body)
	if err != nil {
		h.ep.Reject(w, r, err)
		return
	}
	if ev.Type != typeReceived {
		h.ep.Ignore(w, r, eventID, ev.Type)
		return
	}
	d, err := ev.mail()
	if err != nil {
		h.ep.Reject(w, r, err)
		return
	}
	// Resend's webhook is per account, not per domain: mail to anyone else
	// is none of our business, and not worth an API call.
	to, ok := h.inbound.match(d.recipients())
	if !ok {
		h.ignored.Inc()
		h.ep.Ignore(w, r, eventID, ev.Type)
		return
	}
	logger := h.logger.With("provider", "resend", "event_id", eventID, "event_type", ev.Type, "email_id", d.EmailID)
	h.ep.Serve(w, r, claim.Delivery{
		EventID:   eventID,
		EventType: ev.Type,
		Body:      body,
		Apply: func(ctx context.Context) error {
			return h.apply(ctx, logger, d, to)
		},
	})
}

// messageID is the delivery's id as the signature covered it. svix's Verify
// reads the svix-* headers when all three are present and the webhook-*
// ones otherwise; the id must come from the same set, or a captured
// delivery could be replayed under another message's svix-id (with its own
// webhook-* signature) and mark that message done before it arrives.
func messageID(h http.Header) string {
	if h.Get("svix-id") != "" && h.Get("svix-signature") != "" && h.Get("svix-timestamp") != "" {
		return h.Get("svix-id")
	}
	return h.Get("webhook-id")
}

// apply fetches the email and queues it. An error fails the delivery (500,
// claim released, Svix retries): the API's 5xx, 429, a network error or the
// handler deadline. A 404 is final, so it is acknowledged.
func (h *handler) apply(ctx context.Context, logger *slog.Logger, d receivedData, to string) error {
	email, err := h.client.Emails.Receiving.GetWithContext(ctx, d.EmailID)
	if errors.Is(err, errEmailNotFound) {
		h.unfetchable.Inc()
		logger.WarnContext(ctx, "received email not found at Resend: acknowledged without a support message")
		return nil
	}
	if err != nil {
		return fmt.Errorf("fetch received email %s: %w", d.EmailID, err)
	}
	id, inserted, err := h.queue.Enqueue(ctx, toMessage(d, email, to, time.Now()))
	if err != nil {
		return err
	}
	logger.DebugContext(ctx, "support message enqueued", "support_message_id", id, "inserted", inserted)
	return nil
}
