package claim

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// recorder is a Recorder that remembers what it was handed.
type recorder struct {
	calls  []recorded
	bodies [][]byte // as handed over, not copied here
}

type recorded struct {
	provider, eventID, eventType, body, cause string
}

func (r *recorder) RecordFailure(_ context.Context, provider, eventID, eventType string, body []byte, cause error) (bool, error) {
	r.calls = append(r.calls, recorded{provider, eventID, eventType, "", cause.Error()})
	r.bodies = append(r.bodies, body)
	return len(r.calls) >= 2, nil
}

// TestFailuresGoToTheLedger: each failed attempt, and only those, is
// handed to the ledger after the release, with a copy of the body that
// outlives the intake's buffer; degraded attempts too.
func TestFailuresGoToTheLedger(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, time.Minute)
	rec := &recorder{}
	f := NewFlow(s, FlowConfig{
		HandlerTimeout: time.Second,
		PoisonAfter:    2,
		Logger:         slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer:     prometheus.NewRegistry(),
		Ledger:         rec,
	})
	fail := newDelivery("evt_f", func(context.Context) (Effect, error) { return "", errors.New("boom") })
	f.runTest(ctx, stripe, fail)
	copy(fail.body, "XXXXX") // the intake reuses its buffer
	f.runTest(ctx, stripe, newDelivery("evt_ok", (&counter{}).apply(nil)))
	if len(rec.calls) != 1 {
		t.Fatalf("ledger handed %d failures, want 1: %+v", len(rec.calls), rec.calls)
	}
	if got, want := rec.calls[0], (recorded{"stripe", "evt_f", "test.event", "", "boom"}); got != want {
		t.Errorf("recorded %+v, want %+v", got, want)
	}
	if got := string(rec.bodies[0]); got != `{"id":"evt_f"}` {
		t.Errorf("kept body = %q after the buffer was reused, want a copy of the delivery's", got)
	}

	degraded := NewFlow(NewStore(nil, StoreConfig{Prefix: "x", Timeout: time.Second, ProcessingTTL: time.Minute}), FlowConfig{
		HandlerTimeout: time.Second, Ledger: rec,
	})
	degraded.runTest(ctx, stripe, newDelivery("evt_d", func(context.Context) (Effect, error) { return "", errors.New("down") }))
	if len(rec.calls) != 2 || rec.calls[1].eventID != "evt_d" {
		t.Errorf("a degraded failure was not recorded: %+v", rec.calls)
	}
}
