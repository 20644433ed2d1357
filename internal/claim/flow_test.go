package claim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/intake"
)

var stripe = Provider{Name: "stripe", DedupeTTL: time.Hour}

func newTestFlow(t *testing.T, s *Store, handlerTimeout time.Duration) *Flow {
	t.Helper()
	return NewFlow(s, FlowConfig{
		HandlerTimeout: handlerTimeout,
		Logger:         slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer:     prometheus.NewRegistry(),
	})
}

// counter counts Apply calls: the number of times an effect would be applied.
type counter struct{ n atomic.Int32 }

func (c *counter) apply(err error) func(context.Context) (Effect, error) {
	return func(context.Context) (Effect, error) {
		c.n.Add(1)
		if err != nil {
			return "", err
		}
		return Applied, nil
	}
}

type delivery struct {
	body []byte
	ev   Event
}

func newDelivery(id string, apply func(context.Context) (Effect, error)) delivery {
	return delivery{body: []byte(`{"id":"` + id + `"}`), ev: Event{ID: id, Type: "test.event", Apply: apply}}
}

func (f *Flow) runTest(ctx context.Context, p Provider, d delivery) verdict {
	return f.run(ctx, p, d.body, d.ev)
}

func TestRunFirstThenDuplicate(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, time.Second)
	var c counter

	if o := f.runTest(t.Context(), stripe, newDelivery("evt_a", c.apply(nil))); o.outcome != Processed || o.degraded != "" {
		t.Fatalf("first run = %+v, want processed", o)
	}
	if o := f.runTest(t.Context(), stripe, newDelivery("evt_a", c.apply(nil))); o.outcome != Duplicate || o.mismatch {
		t.Fatalf("second run = %+v, want duplicate", o)
	}
	if got := c.n.Load(); got != 1 {
		t.Errorf("applied %d times, want 1", got)
	}
}

// Only a confirmed key is a duplicate: a retry that meets a claim still
// being processed must be told to come back, not that it is done.
func TestRunInProgressIsNotDuplicate(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, 5*time.Second)
	started, release := make(chan struct{}), make(chan struct{})
	var first verdict
	var wg sync.WaitGroup
	wg.Go(func() {
		first = f.runTest(t.Context(), stripe, newDelivery("evt_b", func(context.Context) (Effect, error) {
			close(started)
			<-release
			return Applied, nil
		}))
	})
	<-started
	var c counter
	retry := f.runTest(t.Context(), stripe, newDelivery("evt_b", c.apply(nil)))
	close(release)
	wg.Wait()

	if retry.outcome != InProgress || retry.retryAfter <= 50*time.Second {
		t.Errorf("retry during processing = %+v, want in progress with about a minute to wait", retry)
	}
	if c.n.Load() != 0 {
		t.Error("the retry applied the event while the first attempt held the claim")
	}
	if first.outcome != Processed {
		t.Errorf("first attempt = %+v, want processed", first)
	}
}

// TestRunBusyGivesBack: an Apply turned away for want of a budget
// (ErrBusy) answers 503 with Retry-After, gives its claim back so that the
// retry is a first delivery, and counts no failure towards poison.
func TestRunBusyGivesBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, time.Second)
	var c counter
	busy := fmt.Errorf("mail budget: %w", ErrBusy)
	for range 3 {
		o := f.runTest(ctx, stripe, newDelivery("evt_busy", c.apply(busy)))
		if o.outcome != Unavailable || !o.busy || o.retryAfter != BusyRetry {
			t.Fatalf("busy run = %+v, want unavailable, busy, Retry-After %s", o, BusyRetry)
		}
	}
	key := s.Key("stripe", "evt_busy")
	if n := rdb.Exists(ctx, key, failuresKey(key)).Val(); n != 0 {
		t.Fatalf("%d of the claim and its failure count left after busy runs, want none", n)
	}
	if o := f.runTest(ctx, stripe, newDelivery("evt_busy", c.apply(nil))); o.outcome != Processed {
		t.Fatalf("retry = %+v, want processed", o)
	}
}

func TestRunFailureReleasesForRetry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, time.Second)
	var c counter

	o := f.runTest(ctx, stripe, newDelivery("evt_c", c.apply(errors.New("postgres down"))))
	if o.outcome != Failed {
		t.Fatalf("failing run = %+v, want failed", o)
	}
	if n := rdb.Exists(ctx, s.Key("stripe", "evt_c")).Val(); n != 0 {
		t.Fatal("claim still held after a caught failure")
	}
	if o := f.runTest(ctx, stripe, newDelivery("evt_c", c.apply(nil))); o.outcome != Processed {
		t.Fatalf("retry = %+v, want processed", o)
	}
}

func TestRunPanicReleases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, time.Second)
	o := f.runTest(ctx, stripe, newDelivery("evt_p", func(context.Context) (Effect, error) { panic("boom") }))
	if o.outcome != Failed || o.err == nil {
		t.Fatalf("panicking run = %+v, want failed with an error", o)
	}
	if n := rdb.Exists(ctx, s.Key("stripe", "evt_p")).Val(); n != 0 {
		t.Fatal("claim still held after a panic")
	}
}

func TestRunHandlerDeadline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, 100*time.Millisecond)
	start := time.Now()
	o := f.runTest(ctx, stripe, newDelivery("evt_d", func(ctx context.Context) (Effect, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}))
	if o.outcome != Failed || !errors.Is(o.err, context.DeadlineExceeded) {
		t.Fatalf("stuck handler = %+v, want failed by the deadline", o)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("stuck handler answered after %s, deadline 100ms", elapsed)
	}
	if n := rdb.Exists(ctx, s.Key("stripe", "evt_d")).Val(); n != 0 {
		t.Fatal("claim still held after the deadline")
	}
}

// The provider hanging up must not abort an effect that is about to commit.
func TestRunSurvivesRequestCancellation(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, 5*time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	o := f.runTest(ctx, stripe, newDelivery("evt_cancel", func(ctx context.Context) (Effect, error) {
		cancel()
		time.Sleep(20 * time.Millisecond)
		return "", ctx.Err()
	}))
	if o.outcome != Processed {
		t.Fatalf("run whose request was cancelled = %+v, want processed", o)
	}
}

// TestRunCancelledBeforeTheClaim: a caller that gave up before the claim
// answered (a provider that hung up, a replay or sweep being stopped) gets
// a failure, and nothing runs: failing open there would run the effect
// beside an attempt that holds the claim, and report a Redis that is fine
// as failing.
func TestRunCancelledBeforeTheClaim(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, time.Second)
	var c counter
	held := newDelivery("evt_held", c.apply(nil))
	token, _, err := s.claim(t.Context(), stripe.Name, held.ev.ID, fingerprint(held.body))
	if err != nil || token == "" {
		t.Fatalf("claim by the other attempt: token %q, %v", token, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	o := f.runTest(ctx, stripe, held)
	if o.outcome != Failed || o.degraded != "" || !errors.Is(o.err, context.Canceled) || c.n.Load() != 0 {
		t.Fatalf("run cancelled before its claim = %+v (applied %d), want failed, not degraded, context.Canceled, nothing run", o, c.n.Load())
	}
	if got := testutil.ToFloat64(f.metrics.degraded.WithLabelValues("stripe", reasonRedisError)); got != 0 {
		t.Errorf("degraded metric = %v, want 0", got)
	}
}

func TestRunConcurrentDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, 5*time.Second)
	var c counter
	apply := func(context.Context) (Effect, error) {
		c.n.Add(1)
		time.Sleep(50 * time.Millisecond)
		return Applied, nil
	}
	results := make(chan Outcome, 20)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { results <- f.runTest(t.Context(), stripe, newDelivery("evt_e", apply)).outcome })
	}
	wg.Wait()
	close(results)
	counts := map[Outcome]int{}
	for r := range results {
		counts[r]++
	}
	if c.n.Load() != 1 || counts[Processed] != 1 || counts[InProgress]+counts[Duplicate] != 19 {
		t.Errorf("20 concurrent deliveries: applied %d times, outcomes %v; want 1 applied, 1 processed, 19 in progress or duplicate", c.n.Load(), counts)
	}
}

func TestRunWithoutRedis(t *testing.T) {
	t.Parallel()
	s := NewStore(nil, StoreConfig{Prefix: "webhook", Timeout: time.Second, ProcessingTTL: time.Minute})

	t.Run("open", func(t *testing.T) {
		f := newTestFlow(t, s, time.Second)
		var c counter
		o := f.runTest(t.Context(), stripe, newDelivery("evt_f", c.apply(nil)))
		if o.outcome != Processed || o.degraded != reasonNoRedis || c.n.Load() != 1 {
			t.Fatalf("fail-open run = %+v (applied %d), want processed, degraded no_redis", o, c.n.Load())
		}
		if got := testutil.ToFloat64(f.metrics.degraded.WithLabelValues("stripe", reasonNoRedis)); got != 1 {
			t.Errorf("degraded metric = %v, want 1", got)
		}
	})
	t.Run("closed", func(t *testing.T) {
		f := newTestFlow(t, s, time.Second)
		var c counter
		closed := stripe
		closed.FailClosed = true
		o := f.runTest(t.Context(), closed, newDelivery("evt_g", c.apply(nil)))
		if o.outcome != Unavailable || o.retryAfter <= 0 || c.n.Load() != 0 {
			t.Fatalf("fail-closed run = %+v (applied %d), want unavailable with a Retry-After and nothing run", o, c.n.Load())
		}
	})
}

func TestRunRedisErrorFailsOpen(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	broken := NewStore(s.rdb, StoreConfig{Prefix: s.prefix, Timeout: time.Second, ProcessingTTL: time.Minute})
	closedClient := *s.rdb.(*redis.Client).Options()
	closedClient.Addr = "127.0.0.1:1" // nothing listens on port 1
	closedClient.MaxRetries = -1
	broken.rdb = newClient(t, &closedClient)
	f := newTestFlow(t, broken, time.Second)
	var c counter
	o := f.runTest(t.Context(), stripe, newDelivery("evt_h", c.apply(nil)))
	if o.outcome != Processed || o.degraded != reasonRedisError || c.n.Load() != 1 {
		t.Fatalf("run with redis refusing = %+v (applied %d), want processed, degraded redis_error", o, c.n.Load())
	}
}

func TestRunBodyMismatch(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	f := newTestFlow(t, s, time.Second)
	var c counter
	d := newDelivery("evt_m", c.apply(nil))
	if o := f.runTest(t.Context(), stripe, d); o.outcome != Processed {
		t.Fatalf("first = %+v", o)
	}
	d.body = []byte(`{"id":"evt_m","forged":true}`)
	o := f.runTest(t.Context(), stripe, d)
	if o.outcome != Duplicate || !o.mismatch || c.n.Load() != 1 {
		t.Fatalf("same id, other body = %+v (applied %d), want a duplicate flagged as mismatch, nothing applied", o, c.n.Load())
	}
	if got := testutil.ToFloat64(f.metrics.mismatch.WithLabelValues("stripe")); got != 1 {
		t.Errorf("mismatch metric = %v, want 1", got)
	}
}

// respond is the one mapping from outcome to answer: DESIGN.md's table.
func TestRespond(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		v          verdict
		status     int
		idem       string
		retryAfter string
		body       string
	}{
		{"processed", verdict{outcome: Processed}, 200, "first", "", `{"received":true}`},
		{"failed", verdict{outcome: Failed}, 500, "first", "", `{"error":"webhook processing failed"}`},
		{"duplicate", verdict{outcome: Duplicate}, 200, "duplicate", "", `{"received":true,"skipped":true}`},
		{"in progress", verdict{outcome: InProgress, retryAfter: 90500 * time.Millisecond}, 409, "in-progress", "91", ""},
		{"in progress, under a second", verdict{outcome: InProgress, retryAfter: 10 * time.Millisecond}, 409, "in-progress", "1", ""},
		{"degraded processed", verdict{outcome: Processed, degraded: reasonNoRedis}, 200, "degraded", "", `{"received":true}`},
		{"degraded failed", verdict{outcome: Failed, degraded: reasonRedisError}, 500, "degraded", "", ""},
		{"fail closed", verdict{outcome: Unavailable, degraded: reasonRedisError, retryAfter: 5 * time.Second}, 503, "degraded", "5", ""},
		{"ignored", verdict{outcome: Ignored}, 200, "", "", `{"received":true,"ignored":true}`},
		{"rejected", verdict{outcome: Rejected, err: errors.New("bad signature")}, 400, "", "", ""},
		{"too large", verdict{outcome: Rejected, err: &http.MaxBytesError{Limit: MaxBody}}, 413, "", "", ""},
		{"not JSON", verdict{outcome: Rejected, err: fmt.Errorf("read: %w", ErrNotJSON)}, 415, "", "", ""},
		{"body too slow", verdict{outcome: Rejected, err: fmt.Errorf("read: %w", intake.ErrTimeout)}, 408, "", "", `{"error":"body not received in time"}`},
		{"body budget spent", verdict{outcome: Rejected, err: intake.ErrBudget}, 503, "", "5", ""},
		{"busy", verdict{outcome: Unavailable, busy: true, retryAfter: BusyRetry}, 503, "first", "10", `{"error":"too much mail in flight, retry later"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			respond(w, tt.v)
			if w.Code != tt.status {
				t.Errorf("status = %d, want %d", w.Code, tt.status)
			}
			if got := w.Header().Get(HeaderIdempotency); got != tt.idem {
				t.Errorf("%s = %q, want %q", HeaderIdempotency, got, tt.idem)
			}
			if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			if tt.body != "" && w.Body.String() != tt.body {
				t.Errorf("body = %s, want %s", w.Body, tt.body)
			}
			if tt.retryAfter != "" {
				if n, err := strconv.Atoi(tt.retryAfter); err != nil || n < 1 {
					t.Errorf("Retry-After %q is not a whole number of seconds >= 1", tt.retryAfter)
				}
			}
		})
	}
}

func TestIsJSON(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/json":                  true,
		"application/json; charset=utf-8":   true,
		"Application/JSON":                  true,
		"application/vnd.api+json":          true,
		"":                                  false,
		"text/plain":                        false,
		"application/x-www-form-urlencoded": false,
		"multipart/form-data; boundary=x":   false,
		"application/jsonp":                 false,
	} {
		if got := isJSON(ct); got != want {
			t.Errorf("isJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}

// histogram returns the sample count and sum of the histogram name{provider}
// in reg.
func histogram(t *testing.T, reg *prometheus.Registry, name, provider string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "provider" && l.GetValue() == provider {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("%s{provider=%q} not registered", name, provider)
	return 0, 0
}

// A retry that meets a claim in progress records the claim's age; a
// duplicate of a done event does not.
func TestRunInProgressObservesClaimAge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, time.Minute)
	reg := prometheus.NewRegistry()
	f := NewFlow(s, FlowConfig{HandlerTimeout: time.Second, Registerer: reg})
	f.Endpoint(stripe)

	d := newDelivery("evt_age", (&counter{}).apply(nil))
	if _, _, err := s.claim(ctx, "stripe", d.ev.ID, fingerprint(d.body)); err != nil {
		t.Fatal(err)
	}
	const held = 300 * time.Millisecond
	time.Sleep(held)
	if v := f.runTest(ctx, stripe, d); v.outcome != InProgress {
		t.Fatalf("retry while the claim is held = %+v, want in progress", v)
	}
	n, sum := histogram(t, reg, "webhook_claim_age_seconds", "stripe")
	if n != 1 || sum < held.Seconds() || sum > 30 {
		t.Errorf("claim age: %d observations, sum %.3fs; want 1 of at least %s", n, sum, held)
	}

	done := newDelivery("evt_age_done", (&counter{}).apply(nil))
	for range 2 {
		f.runTest(ctx, stripe, done)
	}
	if n, _ := histogram(t, reg, "webhook_claim_age_seconds", "stripe"); n != 1 {
		t.Errorf("claim age observed %d times after a done duplicate, want still 1", n)
	}
}

// An event that fails POISON_AFTER times is logged once at error, naming
// provider, event id, type and the last error, and counted once, however
// often it fails after that.
func TestRunPoisonEventNamedAndCountedOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, time.Minute)
	var logs bytes.Buffer // the flow logs on the test's goroutine
	f := NewFlow(s, FlowConfig{
		HandlerTimeout: time.Second,
		PoisonAfter:    3,
		Logger:         slog.New(slog.NewJSONHandler(&logs, nil)),
		Registerer:     prometheus.NewRegistry(),
	})
	poisonLines := func() []map[string]any {
		var out []map[string]any
		for line := range strings.Lines(logs.String()) {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			if strings.HasPrefix(m["msg"].(string), "poison event") {
				out = append(out, m)
			}
		}
		return out
	}
	poison := f.metrics.poison.WithLabelValues("stripe")

	for attempt := 1; attempt <= 5; attempt++ {
		d := newDelivery("evt_poison", func(context.Context) (Effect, error) { return "", fmt.Errorf("attempt %d: row too big", attempt) })
		if v := f.runTest(ctx, stripe, d); v.outcome != Failed {
			t.Fatalf("attempt %d = %+v, want failed", attempt, v)
		}
		wantCount, wantLines := 0.0, 0
		if attempt >= 3 {
			wantCount, wantLines = 1, 1
		}
		if got := testutil.ToFloat64(poison); got != wantCount {
			t.Errorf("after attempt %d: webhook_poison_events_total = %v, want %v", attempt, got, wantCount)
		}
		if got := len(poisonLines()); got != wantLines {
			t.Errorf("after attempt %d: %d poison log lines, want %d", attempt, got, wantLines)
		}
	}
	lines := poisonLines()
	if len(lines) != 1 {
		t.Fatalf("%d poison log lines, want 1", len(lines))
	}
	want := map[string]any{"level": "ERROR", "provider": "stripe", "event_id": "evt_poison", "event_type": "test.event", "attempts": 3.0, "err": "attempt 3: row too big"}
	for k, v := range want {
		if lines[0][k] != v {
			t.Errorf("poison log line %s = %v, want %v", k, lines[0][k], v)
		}
	}
	// Another event's failures are its own.
	other := newDelivery("evt_other", (&counter{}).apply(errors.New("once")))
	f.runTest(ctx, stripe, other)
	if got := testutil.ToFloat64(poison); got != 1 {
		t.Errorf("one failure of another event moved the poison count to %v", got)
	}
}

// commandLog records the commands a Redis client sends.
type commandLog struct {
	mu   sync.Mutex
	cmds []string
}

func (c *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *commandLog) add(cmd redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmds = append(c.cmds, cmd.Name())
}

func (c *commandLog) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.cmds
	c.cmds = nil
	return out
}

// The failure counter lives on the failure path only: a successful
// delivery costs the claim and the confirm, nothing more, and leaves no
// counter behind.
func TestRunSuccessMakesNoExtraRedisCall(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, time.Minute)
	var log commandLog
	rdb.AddHook(&log)
	f := NewFlow(s, FlowConfig{HandlerTimeout: time.Second, PoisonAfter: 5})

	// The first claim may load the script (EVALSHA, NOSCRIPT, EVAL).
	f.runTest(ctx, stripe, newDelivery("evt_warm", (&counter{}).apply(nil)))
	log.take()

	if v := f.runTest(ctx, stripe, newDelivery("evt_ok", (&counter{}).apply(nil))); v.outcome != Processed {
		t.Fatalf("delivery = %+v, want processed", v)
	}
	if diff := cmp.Diff([]string{"evalsha", "set"}, log.take()); diff != "" {
		t.Errorf("Redis commands of a successful delivery (-want +got):\n%s", diff)
	}
	if n := rdb.Exists(ctx, failuresKey(s.Key("stripe", "evt_ok"))).Val(); n != 0 {
		t.Error("a successful delivery left a failure counter")
	}

	// The failure path is where the counter is written.
	f.runTest(ctx, stripe, newDelivery("evt_fail", (&counter{}).apply(errors.New("down"))))
	if n := rdb.Exists(ctx, failuresKey(s.Key("stripe", "evt_fail"))).Val(); n != 1 {
		t.Error("a failed delivery left no failure counter")
	}
}

// Process hands back what the store did, so that a caller outside HTTP
// (stripe replay) needs no side channel; a duplicate did nothing.
func TestProcessReturnsTheEffect(t *testing.T) {
	t.Parallel()
	s, _ := newTestStore(t, time.Minute)
	ep := newTestFlow(t, s, 5*time.Second).Endpoint(stripe)
	for i, effect := range []Effect{Applied, Unchanged, Stale, Unordered} {
		ev := Event{ID: fmt.Sprintf("evt_effect_%d", i), Type: "test.event",
			Apply: func(context.Context) (Effect, error) { return effect, nil }}
		for _, want := range []Result{{Outcome: Processed, Effect: effect}, {Outcome: Duplicate}} {
			got, err := ep.Process(t.Context(), nil, ev)
			if err != nil || got != want {
				t.Errorf("%s: Process = %+v, %v; want %+v", ev.ID, got, err, want)
			}
		}
	}
}
