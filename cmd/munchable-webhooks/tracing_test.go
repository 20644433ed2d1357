package main

import (
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	svix "github.com/svix/svix-webhooks/go"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// span is one span as the OTLP receiver got it, ids in hex.
type span struct {
	name, trace, id, parent string
	attrs                   map[string]string
	links                   []string // the linked spans' ids
	service                 string
}

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes each export
// (protobuf, as the SDK sends it) and keeps the spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []span
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf POST to /v1/traces", http.StatusBadRequest)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		z, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = z
	}
	b, err := io.ReadAll(body)
	var req collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := span{name: s.Name, trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
					parent: hex.EncodeToString(s.ParentSpanId), attrs: map[string]string{}, service: service}
				for _, kv := range s.Attributes {
					switch v := kv.Value.GetValue().(type) {
					case *commonpb.AnyValue_StringValue:
						sp.attrs[kv.Key] = v.StringValue
					case *commonpb.AnyValue_IntValue:
						sp.attrs[kv.Key] = fmt.Sprint(v.IntValue)
					case *commonpb.AnyValue_BoolValue:
						sp.attrs[kv.Key] = fmt.Sprint(v.BoolValue)
					}
				}
				for _, l := range s.Links {
					sp.links = append(sp.links, hex.EncodeToString(l.SpanId))
				}
				o.spans = append(o.spans, sp)
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (o *otlpReceiver) all() []span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]span(nil), o.spans...)
}

// headerLog keeps the traceparent of each request a fake far side got, by
// path.
type headerLog struct {
	mu   sync.Mutex
	seen map[string][]string
}

func (h *headerLog) add(path, traceparent string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[string][]string{}
	}
	h.seen[path] = append(h.seen[path], traceparent)
}

func (h *headerLog) get(path string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen[path]...)
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, a Stripe delivery and a mail
// delivery are each one trace, received over OTLP/HTTP: the route's span
// with verify, claim, apply and confirm under it (and Redis's, Postgres's
// and Resend's spans under those), the relay's span for the change each
// made in the same trace (child and link of the span that made it), and
// the app's webhook and the forward to Resend carrying that trace in
// traceparent. The delivery's log line and its ledger row name the trace.
func TestTracesOverOTLP(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	t.Cleanup(collector.Close)

	var far headerLog
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		far.add("app "+r.Header.Get("webhook-id"), r.Header.Get("traceparent"))
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(app.Close)
	mail, err := os.ReadFile("../../internal/resendhook/testdata/received_email.json")
	if err != nil {
		t.Fatal(err)
	}
	resend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		far.add("resend "+r.Method+" "+strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")[0], r.Header.Get("traceparent"))
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost && r.URL.Path == "/emails" {
			_, _ = w.Write([]byte(`{"id":"em_forwarded_1"}`))
			return
		}
		_, _ = w.Write(mail)
	}))
	t.Cleanup(resend.Close)

	s := startService(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL,
		"OTEL_SERVICE_NAME":           "webhooks-under-test",
		"APP_WEBHOOK_URL":             app.URL + "/hooks",
		"APP_WEBHOOK_SECRET":          "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"APP_WEBHOOK_ALLOW_HTTP":      "true",
		"RESEND_API_URL":              resend.URL,
		"SUPPORT_FORWARD_TO":          "team@munchable.app",
		"SUPPORT_FORWARD_FROM":        "Support <support@munchable.app>",
	})
	if r := s.postStripe(t, fixture(t)); r.StatusCode != 200 {
		t.Fatalf("stripe delivery: %d", r.StatusCode)
	}
	wh, err := svix.NewWebhook(validEnv()["RESEND_WEBHOOK_SECRET"])
	if err != nil {
		t.Fatal(err)
	}
	event := []byte(`{"type":"email.received","created_at":"2026-12-01T10:00:00.000Z","data":{"email_id":"4ef9a417-02e9-4d39-ad75-9611e0fcc33c","created_at":"2026-12-01T10:00:00.000Z","from":"Ada <ada@example.com>","to":["support@munchable.app"],"cc":[],"bcc":[],"message_id":"<m1@example.com>","subject":"Help","attachments":[]}}`)
	if r := postResend(t, s.url, wh, "msg_traced_1", event); r.StatusCode != 200 {
		t.Fatalf("resend delivery: %d", r.StatusCode)
	}
	// The relay sends both changes to the app (chg_1, chg_2) and the mail
	// to the team.
	deadline := time.Now().Add(20 * time.Second)
	for len(far.get("app chg_1")) == 0 || len(far.get("app chg_2")) == 0 || len(far.get("resend POST emails")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not deliver in 20s: %v\n%s", far.seen, s.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Stopping the service flushes the spans still queued.
	s.stop()
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("service did not stop")
	}
	s.done <- nil // for the cleanup's wait

	spans := receiver.all()
	byID := map[string]span{}
	for _, sp := range spans {
		byID[sp.id] = sp
	}
	find := func(name string, match func(span) bool) span {
		t.Helper()
		for _, sp := range spans {
			if sp.name == name && (match == nil || match(sp)) {
				return sp
			}
		}
		var names []string
		for _, sp := range spans {
			names = append(names, sp.name+"/"+sp.trace[:6])
		}
		t.Fatalf("no span %q among %d: %v", name, len(spans), names)
		return span{}
	}
	childOf := func(parent span, name string) span {
		t.Helper()
		return find(name, func(sp span) bool { return sp.parent == parent.id && sp.trace == parent.trace })
	}
	underAny := func(parent span) bool {
		for _, sp := range spans {
			if sp.parent == parent.id {
				return true
			}
		}
		return false
	}
	pool, err := pgxpool.New(t.Context(), s.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	for _, tc := range []struct {
		provider, eventID, effect, change, consumer, farPath string
	}{
		{"stripe", "evt_1QmunchableUpdated0001", "applied", "app chg_1", "relay app_webhook", ""},
		{"resend", "msg_traced_1", "applied", "app chg_2", "relay forward", "resend POST emails"},
	} {
		route := find("POST /webhooks/"+tc.provider, func(sp span) bool { return sp.attrs["webhook.event_id"] == tc.eventID })
		logTree(t, spans, route)
		if route.parent != "" && route.parent != strings.Repeat("0", 16) {
			t.Errorf("%s: the route's span has a parent %q; want a root", tc.provider, route.parent)
		}
		if route.service != "webhooks-under-test" {
			t.Errorf("%s: service.name %q, want OTEL_SERVICE_NAME's", tc.provider, route.service)
		}
		for k, want := range map[string]string{"webhook.provider": tc.provider, "webhook.outcome": "processed", "webhook.effect": tc.effect} {
			if got := route.attrs[k]; got != want {
				t.Errorf("%s route span: %s = %q, want %q", tc.provider, k, got, want)
			}
		}
		for _, name := range []string{"verify", "claim", "apply", "confirm"} {
			childOf(route, name)
		}
		if claim := childOf(route, "claim"); !underAny(claim) {
			t.Errorf("%s: no Redis span under the claim", tc.provider)
		}
		apply := childOf(route, "apply")
		if !underAny(apply) {
			t.Errorf("%s: no Postgres span under apply", tc.provider)
		}
		if tc.provider == "resend" {
			find("HTTP GET", func(sp span) bool { return sp.parent == apply.id })
		}

		// The ledger's row and the change name the trace.
		var traceID, traceparent *string
		if err := pool.QueryRow(t.Context(), `SELECT trace_id FROM webhook_events WHERE event_id = $1`, tc.eventID).Scan(&traceID); err != nil {
			t.Fatal(err)
		}
		if traceID == nil || *traceID != route.trace {
			t.Errorf("%s: webhook_events.trace_id = %v, want %s", tc.provider, traceID, route.trace)
		}
		if err := pool.QueryRow(t.Context(), `SELECT traceparent FROM changes WHERE event_id = $1`, tc.eventID).Scan(&traceparent); err != nil {
			t.Fatal(err)
		}
		if traceparent == nil || !strings.HasPrefix(*traceparent, "00-"+route.trace+"-") {
			t.Fatalf("%s: changes.traceparent = %v, want one of trace %s", tc.provider, traceparent, route.trace)
		}
		maker := strings.Split(*traceparent, "-")[2]
		if byID[maker].trace != route.trace {
			t.Errorf("%s: the change's traceparent names span %s, not one of the delivery's trace", tc.provider, maker)
		}

		// The app's webhook for the change continues the trace, from the
		// relay's span for it, which is a child and a link of the maker.
		relaySpan := find("relay app_webhook", func(sp span) bool { return sp.trace == route.trace })
		if relaySpan.parent != maker || len(relaySpan.links) != 1 || relaySpan.links[0] != maker {
			t.Errorf("%s: relay span's parent %s and links %v; want the change's maker %s for both", tc.provider, relaySpan.parent, relaySpan.links, maker)
		}
		if got := far.get(tc.change); got[0] != "00-"+route.trace+"-"+relaySpan.id+"-01" {
			t.Errorf("%s: the app's webhook carried traceparent %q, want the relay span's 00-%s-%s-01", tc.provider, got[0], route.trace, relaySpan.id)
		}
		if tc.farPath != "" {
			forward := find(tc.consumer, func(sp span) bool { return sp.trace == route.trace })
			got := far.get(tc.farPath)
			if len(got) == 0 || !strings.HasPrefix(got[0], "00-"+route.trace+"-") {
				t.Errorf("the forward's send carried traceparent %q, want one of trace %s", got, route.trace)
			}
			if forward.parent != maker {
				t.Errorf("forward span's parent %s, want the change's maker %s", forward.parent, maker)
			}
		}

		// The delivery's log line names the trace and the route's span.
		var logged bool
		for _, line := range strings.Split(s.logs.String(), "\n") {
			var l struct {
				Msg, EventID, TraceID, SpanID string
			}
			var raw map[string]any
			if json.Unmarshal([]byte(line), &raw) != nil || raw["msg"] != "webhook delivery" || raw["event_id"] != tc.eventID {
				continue
			}
			l.TraceID, _ = raw["trace_id"].(string)
			l.SpanID, _ = raw["span_id"].(string)
			logged = l.TraceID == route.trace && l.SpanID == route.id
		}
		if !logged {
			t.Errorf("%s: no delivery log line with trace_id %s and span_id %s:\n%s", tc.provider, route.trace, route.id, s.logs)
		}
	}
	// The scheduled passes are traces of their own, with their work under
	// them (the Resend sweep lists received mail from the API).
	for _, name := range []string{"job sweep_resend", "ledger retention"} {
		pass := find(name, nil)
		if pass.parent != "" || !underAny(pass) {
			t.Errorf("%s: parent %q, children %v; want a root with its work under it", name, pass.parent, underAny(pass))
		}
	}
	// Every log line, the SDK's included, stays JSON.
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON: %s", line)
		}
	}
}

// A delivery whose trace is not sampled (OTEL_TRACES_SAMPLER=always_off)
// leaves no trace id behind: not in the ledger, not on the change, not on
// its log line.
func TestUnsampledDeliveryKeepsNoTrace(t *testing.T) {
	t.Parallel()
	receiver := &otlpReceiver{}
	collector := httptest.NewServer(receiver)
	t.Cleanup(collector.Close)
	s := startService(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL,
		"OTEL_TRACES_SAMPLER":         "always_off",
	})
	if r := s.postStripe(t, fixture(t)); r.StatusCode != 200 {
		t.Fatalf("stripe delivery: %d", r.StatusCode)
	}
	pool, err := pgxpool.New(t.Context(), s.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var traceID, traceparent *string
	if err := pool.QueryRow(t.Context(), `SELECT w.trace_id, c.traceparent FROM webhook_events w JOIN changes c USING (event_id)
		WHERE w.event_id = 'evt_1QmunchableUpdated0001'`).Scan(&traceID, &traceparent); err != nil {
		t.Fatal(err)
	}
	if traceID != nil || traceparent != nil {
		t.Errorf("unsampled delivery kept trace_id %v and traceparent %v, want NULL", traceID, traceparent)
	}
	if strings.Contains(s.logs.String(), `"trace_id"`) {
		t.Errorf("a log line carries a trace id:\n%s", s.logs)
	}
}

// logTree logs root's trace as the receiver got it, one span a line,
// children indented under their parent (go test -v shows it).
func logTree(t *testing.T, spans []span, root span) {
	t.Helper()
	var b strings.Builder
	var walk func(id string, depth int)
	walk = func(id string, depth int) {
		for _, sp := range spans {
			if sp.trace == root.trace && sp.parent == id {
				fmt.Fprintf(&b, "%s%s %s", strings.Repeat("  ", depth), sp.name, sp.id)
				for _, k := range []string{"webhook.event_id", "webhook.outcome", "webhook.effect", "relay.change_id", "relay.result"} {
					if v, ok := sp.attrs[k]; ok {
						fmt.Fprintf(&b, " %s=%s", k, v)
					}
				}
				b.WriteString("\n")
				walk(sp.id, depth+1)
			}
		}
	}
	fmt.Fprintf(&b, "trace %s\n", root.trace)
	walk(root.parent, 0)
	t.Log(b.String())
}
