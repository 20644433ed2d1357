package claim

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// BenchmarkDeliveryTracing: a first delivery through the whole handler
// (body, verify, claim, apply, confirm, answer, log line) on a real Redis,
// with tracing off and under each sampler docs/PERFORMANCE.md reports. On,
// spans go through the SDK's batcher to an exporter that drops them: the
// cost measured is the service's, not the network's. The effect costs
// nothing, so the difference is tracing's whole cost on this path.
func BenchmarkDeliveryTracing(b *testing.B) {
	for _, bc := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: tracing off
	}{
		{"off", nil},
		{"parentbased_always_on", sdktrace.ParentBased(sdktrace.AlwaysSample())},
		{"parentbased_traceidratio_0.1", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))},
		{"always_off", sdktrace.NeverSample()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var tp trace.TracerProvider
			logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
			store := benchStore(b)
			if bc.sampler != nil {
				p := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler),
					sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = p.Shutdown(b.Context()) })
				tp = p
				logger = tracing.Logger(tp, logger)
				if err := store.Trace(tp); err != nil {
					b.Fatal(err)
				}
			}
			f := NewFlow(store, FlowConfig{HandlerTimeout: 30 * time.Second, Logger: logger,
				Registerer: prometheus.NewRegistry(), Tracer: tp})
			i := 0
			h := f.Endpoint(stripe).Handler(func(http.Header, []byte) (Event, error) {
				return Event{ID: "evt_bench_" + strconv.Itoa(i), Type: "customer.subscription.updated", Apply: noop}, nil
			})
			body := bytes.Repeat([]byte("x"), 3<<10)
			b.ReportAllocs()
			for b.Loop() {
				i++
				req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				h(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
