// Package stripehook receives Stripe events: it verifies each delivery's
// signature, reads the handled event types defensively across API
// versions, and hands them to the claim flow to become entitlements,
// features and checkout sessions. It is also where the service reads
// Stripe's API (NewAPI, Lister): to settle what a payload cannot, complete
// truncated lists, and for stripe sync and replay.
package stripehook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v79/client"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// Tolerance is how far a signature's timestamp may be from now, in either
// direction.
const Tolerance = 300 * time.Second

// Config is what a Receiver works with.
type Config struct {
	Store *entitlements.Store
	// Secret is the endpoint's signing secret (STRIPE_WEBHOOK_SECRET,
	// whsec_...). Only Handler and Decoder use it: replay decodes events
	// the API authenticated.
	Secret string
	// API, when not nil (STRIPE_API_KEY set), settles unordered events and
	// completes truncated feature and item lists by asking Stripe.
	API        *client.API
	Logger     *slog.Logger // nil discards
	Registerer prometheus.Registerer
}

// Receiver turns Stripe events into writes. The webhook and stripe replay
// share it.
type Receiver struct {
	store     *entitlements.Store
	secret    string
	api       *client.API
	logger    *slog.Logger
	thin      prometheus.Counter
	truncated prometheus.Counter
	// itemsIncomplete counts subscriptions stored with a cut item list.
	itemsIncomplete prometheus.Counter
	apiVersions     *prometheus.CounterVec
}

// New returns a Receiver and registers its metrics.
func New(cfg Config) *Receiver {
	r := &Receiver{
		store:  cfg.Store,
		secret: cfg.Secret,
		api:    cfg.API,
		logger: cfg.Logger,
		thin: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stripe_thin_events_total",
			Help: "Thin events (object v2.core.event) acknowledged and ignored.",
		}),
		truncated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "customer_features_incomplete_total",
			Help: "Feature summaries stored incomplete: the event's list was truncated and no STRIPE_API_KEY was set to fetch the rest.",
		}),
		itemsIncomplete: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "entitlement_items_incomplete_total",
			Help: "Subscription events stored with only the items they carried: Stripe cut the item list short (has_more) and no STRIPE_API_KEY was set to list the rest.",
		}),
		apiVersions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webhook_stripe_api_version_total",
			Help: "Stripe events decoded (webhook deliveries, and events stripe replay and the sweep read from the API) by the API version Stripe rendered them in; other: a value not spelled as Stripe spells versions. Thin events carry none and are not counted.",
		}, []string{"api_version"}),
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.thin, r.truncated, r.itemsIncomplete, r.apiVersions)
	}
	return r
}

// Handler answers POST /webhooks/stripe. It is a type of its own, not an
// http.Handler, so that a router cannot be handed another provider's
// handler for this route and still compile. Like http.HandlerFunc it is
// the func itself: the type costs no call.
type Handler func(http.ResponseWriter, *http.Request)

func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h(w, r) }

// Handler answers Stripe's deliveries through ep.
func (r *Receiver) Handler(ep *claim.Endpoint) Handler {
	return Handler(ep.Handler(r.Decoder()))
}

// Decoder is the handler's own verify-and-decode step. tools/bench's
// ceiling runs exactly this and stops before the claim.
func (r *Receiver) Decoder() claim.Decode {
	return func(h http.Header, body []byte) (claim.Event, error) {
		if err := verify(body, h.Get("Stripe-Signature"), r.secret, time.Now()); err != nil {
			return claim.Event{}, err
		}
		return r.decode(body)
	}
}

// Event decodes an event body already authenticated some other way (stripe
// replay reads it from the API) into what the claim runs.
func (r *Receiver) Event(body []byte) (claim.Event, error) {
	return r.decode(body)
}

// applier wraps an event's write: the one place an unordered event is
// logged, and the store's verdict becomes the flow's effect.
func (r *Receiver) applier(ev claim.Event, apply applyFunc) func(context.Context) (claim.Effect, error) {
	return func(ctx context.Context) (claim.Effect, error) {
		res, err := apply(ctx)
		if err != nil {
			return "", fmt.Errorf("apply %s: %w", ev.ID, err)
		}
		if res.Verdict == entitlements.Unordered {
			r.logger.Warn("unordered same-second event kept out: set STRIPE_API_KEY to settle such events from the API",
				"event_id", ev.ID, "event_type", ev.Type, "stored_event_id", res.StoredEventID, "differs", res.Differs)
		}
		return effect(res.Verdict), nil
	}
}

// effect spells the store's verdict as the flow's effect. A state read
// from Stripe and stored (Revalidated) is applied: a write happened.
func effect(v entitlements.Verdict) claim.Effect {
	switch v {
	case entitlements.Unchanged:
		return claim.Unchanged
	case entitlements.Stale:
		return claim.Stale
	case entitlements.Unordered:
		return claim.Unordered
	}
	return claim.Applied
}

// verify checks the signature only: stripe-go's ConstructEvent would also
// decode the whole event into its own type and refuse other API versions.
// stripe-go bounds a timestamp's age but not how far ahead it is; a
// signature dated years ahead would stay replayable until then, so that
// side is bounded here with the same tolerance, on the t= the signature
// covers.
func verify(body []byte, header, secret string, now time.Time) error {
	t, err := signedAt(header)
	if err != nil {
		return fmt.Errorf("stripe signature: %w: %w", claim.ErrSignature, err)
	}
	err = webhook.ValidatePayloadWithTolerance(body, header, secret, Tolerance)
	switch {
	case err == nil:
	case errors.Is(err, webhook.ErrTooOld):
		return fmt.Errorf("stripe signature: %w: %w", claim.ErrTimestamp, err)
	default:
		return fmt.Errorf("stripe signature: %w: %w", claim.ErrSignature, err)
	}
	if t.Sub(now) > Tolerance {
		return fmt.Errorf("stripe signature: %w: signed %s ahead", claim.ErrTimestamp, t.Sub(now).Round(time.Second))
	}
	return nil
}

var errTimestamps = errors.New("more than one t= in the header")

// signedAt reads the t= of a Stripe-Signature header, the time its
// signature covers. A header with more than one t= is refused: stripe-go
// verifies against the last, so any other one could carry a time the
// signature does not cover. Stripe sends exactly one, so such a header is
// forged or mangled, and it counts as a bad signature rather than a
// timestamp, whose refusals mean a clock off or a delivery replayed late.
// A header without t=, or with a t= that is no number, is left to
// stripe-go to refuse.
func signedAt(header string) (time.Time, error) {
	var at time.Time
	seen := false
	for part := range strings.SplitSeq(header, ",") {
		v, ok := strings.CutPrefix(part, "t=")
		if !ok {
			continue
		}
		if seen {
			return time.Time{}, errTimestamps
		}
		seen = true
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
			at = time.Unix(secs, 0)
		}
	}
	return at, nil
}
