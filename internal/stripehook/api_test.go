package stripehook

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A Stripe API call under a tracer provider is a client span, a child of
// the caller's, and the request names it in traceparent; without one the
// request carries no traceparent. Both name APIVersion.
func TestAPICallsAreTraced(t *testing.T) {
	t.Parallel()
	type seen struct{ traceparent, version string }
	requests := make(chan seen, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests <- seen{r.Header.Get("traceparent"), r.Header.Get("Stripe-Version")}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"sub_1","object":"subscription"}`))
	}))
	t.Cleanup(srv.Close)
	base, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("test").Start(t.Context(), "apply")
	if _, err := NewLister(NewAPI("sk_test_x", base, nil, tp)).Retrieve(ctx, "/v1/subscriptions/sub_1"); err != nil {
		t.Fatal(err)
	}
	parent.End()
	got := <-requests
	if got.version != APIVersion {
		t.Errorf("Stripe-Version %q, want %q", got.version, APIVersion)
	}
	var client sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			client = s
		}
	}
	if client == nil {
		t.Fatalf("no client span among %d spans", len(rec.Ended()))
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span %q's parent is %s, want the caller's span %s", client.Name(), client.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	if want := client.SpanContext().SpanID().String(); len(got.traceparent) != 55 || got.traceparent[36:52] != want {
		t.Errorf("traceparent %q, want one naming the client span %s", got.traceparent, want)
	}

	if _, err := NewLister(NewAPI("sk_test_x", base, nil, nil)).Retrieve(t.Context(), "/v1/subscriptions/sub_1"); err != nil {
		t.Fatal(err)
	}
	if got := <-requests; got.traceparent != "" || got.version != APIVersion {
		t.Errorf("untraced request: traceparent %q, Stripe-Version %q; want none and %q", got.traceparent, got.version, APIVersion)
	}
}
