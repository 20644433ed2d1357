package claim

import (
	"context"
	"fmt"
	"net/http"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// The spans of one delivery (docs/OPERATIONS.md, "Traces"): the route's
// server span holds the verdict; verify, claim, apply (the effect's
// Postgres work, with pgx's spans under it), and confirm, release or give
// back are its children.
const (
	spanVerify   = "verify"
	spanClaim    = "claim"
	spanApply    = "apply"
	spanConfirm  = "confirm"
	spanRelease  = "release"
	spanGiveBack = "give back"
)

// Attribute keys of the route's span.
const (
	attrProvider  = attribute.Key("webhook.provider")
	attrEventID   = attribute.Key("webhook.event_id")
	attrEventType = attribute.Key("webhook.event_type")
	attrOutcome   = attribute.Key("webhook.outcome")
	attrEffect    = attribute.Key("webhook.effect")
	attrDegraded  = attribute.Key("webhook.degraded")
	attrReason    = attribute.Key("webhook.reason")
)

// span starts a child of ctx's span, or, with tracing off, returns ctx
// and a no-op span without allocating: the hot path pays a nil check.
func (f *Flow) span(ctx context.Context, name string) (context.Context, trace.Span) {
	if f.tracer == nil {
		return ctx, nooptrace.Span{}
	}
	return f.tracer.Start(ctx, name)
}

// endSpan ends s, marking it failed when err is not nil.
func endSpan(s trace.Span, err error) {
	if err != nil {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}

// traced wraps a provider's handler in otelhttp's server span when tracing
// is on. The endpoint is public: a traceparent sent by anyone starts no
// trace of ours (it is kept as a link), so a sender cannot make us sample,
// nor hang our spans under its trace.
func (e *Endpoint) traced(h http.HandlerFunc) http.HandlerFunc {
	if e.flow.tracer == nil {
		return h
	}
	return otelhttp.NewHandler(h, "webhook "+e.provider.Name,
		otelhttp.WithTracerProvider(e.flow.tracerProvider),
		// HTTP's convention, method and route: the handler serves one
		// route, so its path is the route.
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path }),
		otelhttp.WithPropagators(tracing.Propagator()),
		otelhttp.WithPublicEndpointFn(func(*http.Request) bool { return true }),
	).ServeHTTP
}

// annotate writes the delivery's verdict on ctx's span (the route's).
func (e *Endpoint) annotate(ctx context.Context, ev Event, v verdict) {
	if e.flow.tracer == nil {
		return
	}
	s := trace.SpanFromContext(ctx)
	s.SetAttributes(
		attrProvider.String(e.provider.Name),
		attrEventID.String(ev.ID),
		attrEventType.String(ev.Type),
		attrOutcome.String(string(v.outcome)),
		attrEffect.String(string(v.effect)),
		attrDegraded.Bool(v.degraded != ""),
	)
	if v.outcome == Rejected {
		s.SetAttributes(attrReason.String(rejection(v.err)))
	}
	if v.outcome == Failed {
		s.SetStatus(codes.Error, v.err.Error())
	}
}

// Trace adds go-redis's OpenTelemetry hook to the store's client: each
// command of the claim, confirm and release is a span under the flow's.
// Only commands under a delivery's (or a pass's) span are traced: the
// readiness probe makes none. Commands are named without their arguments (keys carry event ids, the
// claim's value its owner token), and without the caller's file and line,
// which cost a stack walk per command. A nil tp, or a store without
// Redis, is left as it is.
func (s *Store) Trace(tp trace.TracerProvider) error {
	if tp == nil || s.rdb == nil {
		return nil
	}
	if err := redisotel.InstrumentTracing(s.rdb, redisotel.WithTracerProvider(tracing.ChildOnly(tp)),
		redisotel.WithDBStatement(false), redisotel.WithCallerEnabled(false)); err != nil {
		return fmt.Errorf("trace redis: %w", err)
	}
	return nil
}
