package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// A change made by a traced delivery (changes.traceparent) is sent to the
// app under a relay span that continues the delivery's trace (its child,
// and a link to it), and the app's webhook carries that span as its
// traceparent; a change without one is a trace of its own.
func TestRelayContinuesTheDeliveryTrace(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	rec, srv := newAppReceiver(t, appStatus(204))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	r := relay.New(relay.Config{
		Pool: pool,
		Consumers: []relay.Consumer{{Name: relay.AppWebhookConsumer, Kinds: []string{ledger.KindSubscription},
			Destination: newAppWebhook(t, srv.URL, ledger.KindSubscription)}},
		Poll:   10 * time.Millisecond,
		Tracer: tp,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})

	const maker = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	add := func(subject string, traceparent *string) int64 {
		var id int64
		if err := pool.QueryRow(context.Background(),
			`INSERT INTO changes (at, kind, subject, after, traceparent) VALUES (now(), 'subscription', $1, '{"n":1}', $2) RETURNING id`,
			subject, traceparent).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	tp1 := maker
	traced, untraced := add("sub_traced", &tp1), add("sub_untraced", nil)
	waitFor(t, "both webhooks", func() bool { return len(rec.got()) == 2 && len(spans.Ended()) == 2 })

	byChange := map[int64]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "relay.change_id" {
				byChange[a.Value.AsInt64()] = s
			}
		}
	}
	headers := map[string]string{}
	for _, req := range rec.got() {
		headers[req.Header.Get("webhook-id")] = req.Header.Get("traceparent")
	}

	s := byChange[traced]
	if s == nil {
		t.Fatalf("no span for change %d among %d", traced, len(spans.Ended()))
	}
	if s.Name() != "relay app_webhook" {
		t.Errorf("span name %q, want relay app_webhook", s.Name())
	}
	if got, want := s.SpanContext().TraceID().String(), "4bf92f3577b34da6a3ce929d0e0e4736"; got != want {
		t.Errorf("relay span's trace %s, want the delivery's %s", got, want)
	}
	if got := s.Parent().SpanID().String(); got != "00f067aa0ba902b7" {
		t.Errorf("relay span's parent %s, want the span that made the change", got)
	}
	if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("relay span's links %v, want the span that made the change", links)
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + s.SpanContext().SpanID().String() + "-01"
	if got := headers[relay.AppWebhookID(traced)]; got != want {
		t.Errorf("the app's webhook carried traceparent %q, want %q", got, want)
	}

	u := byChange[untraced]
	if u == nil {
		t.Fatalf("no span for change %d", untraced)
	}
	if u.Parent().IsValid() || len(u.Links()) != 0 || u.SpanContext().TraceID() == s.SpanContext().TraceID() {
		t.Errorf("an untraced change's span has parent %v, links %v: want a trace of its own", u.Parent(), u.Links())
	}
	if got := headers[relay.AppWebhookID(untraced)]; got != "00-"+u.SpanContext().TraceID().String()+"-"+u.SpanContext().SpanID().String()+"-01" {
		t.Errorf("the untraced change's webhook carried %q, want its own relay span", got)
	}
}

// With tracing off (no span in the context) the app's webhook carries no
// traceparent.
func TestAppWebhookWithoutTraceSendsNoTraceparent(t *testing.T) {
	t.Parallel()
	rec, srv := newAppReceiver(t, appStatus(204))
	if _, err := newAppWebhook(t, srv.URL).Deliver(context.Background(), appChange(7)); err != nil {
		t.Fatal(err)
	}
	if got := rec.got()[0].Header.Get("traceparent"); got != "" {
		t.Errorf("an untraced webhook carried traceparent %q", got)
	}
}

// A failed attempt's log line is logged in the context of the attempt's
// span: with a logger that follows traces (serve's, when tracing is on),
// it carries the span's trace_id and span_id.
func TestFailedAttemptLogCarriesItsTrace(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	var logs syncBuffer
	spans := tracetest.NewSpanRecorder()
	dest := newScript()
	dest.set("down", func(int) error { return errors.New("connection refused") })
	r := relay.New(relay.Config{
		Pool:      pool,
		Consumers: []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: dest}},
		Schedule:  []time.Duration{time.Hour},
		Poll:      10 * time.Millisecond,
		Logger:    slog.New(tracing.LogHandler(slog.NewJSONHandler(&logs, nil))),
		Tracer:    sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	waitConsumer(t, pool)
	id := addChange(t, pool, ledger.KindSupportMessage, "down")
	waitState(t, pool, id, relay.Failed)
	// The line follows the record's commit.
	var line map[string]any
	waitFor(t, "the failed attempt's line", func() bool {
		for _, m := range logs.lines(t) {
			if m["msg"] == "relay: delivery attempt failed" {
				line = m
			}
		}
		return line != nil
	})

	ended := spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want the attempt's", len(ended))
	}
	sc := ended[0].SpanContext()
	if line["trace_id"] != sc.TraceID().String() || line["span_id"] != sc.SpanID().String() {
		t.Errorf("the attempt's line has trace_id %v, span_id %v; want the attempt's span %s %s",
			line["trace_id"], line["span_id"], sc.TraceID(), sc.SpanID())
	}
}
