package claim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Provider is one webhook source and its claim policy.
type Provider struct {
	// Name is the provider's segment in keys, metrics and logs ("stripe").
	Name string
	// DedupeTTL is how long a done key lives: at least the provider's retry
	// horizon, or a late retry would be applied again.
	DedupeTTL time.Duration
	// FailClosed refuses deliveries (503) while Redis is unavailable instead
	// of running them unprotected. For handlers that are not idempotent.
	FailClosed bool
}

// Delivery is one verified, parsed webhook delivery, ready for the claim.
type Delivery struct {
	EventID   string
	EventType string
	// Body is the raw, verified request body; its fingerprint is stored with
	// the claim to spot an event id reused with another body.
	Body []byte
	// Apply commits the event's effect. It must be idempotent in its store:
	// with Redis down it may run more than once for one event.
	Apply func(ctx context.Context) error
}

// Result is what became of a delivery.
type Result string

// Results, named as the webhook_deliveries_total outcome label.
const (
	Processed   Result = "processed"
	Duplicate   Result = "duplicate"
	Progressing Result = "in_progress"
	Failed      Result = "failed"
	Unavailable Result = "unavailable" // fail-closed provider, Redis down
	Rejected    Result = "rejected"
	Ignored     Result = "ignored"
)

// Degraded reasons, named as the webhook_claim_degraded_total reason label.
const (
	ReasonNoRedis    = "no_redis"
	ReasonRedisError = "redis_error"
)

// Outcome is the flow's verdict on one delivery; respond turns it into the
// HTTP answer.
type Outcome struct {
	Result Result
	// Degraded is the reason the delivery ran without the claim's
	// protection, or "" when the claim worked.
	Degraded string
	// RetryAfter is how long the provider should wait (in progress,
	// unavailable).
	RetryAfter time.Duration
	// Mismatch: the event id was seen before with a different body.
	Mismatch bool
	Err      error
}

// FlowConfig configures a Flow.
type FlowConfig struct {
	// HandlerTimeout is the hard deadline on one delivery's Apply.
	HandlerTimeout time.Duration
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
}

// Flow runs deliveries through claim, apply, confirm or release. It is the
// one place that flow is written; every provider's handler calls it.
type Flow struct {
	store          *Store
	handlerTimeout time.Duration
	logger         *slog.Logger
	metrics        *metrics
}

// NewFlow returns a Flow on store.
func NewFlow(store *Store, cfg FlowConfig) *Flow {
	return &Flow{
		store:          store,
		handlerTimeout: cfg.HandlerTimeout,
		logger:         cfg.Logger,
		metrics:        newMetrics(cfg.Registerer),
	}
}

// Endpoint binds the flow to one provider.
func (f *Flow) Endpoint(p Provider) *Endpoint {
	f.metrics.init(p.Name)
	return &Endpoint{flow: f, provider: p}
}

// Run takes d through the claim. It never answers Processed or Duplicate
// unless the effect is committed, by this call or an earlier one.
func (f *Flow) Run(ctx context.Context, p Provider, d Delivery) Outcome {
	fp := fingerprint(d.Body)
	reply, err := f.store.Claim(ctx, p.Name, d.EventID, fp)
	if err != nil {
		reason := ReasonRedisError
		if errors.Is(err, ErrNoRedis) {
			reason = ReasonNoRedis
		}
		f.metrics.degraded.WithLabelValues(p.Name, reason).Inc()
		if p.FailClosed {
			return Outcome{Result: Unavailable, Degraded: reason, RetryAfter: unavailableRetry, Err: err}
		}
		// Fail open: dropping a real event is worse than applying one twice,
		// and the stores make a second application harmless.
		o := f.apply(ctx, p, d)
		o.Degraded = reason
		if o.Err == nil {
			o.Err = err // keep the Redis error for the log line
		}
		return o
	}
	switch reply.Status {
	case Done:
		if reply.Existing.Fingerprint != "" && reply.Existing.Fingerprint != fp {
			f.metrics.mismatch.WithLabelValues(p.Name).Inc()
			return Outcome{Result: Duplicate, Mismatch: true}
		}
		return Outcome{Result: Duplicate}
	case InProgress:
		return Outcome{Result: Progressing, RetryAfter: reply.TTL, Mismatch: reply.Existing.Fingerprint != "" && reply.Existing.Fingerprint != fp}
	}

	o := f.apply(ctx, p, d)
	// Neither confirm nor release may be cut short by the provider hanging
	// up: both run on a context detached from the request's cancellation.
	bg := context.WithoutCancel(ctx)
	if o.Err != nil {
		if _, err := f.store.Release(bg, p.Name, d.EventID, reply.Token); err != nil {
			// The claim stays until its TTL ends; retries get 409 until then.
			o.Err = errors.Join(o.Err, err)
		}
		return o
	}
	if err := f.store.Confirm(bg, p.Name, d.EventID, fp, p.DedupeTTL); err != nil {
		// The effect is committed, so the answer stays 200. The processing
		// claim expires on its own; a retry after that re-applies harmlessly.
		f.metrics.confirmFailures.WithLabelValues(p.Name).Inc()
		f.logger.Warn("confirm failed", "provider", p.Name, "event_id", d.EventID, "err", err)
	}
	return o
}

// unavailableRetry is the Retry-After of a fail-closed refusal: long enough
// not to hammer a Redis that is coming back, short enough to catch up fast.
const unavailableRetry = 5 * time.Second

// apply runs d.Apply under the handler deadline. The deadline hangs off a
// context without the request's cancellation: a provider that gives up on
// an attempt must not abort work that may be about to commit; its retry
// meets the claim (409) until this attempt knows how it ended.
func (f *Flow) apply(ctx context.Context, p Provider, d Delivery) (o Outcome) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.handlerTimeout)
	defer cancel()
	start := time.Now()
	defer func() {
		f.metrics.duration.WithLabelValues(p.Name).Observe(time.Since(start).Seconds())
		if r := recover(); r != nil {
			o = Outcome{Result: Failed, Err: fmt.Errorf("handler panic: %v", r)}
		}
	}()
	if err := d.Apply(ctx); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("handler deadline %s: %w", f.handlerTimeout, err)
		}
		return Outcome{Result: Failed, Err: err}
	}
	return Outcome{Result: Processed}
}

func fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:16])
}

// Endpoint is the flow bound to one provider: what a webhook handler calls
// to answer a delivery.
type Endpoint struct {
	flow     *Flow
	provider Provider
}

// Serve runs d through the flow and writes the answer.
func (e *Endpoint) Serve(w http.ResponseWriter, r *http.Request, d Delivery) {
	start := time.Now()
	o := e.flow.Run(r.Context(), e.provider, d)
	respond(w, o)
	e.record(r, d.EventID, d.EventType, o, start)
}

// Ignore answers an event this service has no use for, without a claim.
func (e *Endpoint) Ignore(w http.ResponseWriter, r *http.Request, eventID, eventType string) {
	start := time.Now()
	o := Outcome{Result: Ignored}
	respond(w, o)
	e.record(r, eventID, eventType, o, start)
}

// Reject answers a delivery that failed verification or parsing, or whose
// body was too large: no claim, no effect.
func (e *Endpoint) Reject(w http.ResponseWriter, r *http.Request, err error) {
	start := time.Now()
	o := Outcome{Result: Rejected, Err: err}
	respond(w, o)
	e.record(r, "", "", o, start)
}

func (e *Endpoint) record(r *http.Request, eventID, eventType string, o Outcome, start time.Time) {
	e.flow.metrics.deliveries.WithLabelValues(e.provider.Name, string(o.Result)).Inc()
	level := slog.LevelInfo
	switch {
	case o.Result == Failed || o.Result == Unavailable:
		level = slog.LevelError
	case o.Degraded != "" || o.Mismatch || o.Result == Rejected:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("provider", e.provider.Name),
		slog.String("event_id", eventID),
		slog.String("event_type", eventType),
		slog.String("outcome", string(o.Result)),
		slog.Bool("degraded", o.Degraded != ""),
		slog.Duration("duration", time.Since(start)),
	}
	if o.Degraded != "" {
		attrs = append(attrs, slog.String("degraded_reason", o.Degraded))
	}
	if o.Mismatch {
		attrs = append(attrs, slog.Bool("body_mismatch", true))
	}
	if o.Err != nil {
		attrs = append(attrs, slog.String("err", o.Err.Error()))
	}
	e.flow.logger.LogAttrs(r.Context(), level, "webhook delivery", attrs...)
}
