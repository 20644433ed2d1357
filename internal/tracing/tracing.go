// Package tracing builds the service's OpenTelemetry tracer provider from
// the standard OTEL_* variables, and holds the few pieces every traced
// part shares: the propagator, the traceparent a change keeps, the trace
// ids on log lines, and the HTTP transport of calls to other services.
//
// Off is the default and costs nothing: without an OTLP endpoint (or with
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none) New returns a nil
// provider, and every part handed a nil provider installs no
// instrumentation at all. A no-op provider would still have otelhttp wrap
// every response writer and request, and pgx and go-redis call their hooks
// on every query; nil keeps a first delivery exactly as it was.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is service.name unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES says otherwise.
const ServiceName = "munchable-webhooks"

// ScopeName names the service's own tracer (instrumentation scope).
const ScopeName = "github.com/munchable/munchable-webhooks"

// Settings is what New reads from the environment it is given: whether,
// where and what to export. The exporters and the batcher read the rest
// of the standard variables (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE, OTEL_BSP_*) from the process environment
// themselves, which in production is the same one.
type Settings struct {
	// Endpoint is where spans go: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as
	// is, or OTEL_EXPORTER_OTLP_ENDPOINT (plus /v1/traces over HTTP).
	// "": tracing is off.
	Endpoint string
	// Protocol is "http/protobuf" (the default) or "grpc".
	Protocol string
	// Sampler is OTEL_TRACES_SAMPLER with OTEL_TRACES_SAMPLER_ARG; the
	// default, as the spec's, is parentbased_always_on.
	Sampler sdktrace.Sampler
	// Resource is OTEL_RESOURCE_ATTRIBUTES, then service.name:
	// OTEL_SERVICE_NAME, else the attributes', else ServiceName.
	Resource []attribute.KeyValue
}

// Read returns the settings environ asks for; ok is false when tracing is
// off. Only the protocols this build exports are accepted.
func Read(environ []string) (s Settings, ok bool, err error) {
	get := lookup(environ)
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(get("OTEL_TRACES_EXPORTER"), "none") {
		return Settings{}, false, nil
	}
	if e := get("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return Settings{}, false, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: only otlp (or none) is built in", e)
	}
	s.Protocol = first(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), get("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	if s.Protocol != "http/protobuf" && s.Protocol != "grpc" {
		return Settings{}, false, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: want http/protobuf or grpc", s.Protocol)
	}
	s.Endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if base := get("OTEL_EXPORTER_OTLP_ENDPOINT"); s.Endpoint == "" && base != "" {
		s.Endpoint = base
		if s.Protocol == "http/protobuf" {
			// The spec's rule for the generic variable: the signal's path
			// is appended; the per-signal one is used as it is.
			s.Endpoint = strings.TrimSuffix(base, "/") + "/v1/traces"
		}
	}
	if s.Endpoint == "" {
		return Settings{}, false, nil
	}
	if s.Sampler, err = sampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG")); err != nil {
		return Settings{}, false, err
	}
	if s.Resource, err = resourceAttributes(get("OTEL_RESOURCE_ATTRIBUTES"), get("OTEL_SERVICE_NAME")); err != nil {
		return Settings{}, false, err
	}
	return s, true, nil
}

// sampler is the spec's OTEL_TRACES_SAMPLER (the ones the SDK has) with
// its argument, a ratio that defaults to 1.
func sampler(name, arg string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if arg != "" && strings.HasSuffix(name, "traceidratio") {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%s: want a ratio from 0 to 1", arg)
		}
		ratio = r
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER=%s: want always_on, always_off, traceidratio or parentbased_ one of those", name)
}

// resourceAttributes reads OTEL_RESOURCE_ATTRIBUTES (key=value pairs,
// comma-separated, values percent-encoded) and settles service.name.
func resourceAttributes(list, serviceName string) ([]attribute.KeyValue, error) {
	var attrs []attribute.KeyValue
	named := ""
	for pair := range strings.SplitSeq(list, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %q is not key=value", pair)
		}
		v, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %s: %w", k, err)
		}
		if k == "service.name" {
			named = v
			continue
		}
		attrs = append(attrs, attribute.String(k, v))
	}
	return append(attrs, attribute.String("service.name", first(serviceName, named, ServiceName))), nil
}

// New builds the tracer provider environ asks for, with a batching OTLP
// exporter. Off, it returns a nil provider and a shutdown that does
// nothing: no exporter, no goroutine. shutdown flushes the spans still
// queued; call it once the service has stopped serving.
func New(ctx context.Context, environ []string) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	s, ok, err := Read(environ)
	if err != nil || !ok {
		return nil, nothing, err
	}
	var exp sdktrace.SpanExporter
	switch s.Protocol {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(s.Endpoint))
	default:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(s.Endpoint))
	}
	if err != nil {
		return nil, nothing, fmt.Errorf("otlp exporter (%s %s): %w", s.Protocol, s.Endpoint, err)
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(s.Resource...))
	if err != nil {
		return nil, nothing, fmt.Errorf("otel resource: %w", err)
	}
	// The sampler is set here, from environ: the SDK would read
	// OTEL_TRACES_SAMPLER from the process environment, not the one given.
	p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithSampler(s.Sampler))
	return p, p.Shutdown, nil
}

// Propagator is how trace context crosses HTTP: the W3C traceparent and
// tracestate headers. It is passed to otelhttp rather than set globally.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }

// Traceparent is the W3C traceparent of ctx's span, "" unless that span
// is sampled: only a sampled trace is worth pointing back to, and "" costs
// the caller nothing to store.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// TraceID is the trace id of ctx's span, "" unless it is sampled.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return ""
	}
	return sc.TraceID().String()
}

// ContextFrom reads a stored traceparent back into a span context, for a
// link; ok is false for "" or one that does not parse.
func ContextFrom(traceparent string) (trace.SpanContext, bool) {
	if traceparent == "" {
		return trace.SpanContext{}, false
	}
	carrier := propagation.MapCarrier{"traceparent": traceparent}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	return sc, sc.IsValid()
}

// Transport is base traced with otelhttp under tp (a client span per call,
// traceparent on the request), or base itself when tp is nil.
func Transport(tp trace.TracerProvider, base http.RoundTripper) http.RoundTripper {
	if tp == nil {
		return base
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return otelhttp.NewTransport(base, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(Propagator()))
}

// lookup reads a variable from environ, the last one winning as in the
// process environment.
func lookup(environ []string) func(string) string {
	return func(key string) string {
		v := ""
		for _, kv := range environ {
			if k, val, ok := strings.Cut(kv, "="); ok && k == key {
				v = val
			}
		}
		return strings.TrimSpace(v)
	}
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
