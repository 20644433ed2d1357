package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestRead(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		env      []string
		on       bool
		endpoint string
		protocol string
		err      string
	}{
		{name: "nothing set", env: nil},
		{name: "only a service name", env: []string{"OTEL_SERVICE_NAME=x"}},
		{name: "endpoint", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318/"}, on: true,
			endpoint: "http://collector:4318/v1/traces", protocol: "http/protobuf"},
		{name: "traces endpoint as is", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://b:4318/custom"}, on: true,
			endpoint: "http://b:4318/custom", protocol: "http/protobuf"},
		{name: "grpc", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"}, on: true,
			endpoint: "http://collector:4317", protocol: "grpc"},
		{name: "disabled", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_SDK_DISABLED=true"}},
		{name: "exporter none", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_TRACES_EXPORTER=none"}},
		{name: "exporter zipkin", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_TRACES_EXPORTER=zipkin"}, err: "OTEL_TRACES_EXPORTER"},
		{name: "json protocol", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"}, err: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "bad sampler", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_TRACES_SAMPLER=sometimes"}, err: "OTEL_TRACES_SAMPLER"},
		{name: "bad ratio", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=2"}, err: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "bad attributes", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_RESOURCE_ATTRIBUTES=novalue"}, err: "OTEL_RESOURCE_ATTRIBUTES"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, on, err := Read(tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if on != tc.on || s.Endpoint != tc.endpoint || s.Protocol != tc.protocol {
				t.Errorf("Read = %+v, %v; want endpoint %q protocol %q, on %v", s, on, tc.endpoint, tc.protocol, tc.on)
			}
		})
	}
}

func TestResourceAttributes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		list, name string
		want       []attribute.KeyValue
	}{
		{"", "", []attribute.KeyValue{attribute.String("service.name", ServiceName)}},
		{"deployment.environment=prod,team=a%20b", "", []attribute.KeyValue{
			attribute.String("deployment.environment", "prod"), attribute.String("team", "a b"), attribute.String("service.name", ServiceName)}},
		{"service.name=from-attrs", "", []attribute.KeyValue{attribute.String("service.name", "from-attrs")}},
		{"service.name=from-attrs", "from-name", []attribute.KeyValue{attribute.String("service.name", "from-name")}},
	}
	for _, tc := range cases {
		got, err := resourceAttributes(tc.list, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("%q, %q: got %v, want %v", tc.list, tc.name, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q, %q: got %v, want %v", tc.list, tc.name, got, tc.want)
			}
		}
	}
}

// Off is nil: no provider, no exporter, nothing to shut down.
func TestNewOff(t *testing.T) {
	t.Parallel()
	tp, shutdown, err := New(t.Context(), []string{"OTEL_SERVICE_NAME=x"})
	if err != nil || tp != nil {
		t.Fatalf("New = %v, %v; want nil, nil", tp, err)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if Postgres(nil) != nil || Transport(nil, http.DefaultTransport) != http.DefaultTransport {
		t.Error("a nil provider instruments something")
	}
	logger := slog.New(slog.DiscardHandler)
	if Logger(nil, logger) != logger {
		t.Error("a nil provider wraps the logger")
	}
}

// New exports over OTLP/HTTP, with the resource the environment names:
// a span ended and flushed by shutdown reaches a receiver that decodes
// the protobuf as a collector does.
func TestNewExportsOverOTLPHTTP(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, &req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	tp, shutdown, err := New(t.Context(), []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL,
		"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=test", "OTEL_SERVICE_NAME=svc-test"})
	if err != nil || tp == nil {
		t.Fatalf("New: %v, %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(t.Context(), "one")
	span.End()
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || len(got[0].ResourceSpans) != 1 {
		t.Fatalf("exports %v, want one", got)
	}
	rs := got[0].ResourceSpans[0]
	res := map[string]string{}
	for _, kv := range rs.Resource.Attributes {
		res[kv.Key] = kv.Value.GetStringValue()
	}
	if res["service.name"] != "svc-test" || res["deployment.environment"] != "test" {
		t.Errorf("resource %v: want service.name svc-test and deployment.environment test", res)
	}
	if n := rs.ScopeSpans[0].Spans; len(n) != 1 || n[0].Name != "one" {
		t.Errorf("spans %v, want one named one", n)
	}
}

func TestSamplers(t *testing.T) {
	t.Parallel()
	for name, sampled := range map[string]bool{"": true, "always_on": true, "always_off": false,
		"parentbased_always_off": false, "traceidratio": true, "parentbased_traceidratio": true} {
		s, err := sampler(name, "")
		if err != nil {
			t.Fatal(err)
		}
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(s))
		_, span := tp.Tracer("t").Start(context.Background(), "root")
		span.End()
		if got := len(rec.Ended()) == 1; got != sampled {
			t.Errorf("OTEL_TRACES_SAMPLER=%q sampled a root: %v, want %v", name, got, sampled)
		}
	}
}

// A sampled span's context survives its traceparent, which is how a
// change keeps it; an unsampled one is not kept.
func TestTraceparentRoundTrip(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	tpar := Traceparent(ctx)
	sc, ok := ContextFrom(tpar)
	if !ok || sc.TraceID() != span.SpanContext().TraceID() || sc.SpanID() != span.SpanContext().SpanID() || !sc.IsSampled() {
		t.Errorf("ContextFrom(%q) = %v, %v; want the span's context", tpar, sc, ok)
	}
	if TraceID(ctx) != span.SpanContext().TraceID().String() {
		t.Errorf("TraceID = %q", TraceID(ctx))
	}
	unsampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}}))
	if Traceparent(unsampled) != "" || TraceID(unsampled) != "" || Traceparent(context.Background()) != "" {
		t.Error("an unsampled or absent span has a traceparent")
	}
	if _, ok := ContextFrom("garbage"); ok {
		t.Error("garbage parsed as a traceparent")
	}
}

// A line logged under a sampled span carries its ids; others do not.
func TestLogHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tp := sdktrace.NewTracerProvider()
	logger := Logger(tp, slog.New(slog.NewJSONHandler(&buf, nil))).With("provider", "stripe")
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	logger.InfoContext(ctx, "traced")
	span.End()
	logger.InfoContext(context.Background(), "plain")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var traced, plain map[string]any
	_ = json.Unmarshal([]byte(lines[0]), &traced)
	_ = json.Unmarshal([]byte(lines[1]), &plain)
	if traced["trace_id"] != span.SpanContext().TraceID().String() || traced["span_id"] != span.SpanContext().SpanID().String() || traced["provider"] != "stripe" {
		t.Errorf("traced line %v", traced)
	}
	if _, ok := plain["trace_id"]; ok {
		t.Errorf("plain line %v carries a trace id", plain)
	}
}

// ChildOnly starts spans only under a recording one.
func TestChildOnly(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	child := ChildOnly(tp).Tracer("t")
	_, orphan := child.Start(context.Background(), "orphan")
	orphan.End()
	ctx, parent := tp.Tracer("t").Start(context.Background(), "parent")
	_, kid := child.Start(ctx, "kid")
	kid.End()
	parent.End()
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	if strings.Join(names, ",") != "kid,parent" {
		t.Errorf("spans %v, want kid and parent only", names)
	}
}

// The gRPC exporter builds without reaching its collector (it connects
// when it first exports): a collector that is down at startup does not
// stop the service.
func TestNewGRPCWithoutCollector(t *testing.T) {
	t.Parallel()
	tp, shutdown, err := New(t.Context(), []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"})
	if err != nil || tp == nil {
		t.Fatalf("New: %v, %v", tp, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_ = shutdown(ctx) // nothing queued; an unreachable collector may still say so
}
