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
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/resend/resend-go/v3"
	svix "github.com/svix/svix-webhooks/go"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// Config is what a Receiver works with; the values are parsed and checked
// by the caller (the service's configuration), once.
type Config struct {
	// Queue is where support mail goes.
	Queue *support.Queue
	// Webhook verifies svix signatures with the RESEND_WEBHOOK_SECRET.
	Webhook *svix.Webhook
	APIKey  string
	// APIURL is the base URL of the Resend API, e.g. https://api.resend.com.
	APIURL *url.URL
	// Inbound are the support addresses: mail to anyone else is ignored.
	Inbound Inbound
	// AttachmentMaxBytes is the largest attachment whose content is stored
	// (SUPPORT_ATTACHMENT_MAX_BYTES); a larger one is recorded without it,
	// and 0 stores none.
	AttachmentMaxBytes int64
	// InflightBytes (MAIL_INFLIGHT_BYTES) bounds the bytes all mail
	// deliveries and sweeps hold at once (answers, attachment lists,
	// downloads in memory and on disk); 0: no bound.
	InflightBytes int64
	// DownloadAllowPrivate (RESEND_DOWNLOAD_ALLOW_PRIVATE) lets downloads
	// use http and dial any address: for tests and private mirrors only.
	DownloadAllowPrivate bool
	// A nil Logger discards; a nil Registerer leaves the metrics unregistered.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Tracer, when not nil, makes each call to the Resend API and each
	// attachment download a client span (internal/tracing); nil: none.
	Tracer trace.TracerProvider
}

type handler struct {
	queue       *support.Queue
	wh          *svix.Webhook
	client      *resend.Client
	downloads   downloader
	inbound     Inbound
	logger      *slog.Logger
	ignored     prometheus.Counter
	unfetchable prometheus.Counter
	mail        mailMetrics
	// budget bounds the bytes all mail in flight holds at once.
	budget *mailBudget
}

// Receiver turns Resend's deliveries into support messages. It wraps the
// handler that the fetch and attachment code hang off.
type Receiver struct{ h *handler }

// Handler answers POST /webhooks/resend. It is a type of its own, not an
// http.Handler, so that a router cannot be handed another provider's
// handler for this route and still compile. Like http.HandlerFunc it is
// the func itself: the type costs no call.
type Handler func(http.ResponseWriter, *http.Request)

func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h(w, r) }

// Handler answers Resend's deliveries through ep.
func (r *Receiver) Handler(ep *claim.Endpoint) Handler {
	return Handler(ep.Handler(r.h.decode))
}

// Event decodes a kept body (events retry) into the event a delivery of it
// with svix-id id would run: the same reading, filter and apply, without
// the signature check, which the body passed when it first arrived.
func (r *Receiver) Event(id string, body []byte) (claim.Event, error) {
	return r.h.event(id, body)
}

// New returns a Receiver and registers its metrics.
func New(cfg Config) *Receiver {
	h := &handler{
		queue:  cfg.Queue,
		wh:     cfg.Webhook,
		client: newClient(cfg.APIURL, cfg.APIKey, cfg.Tracer),
		downloads: downloader{
			client:       newDownloadClient(cfg.DownloadAllowPrivate, cfg.Tracer),
			max:          cfg.AttachmentMaxBytes,
			allowPrivate: cfg.DownloadAllowPrivate,
		},
		inbound: cfg.Inbound,
		logger:  cfg.Logger,
		budget:  newMailBudget(cfg.InflightBytes),
		ignored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "resend_inbound_ignored_total",
			Help: "email.received events addressed to no support address, acknowledged without a fetch.",
		}),
		unfetchable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "resend_emails_unfetchable_total",
			Help: "Fetches of an announced received email that the Resend API answered 404 or with another email: the delivery failed.",
		}),
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	h.mail = newMailMetrics()
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(h.ignored, h.unfetchable, h.mail.truncated, h.budget.busy, h.budget.gauge)
	}
	return &Receiver{h: h}
}

// decode verifies the signature on the raw bytes, then reads the event:
// anything but an email.received for a support address is ignored.
func (h *handler) decode(header http.Header, body []byte) (claim.Event, error) {
	// Verify applies the library's 5 minute tolerance on svix-timestamp.
	if err := h.wh.Verify(body, header); err != nil {
		return claim.Event{}, verifyError(err)
	}
	return h.event(messageID(header), body)
}

// event reads a verified body delivered under svix-id id.
func (h *handler) event(id string, body []byte) (claim.Event, error) {
	out := claim.Event{ID: id}
	ev, err := decode(body)
	if err != nil {
		return claim.Event{}, fmt.Errorf("%w: %w", claim.ErrMalformed, err)
	}
	out.Type = ev.Type
	if ev.Type != typeReceived {
		return out, nil
	}
	d, err := ev.mail()
	if err != nil {
		return claim.Event{}, fmt.Errorf("%w: %w", claim.ErrMalformed, err)
	}
	// Resend's webhook is per account, not per domain: mail to anyone else
	// is none of our business, and not worth an API call.
	to, ok := h.inbound.match(d.recipients())
	if !ok {
		h.ignored.Inc()
		return out, nil
	}
	logger := h.logger.With("provider", "resend", "event_id", out.ID, "event_type", ev.Type, "email_id", d.EmailID)
	entry := &ledger.Entry{Provider: "resend", EventID: out.ID, Type: ev.Type}
	out.Apply = func(ctx context.Context) (claim.Effect, error) {
		return h.apply(ctx, logger, entry, d, to)
	}
	return out, nil
}

// verifyError names why svix refused a delivery. The library's errors are
// unexported, so its two timestamp errors are told apart by their text.
func verifyError(err error) error {
	switch err.Error() {
	case "Message timestamp too old", "Message timestamp too new":
		return fmt.Errorf("svix signature: %w: %w", claim.ErrTimestamp, err)
	}
	return fmt.Errorf("svix signature: %w: %w", claim.ErrSignature, err)
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

// apply fetches the email and its attachments, then queues them in one
// transaction that only writes: no network call runs while it holds a
// Postgres connection. An error fails the delivery (500, claim released,
// Svix retries): the API's 5xx, 429, a network error, the handler
// deadline, a failed download, and a 404 or an answer that is not the
// announced email, which mean a wrong RESEND_API_URL or another team's API
// key, never a mail to drop. A message already queued (an earlier
// delivery, or the same mail under another svix-id) is unchanged.
//
// The event's ledger row is written in the queue's transaction (entry).
func (h *handler) apply(ctx context.Context, logger *slog.Logger, entry *ledger.Entry, d receivedData, to string) (claim.Effect, error) {
	// Everything this mail holds is drawn from the mail budget, and given
	// back once it is queued (or not): after the temporary files go.
	held := h.budget.hold()
	defer held.release()
	a, err := fetchEmail(ctx, h.client, d.EmailID, held)
	if errors.Is(err, errNotFound) || errors.Is(err, errNotTheEmail) {
		h.unfetchable.Inc()
	}
	if err != nil {
		return "", fmt.Errorf("fetch received email %s: %w", d.EmailID, err)
	}
	h.mail.report(ctx, logger, a)
	atts, err := h.attachmentsOf(ctx, &a.email, held)
	if err != nil {
		return "", err
	}
	defer atts.Close()
	id, inserted, err := h.queue.EnqueueFor(ctx, entry, toMessage(d, &a, to, time.Now()), atts.write)
	if err != nil {
		return "", err
	}
	logger.DebugContext(ctx, "support message enqueued", "support_message_id", id, "inserted", inserted)
	if !inserted {
		return claim.Unchanged, nil
	}
	return claim.Applied, nil
}
