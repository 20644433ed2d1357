package relay

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// span starts the relay's span for one attempt to deliver ch to c. A
// change made by a traced delivery keeps that delivery's span context
// (changes.traceparent): the attempt's span continues the same trace as
// its child, and links it too, so that the delivery to the app is found
// in the trace of the event that caused it, and the app's webhook
// (traceparent) carries that trace on. A change without one starts a
// trace of its own. With tracing off it costs a nil check.
func (r *Relay) span(ctx context.Context, c Consumer, ch ledger.Change) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, nooptrace.Span{}
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("relay.consumer", c.Name),
			attribute.Int64("relay.change_id", ch.ID),
			attribute.String("relay.kind", ch.Kind),
		),
	}
	if sc, ok := tracing.ContextFrom(ch.Traceparent); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	return r.tracer.Start(ctx, "relay "+c.Name, opts...)
}

// endSpan ends an attempt's span with what the far side said.
func endSpan(s trace.Span, result string, err error) {
	if result != "" {
		s.SetAttributes(attribute.String("relay.result", result))
	}
	switch {
	case errors.Is(err, ErrSkip):
		s.SetAttributes(attribute.Bool("relay.skipped", true))
	case err != nil:
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}
