package tracing

import (
	"context"
	"log/slog"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Postgres is the pgx tracer for a pool under tp (a span per query, batch
// and connect, with the statement but never its arguments), or nil, no
// tracer at all, when tp is nil.
func Postgres(tp trace.TracerProvider) pgx.QueryTracer {
	if tp == nil {
		return nil
	}
	return otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithDisableAcquireTracer())
}

// Root starts a trace of its own for a pass that no delivery caused (a
// sweep, stripe verify, the retention trim), named name: what the pass
// does (replays, API calls, queries) are its children. end ends it,
// failed when err is not nil. With tp nil it returns ctx and an end that
// does nothing.
func Root(ctx context.Context, tp trace.TracerProvider, name string) (_ context.Context, end func(err error)) {
	if tp == nil {
		return ctx, func(error) {}
	}
	ctx, span := tp.Tracer(ScopeName).Start(ctx, name, trace.WithNewRoot())
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// Logger is logger whose lines carry trace_id and span_id when logged
// with a sampled span's context (LogHandler), or logger itself when tp is
// nil.
func Logger(tp trace.TracerProvider, logger *slog.Logger) *slog.Logger {
	if tp == nil {
		return logger
	}
	return slog.New(LogHandler(logger.Handler()))
}

// ChildOnly is tp for instrumentation that would otherwise start traces of
// its own (go-redis's hook): a span is started only under a recording
// one, so the readiness probe's PING and the connection pool's dials make
// no trace, while a claim's commands are spans of their delivery.
func ChildOnly(tp trace.TracerProvider) trace.TracerProvider { return childOnly{tp: tp} }

type childOnly struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{t: c.tp.Tracer(name, opts...)}
}

type childOnlyTracer struct {
	embedded.Tracer
	t trace.Tracer
}

func (c childOnlyTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.IsRecording() {
		return ctx, parent
	}
	return c.t.Start(ctx, name, opts...)
}
