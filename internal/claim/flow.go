package claim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/intake"
	"github.com/munchable/munchable-webhooks/internal/logsample"
	"github.com/munchable/munchable-webhooks/internal/tracing"
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

// Event is one verified, decoded event, ready for the claim.
type Event struct {
	ID   string
	Type string
	// Apply commits the event's effect and says what the store did. It
	// must be idempotent in its store: with Redis down it may run more than
	// once for one event. A nil Apply marks an event this service has no
	// use for: it is answered as ignored, without a claim.
	Apply func(ctx context.Context) (Effect, error)
}

// Effect is what an Apply did in its store, spelled as the ledger's
// outcome column (webhook_events.outcome). Every one of them is a
// processed delivery: the provider gets its 200 whichever it is.
type Effect string

const (
	// Applied: the event's effect, or a state read from the provider's
	// API, was written.
	Applied Effect = "applied"
	// Unchanged: the stored state already was the event's.
	Unchanged Effect = "unchanged"
	// Stale: the stored state is newer; nothing was written.
	Stale Effect = "stale"
	// Unordered: a same-second event that could not be ordered and was
	// kept out, for want of an API to ask.
	Unordered Effect = "unordered"
)

// Outcome is what became of a delivery, spelled as the
// webhook_deliveries_total outcome label.
type Outcome string

const (
	Processed   Outcome = "processed"
	Duplicate   Outcome = "duplicate"
	InProgress  Outcome = "in_progress" // another attempt holds a Processing claim
	Failed      Outcome = "failed"
	Unavailable Outcome = "unavailable" // fail-closed provider, Redis down
	Rejected    Outcome = "rejected"
	Ignored     Outcome = "ignored"
)

var outcomes = []Outcome{Processed, Duplicate, InProgress, Failed, Unavailable, Rejected, Ignored}

// Degraded reasons, spelled as the webhook_claim_degraded_total reason label.
const (
	reasonNoRedis    = "no_redis"
	reasonRedisError = "redis_error"
)

// verdict is the flow's judgement of one delivery; respond turns it into
// the HTTP answer and record into a log line and metrics.
type verdict struct {
	outcome Outcome
	// degraded is the reason the delivery ran without the claim's
	// protection ("" when the claim worked); redisErr is what Redis said.
	degraded string
	redisErr error
	// retryAfter is how long the provider should wait (InProgress,
	// Unavailable).
	retryAfter time.Duration
	// mismatch: the event id was seen before with a different body.
	mismatch bool
	// effect is what Apply did in its store; "" when it did not run or
	// failed.
	effect Effect
	// err is why the handler failed, or why the delivery was rejected.
	err error
	// busy: Apply could not get its share of a budget (ErrBusy) in time;
	// nothing ran to its end, so the answer is 503 and nothing is kept.
	busy bool
}

// ErrBusy is returned (wrapped) by an Apply that could not get the
// resources it needs within a short wait (the inbound mail budget): the
// delivery answers 503 with Retry-After, its claim is given back without
// counting a failure, and the ledger keeps nothing; the provider retries.
var ErrBusy = errors.New("busy")

// BusyRetry is the Retry-After of an ErrBusy answer: what holds the budget
// is mail being fetched, which takes seconds.
const BusyRetry = 10 * time.Second

// FlowConfig configures a Flow. A nil Logger discards; a nil Registerer
// leaves the metrics unregistered.
type FlowConfig struct {
	// HandlerTimeout is the hard deadline on one delivery's Apply.
	HandlerTimeout time.Duration
	// PoisonAfter is the number of failed attempts of one event after which
	// it is logged as poison and counted; 0 turns that off.
	PoisonAfter int
	// Intake reads the bodies, under its deadline (then 408) and budget
	// (then 503), which the support form shares; nil: no deadline or
	// budget of its own.
	Intake     *intake.Intake
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Ledger, when not nil, records each failed attempt after its
	// rollback (the effect's store records the others with the effect).
	Ledger Recorder
	// Refusals samples the log lines of refused deliveries (rejected
	// before the claim, or turned away for want of budget), which anyone
	// can send by the thousand; nil: a sampler of the flow's own on
	// Logger, with the defaults.
	Refusals *logsample.Sampler
	// Tracer, when not nil, traces each delivery (internal/tracing); nil
	// adds no instrumentation at all.
	Tracer trace.TracerProvider
}

// Recorder keeps what happened to an event beyond its claim: the ledger
// (internal/ledger.Ledger). The flow hands it a failed attempt, after the
// effect's transaction rolled back, with the verified body (a copy: the
// intake reuses its buffer) for a retry by hand, or nil when the event did
// not arrive as a body of its own (stripe replay). It reports whether the
// event is now dead (failed POISON_AFTER times).
type Recorder interface {
	RecordFailure(ctx context.Context, provider, eventID, eventType string, body []byte, cause error) (dead bool, err error)
}

// Flow runs deliveries through claim, apply, confirm or release. It is the
// one place that flow is written; every provider's handler calls it.
type Flow struct {
	store          *Store
	handlerTimeout time.Duration
	poisonAfter    int64
	ledger         Recorder
	intake         *intake.Intake
	logger         *slog.Logger
	refusals       *logsample.Sampler
	metrics        *metrics
	tracerProvider trace.TracerProvider
	tracer         trace.Tracer // nil: tracing is off
}

// NewFlow returns a Flow on store.
func NewFlow(store *Store, cfg FlowConfig) *Flow {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	bodies := cfg.Intake
	if bodies == nil {
		bodies = intake.New(intake.Config{})
	}
	refusals := cfg.Refusals
	if refusals == nil {
		refusals = logsample.New(logger, logsample.Config{})
	}
	var tracer trace.Tracer
	if cfg.Tracer != nil {
		tracer = cfg.Tracer.Tracer(tracing.ScopeName)
	}
	return &Flow{
		tracerProvider: cfg.Tracer,
		tracer:         tracer,
		store:          store,
		handlerTimeout: cfg.HandlerTimeout,
		poisonAfter:    int64(cfg.PoisonAfter),
		ledger:         cfg.Ledger,
		intake:         bodies,
		logger:         logger,
		refusals:       refusals,
		metrics:        newMetrics(cfg.Registerer),
	}
}

// Endpoint binds the flow to one provider.
func (f *Flow) Endpoint(p Provider) *Endpoint {
	f.metrics.init(p.Name)
	return &Endpoint{flow: f, provider: p, processSpan: "process " + p.Name}
}

// Endpoint is the flow bound to one provider: its Handler answers the
// provider's deliveries.
type Endpoint struct {
	flow     *Flow
	provider Provider
	// processSpan names Process's span, built once: with tracing off a
	// replay allocates nothing for it.
	processSpan string
}

// Result is what became of an event run by Process.
type Result struct {
	Outcome Outcome
	// Effect is what the store did; "" unless Outcome is Processed.
	Effect Effect
}

// Process runs an event that did not arrive over HTTP (stripe replay)
// through the same claim, keys and effect as a delivery of it. body, when
// not nil, is fingerprinted as a delivery's would be, and kept by the
// ledger if the attempt fails.
func (e *Endpoint) Process(ctx context.Context, body []byte, ev Event) (Result, error) {
	start := time.Now()
	ctx, span := e.flow.span(ctx, e.processSpan)
	defer span.End()
	v := verdict{outcome: Ignored}
	if ev.Apply != nil {
		v = e.flow.run(ctx, e.provider, body, ev)
	}
	e.record(ctx, ev, v, start)
	return Result{Outcome: v.outcome, Effect: v.effect}, v.err
}

// run takes ev through the claim. It never answers Processed or Duplicate
// unless the effect is committed, by this call or an earlier one.
func (f *Flow) run(ctx context.Context, p Provider, body []byte, ev Event) verdict {
	fp := fingerprint(body)
	claimCtx, span := f.span(ctx, spanClaim)
	token, found, err := f.store.claim(claimCtx, p.Name, ev.ID, fp)
	endSpan(span, err)
	if err != nil && ctx.Err() != nil {
		// The caller gave up (the provider hung up, a replay or sweep was
		// stopped), not Redis: running the effect now would bypass a claim
		// another attempt may hold, and call Redis failing when it is not.
		// Nothing ran, so nothing is recorded; the provider retries.
		return verdict{outcome: Failed, err: fmt.Errorf("claim %s: %w", ev.ID, context.Cause(ctx))}
	}
	if err != nil {
		reason := reasonRedisError
		if errors.Is(err, ErrNoRedis) {
			reason = reasonNoRedis
		}
		f.metrics.degraded.WithLabelValues(p.Name, reason).Inc()
		if p.FailClosed {
			return verdict{outcome: Unavailable, degraded: reason, redisErr: err, retryAfter: unavailableRetry}
		}
		// Fail open: dropping a real event is worse than applying one twice,
		// and the stores make a second application harmless.
		v := f.apply(ctx, p, ev)
		v.degraded, v.redisErr = reason, err
		if v.err != nil && !v.busy {
			f.recordFailure(context.WithoutCancel(ctx), p, body, ev, v.err)
		}
		return v
	}
	if token == "" {
		mismatch := found.Fingerprint != "" && fp != "" && found.Fingerprint != fp
		if found.State == Done {
			if mismatch {
				f.metrics.mismatch.WithLabelValues(p.Name).Inc()
			}
			return verdict{outcome: Duplicate, mismatch: mismatch}
		}
		// Processing, or a value that is not a claim: treating the latter as
		// in progress makes the provider retry until it expires, which is
		// slower but never drops the event.
		if found.State == Processing {
			f.metrics.claimAge.WithLabelValues(p.Name).Observe(time.Since(found.At).Seconds())
		}
		return verdict{outcome: InProgress, retryAfter: found.TTL, mismatch: mismatch}
	}

	v := f.apply(ctx, p, ev)
	// Neither confirm nor release may be cut short by the provider hanging
	// up: both run on a context detached from the request's cancellation.
	bg := context.WithoutCancel(ctx)
	if v.busy {
		// Not a failure of the event: the claim goes back as if it had not
		// been taken, and the ledger keeps nothing.
		ctx, span := f.span(bg, spanGiveBack)
		err := f.store.giveBack(ctx, p.Name, ev.ID, token)
		endSpan(span, err)
		if err != nil {
			v.err = errors.Join(v.err, err)
		}
		return v
	}
	if v.err != nil {
		// The failure is recorded while the claim still keeps retries out:
		// recorded after the release, it could land over the outcome of a
		// retry that had already settled the event.
		f.recordFailure(bg, p, body, ev, v.err)
		ctx, span := f.span(bg, spanRelease)
		_, failures, err := f.store.release(ctx, p.Name, ev.ID, token, p.DedupeTTL)
		endSpan(span, err)
		if err != nil {
			// The claim stays until its TTL ends; retries get 409 until then.
			v.err = errors.Join(v.err, err)
		}
		if f.poisonAfter > 0 && failures == f.poisonAfter {
			f.metrics.poison.WithLabelValues(p.Name).Inc()
			f.logger.Error("poison event: failed every attempt so far",
				"provider", p.Name, "event_id", ev.ID, "event_type", ev.Type,
				"attempts", failures, "err", v.err.Error())
		}
		return v
	}
	confirmCtx, span := f.span(bg, spanConfirm)
	err = f.store.confirm(confirmCtx, p.Name, ev.ID, fp, p.DedupeTTL)
	endSpan(span, err)
	if err != nil {
		// The effect is committed, so the answer stays 200. The processing
		// claim expires on its own; a retry after that re-applies harmlessly.
		f.metrics.confirmFailures.WithLabelValues(p.Name).Inc()
		f.logger.Warn("confirm failed", "provider", p.Name, "event_id", ev.ID, "err", err)
	}
	return v
}

// recordFailure hands a failed attempt to the ledger, under the handler's
// deadline: when Postgres hangs, the failure it caused must not hold the
// answer much longer than the apply did (TestPostgresHangs). A ledger that
// cannot write is logged, not answered: the delivery already fails, and
// the provider's retry is what recovers it.
func (f *Flow) recordFailure(ctx context.Context, p Provider, body []byte, ev Event, cause error) {
	if f.ledger == nil {
		return
	}
	if f.handlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.handlerTimeout)
		defer cancel()
	}
	var kept []byte
	if body != nil {
		kept = bytes.Clone(body)
	}
	dead, err := f.ledger.RecordFailure(ctx, p.Name, ev.ID, ev.Type, kept, cause)
	switch {
	case err != nil:
		f.logger.Error("ledger: failure not recorded", "provider", p.Name, "event_id", ev.ID, "err", err)
	case dead:
		f.logger.Warn("ledger: event is dead: retry it by hand with events retry",
			"provider", p.Name, "event_id", ev.ID, "event_type", ev.Type)
	}
}

// unavailableRetry is the Retry-After of a fail-closed refusal: long enough
// not to hammer a Redis that is coming back, short enough to catch up fast.
const unavailableRetry = 5 * time.Second

// apply runs ev.Apply under the handler deadline. The deadline hangs off a
// context without the request's cancellation: a provider that gives up on
// an attempt must not abort work that may be about to commit; its retry
// meets the claim (409) until this attempt knows how it ended.
func (f *Flow) apply(ctx context.Context, p Provider, ev Event) (v verdict) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.handlerTimeout)
	defer cancel()
	ctx, span := f.span(ctx, spanApply)
	start := time.Now()
	defer func() {
		f.metrics.duration.WithLabelValues(p.Name).Observe(time.Since(start).Seconds())
		if r := recover(); r != nil {
			v = verdict{outcome: Failed, err: fmt.Errorf("handler panic: %v", r)}
		}
		endSpan(span, v.err)
	}()
	effect, err := ev.Apply(ctx)
	if errors.Is(err, ErrBusy) && ctx.Err() == nil {
		return verdict{outcome: Unavailable, busy: true, retryAfter: BusyRetry, err: err}
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("handler deadline %s: %w", f.handlerTimeout, err)
		}
		return verdict{outcome: Failed, err: err}
	}
	return verdict{outcome: Processed, effect: effect}
}

// fingerprint identifies a body, stored with the claim to spot an event id
// reused with another body; "" for no body.
func fingerprint(body []byte) string {
	if body == nil {
		return ""
	}
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:16])
}

// record counts and logs one answered delivery.
func (e *Endpoint) record(ctx context.Context, ev Event, v verdict, start time.Time) {
	m, name := e.flow.metrics, e.provider.Name
	e.annotate(ctx, ev, v)
	if v.outcome == Rejected {
		reason := rejection(v.err)
		m.rejections.WithLabelValues(name, reason).Inc()
		// The deliveries counter keeps "rejected" for verification failures,
		// which is what the signatures-refused alert watches.
		if reason == reasonSignature || reason == reasonTimestamp {
			m.deliveries.WithLabelValues(name, string(Rejected)).Inc()
		}
	} else {
		m.deliveries.WithLabelValues(name, string(v.outcome)).Inc()
	}
	level := slog.LevelInfo
	switch {
	case v.busy:
		level = slog.LevelWarn
	case v.outcome == Failed || v.outcome == Unavailable:
		level = slog.LevelError
	case v.degraded != "" || v.mismatch || v.outcome == Rejected:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("provider", name),
		slog.String("event_id", ev.ID),
		slog.String("event_type", ev.Type),
		slog.String("outcome", string(v.outcome)),
		slog.Bool("degraded", v.degraded != ""),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
	}
	if v.effect != "" {
		attrs = append(attrs, slog.String("effect", string(v.effect)))
	}
	if v.degraded != "" {
		attrs = append(attrs, slog.String("degraded_reason", v.degraded), slog.String("redis_err", v.redisErr.Error()))
	}
	if v.mismatch {
		attrs = append(attrs, slog.Bool("body_mismatch", true))
	}
	var refused string // the sampler's kind, for a refusal
	if v.outcome == Rejected {
		reason := rejection(v.err)
		attrs = append(attrs, slog.String("reason", reason))
		refused = "webhook rejected " + name + " " + reason
	}
	if v.busy {
		refused = "webhook busy " + name
	}
	if v.err != nil {
		attrs = append(attrs, slog.String("err", v.err.Error()))
	}
	if refused != "" && v.degraded == "" && !v.mismatch {
		// A refusal ran nothing and costs the sender nothing to repeat:
		// its lines are sampled, and the counters keep the full count.
		e.flow.refusals.Log(ctx, level, refused, "webhook delivery", attrs...)
		return
	}
	e.flow.logger.LogAttrs(ctx, level, "webhook delivery", attrs...)
}
