package claim

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/intake"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// lockedBuffer is a log sink the handler's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tracedRig is an intakeRig whose flow and Redis client are traced into
// an in-memory recorder, and whose log lines carry trace ids.
func tracedRig(t *testing.T, cfg FlowConfig) (*intakeRig, *tracetest.SpanRecorder, *lockedBuffer) {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	logs := &lockedBuffer{}
	cfg.Tracer, cfg.Logger = tp, tracing.Logger(tp, slog.New(slog.NewJSONHandler(logs, nil)))
	r := newIntakeRig(t, cfg)
	if err := r.store.Trace(tp); err != nil {
		t.Fatal(err)
	}
	return r, spans, logs
}

func attrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, a := range s.Attributes() {
		out[string(a.Key)] = a.Value.String()
	}
	return out
}

// One delivery is one trace: the route's server span, a root (a
// traceparent the sender makes up is only a link), holds the verdict;
// verify, claim, apply and confirm are its children, Redis's commands
// theirs; the delivery's log line names the trace and the route's span.
func TestDeliveryIsOneTrace(t *testing.T) {
	t.Parallel()
	r, spans, logs := tracedRig(t, FlowConfig{})
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL, strings.NewReader(`{"id":"evt_traced"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-11111111111111111111111111111111-2222222222222222-01")
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}

	var route sdktrace.ReadOnlySpan
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = s
		if s.SpanKind() == trace.SpanKindServer {
			route = s
		}
	}
	if route == nil || route.Name() != "POST /" {
		t.Fatalf("no server span POST / among %v", byName)
	}
	if route.Parent().IsValid() {
		t.Errorf("route span's parent %v: a sender's traceparent must not parent our trace", route.Parent())
	}
	if l := route.Links(); len(l) != 1 || l[0].SpanContext.TraceID().String() != "11111111111111111111111111111111" {
		t.Errorf("route span's links %v, want the sender's traceparent", l)
	}
	want := map[string]string{"webhook.provider": "stripe", "webhook.event_id": "evt_traced", "webhook.event_type": "test.event",
		"webhook.outcome": "processed", "webhook.effect": "applied", "webhook.degraded": "false"}
	got := attrs(route)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("route span %s = %q, want %q", k, got[k], v)
		}
	}
	for _, name := range []string{spanVerify, spanClaim, spanApply, spanConfirm} {
		s := byName[name]
		if s == nil {
			t.Errorf("no %s span", name)
			continue
		}
		if s.Parent().SpanID() != route.SpanContext().SpanID() || s.SpanContext().TraceID() != route.SpanContext().TraceID() {
			t.Errorf("%s span's parent %v, want the route's %v", name, s.Parent().SpanID(), route.SpanContext().SpanID())
		}
	}
	redisUnder := map[string]bool{}
	for _, s := range spans.Ended() {
		for _, name := range []string{spanClaim, spanConfirm} {
			if p := byName[name]; p != nil && s.Parent().SpanID() == p.SpanContext().SpanID() {
				redisUnder[name] = true
			}
		}
	}
	if !redisUnder[spanClaim] || !redisUnder[spanConfirm] {
		t.Errorf("Redis spans under claim and confirm: %v, want both", redisUnder)
	}

	var line map[string]any
	for l := range strings.SplitSeq(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "webhook delivery" {
			line = m
		}
	}
	if line["trace_id"] != route.SpanContext().TraceID().String() || line["span_id"] != route.SpanContext().SpanID().String() {
		t.Errorf("delivery log line %v: want trace_id %s and span_id %s", line, route.SpanContext().TraceID(), route.SpanContext().SpanID())
	}
}

// A delivery refused at the signature has a failed verify span, the
// reason on the route's span, and no claim.
func TestRejectedDeliveryTrace(t *testing.T) {
	t.Parallel()
	r, spans, _ := tracedRig(t, FlowConfig{})
	r.post(t, "application/json", []byte(`{"id":"evt_forged","reject":"signature"}`))
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = s
	}
	if v := byName[spanVerify]; v == nil || v.Status().Code != codes.Error {
		t.Errorf("verify span %v: want one that failed", v)
	}
	if byName[spanClaim] != nil {
		t.Error("a claim span for a delivery refused before the claim")
	}
	got := attrs(byName["POST /"])
	if got["webhook.outcome"] != "rejected" || got["webhook.reason"] != "signature" {
		t.Errorf("route span outcome %q reason %q, want rejected and signature", got["webhook.outcome"], got["webhook.reason"])
	}
}

// otelhttp's wrapping keeps the body's deadline working: the intake sets
// it through http.ResponseController, which must reach the connection
// through the wrapper (or a trickled body would hold the handler).
func TestTracedBodyReadTimeout(t *testing.T) {
	t.Parallel()
	r, _, _ := tracedRig(t, FlowConfig{Intake: intake.New(intake.Config{Timeout: 300 * time.Millisecond})})
	if resp := answer(t, r.partial(t, 3000, 100)); resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status = %d, want 408", resp.StatusCode)
	}
}
