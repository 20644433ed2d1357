package main

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/leader"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// startTracing builds the tracer provider the OTEL_* variables ask for
// (nil: off, the default) and the logger serve goes on with: with tracing
// on, a delivery's lines carry trace_id and span_id. stop flushes the
// spans still queued, on a context of its own (serve's is done by then).
func startTracing(ctx context.Context, environ []string, logger *slog.Logger) (trace.TracerProvider, *slog.Logger, func(), error) {
	tp, shutdown, err := tracing.New(ctx, environ)
	if err != nil || tp == nil {
		return nil, logger, func() {}, err
	}
	// The SDK reports export failures through otel's global handler, which
	// otherwise prints plain text to stderr: routed here, every line the
	// process writes stays one JSON object. This is the one global set,
	// and only with tracing on; the provider itself is passed explicitly.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("opentelemetry", "err", err)
	}))
	logger.Info("tracing is on (OTEL_EXPORTER_OTLP_ENDPOINT)")
	return tp, tracing.Logger(tp, logger), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			logger.Warn("tracing: spans not flushed", "err", err)
		}
	}, nil
}

// tracedJob makes each run of j a trace of its own (tp nil: j as it is).
func tracedJob(tp trace.TracerProvider, j leader.Job) leader.Job {
	if tp == nil {
		return j
	}
	run := j.Run
	j.Run = func(ctx context.Context, since time.Time) (any, error) {
		ctx, end := tracing.Root(ctx, tp, "job "+j.Name)
		out, err := run(ctx, since)
		end(err)
		return out, err
	}
	return j
}
