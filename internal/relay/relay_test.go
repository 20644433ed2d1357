package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// script is a Destination whose answer for a subject is set by the test
// (nil: delivered, result "ok <id>"), recording every attempt in order.
type script struct {
	mu       sync.Mutex
	answers  map[string]func(attempt int) error
	attempts []string // "subject/change id" per attempt
	count    map[int64]int
}

func newScript() *script {
	return &script{answers: map[string]func(int) error{}, count: map[int64]int{}}
}

func (s *script) set(subject string, answer func(attempt int) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[subject] = answer
}

func (s *script) Deliver(_ context.Context, ch ledger.Change) (string, error) {
	s.mu.Lock()
	s.count[ch.ID]++
	n := s.count[ch.ID]
	s.attempts = append(s.attempts, fmt.Sprintf("%s/%d", ch.Subject, ch.ID))
	answer := s.answers[ch.Subject]
	s.mu.Unlock()
	if answer != nil {
		if err := answer(n); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("ok %d", ch.ID), nil
}

func (s *script) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.attempts)
}

// fast is a schedule for tests: retries come at once, twice, then dead.
var fast = []time.Duration{time.Millisecond, time.Millisecond}

type rig struct {
	pool   *pgxpool.Pool
	relay  *relay.Relay
	dest   *script
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func newRig(t *testing.T, pool *pgxpool.Pool, schedule []time.Duration) *rig {
	t.Helper()
	if pool == nil {
		pool = dbtest.NewPool(t)
	}
	r := &rig{pool: pool, dest: newScript(), reg: prometheus.NewRegistry()}
	r.relay = relay.New(relay.Config{
		Pool: pool,
		Consumers: []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage},
			Destination: r.dest, Parallel: 4}},
		Schedule:   schedule,
		Poll:       10 * time.Millisecond,
		Registerer: r.reg,
	})
	return r
}

// start runs the relay until the test ends, with fence (nil: none).
func (r *rig) start(t *testing.T, fence relay.Fence) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.relay.Run(ctx, fence) }()
	t.Cleanup(func() { cancel(); <-r.done })
}

// addChange appends a change as a committed transaction would.
func addChange(t *testing.T, pool *pgxpool.Pool, kind, subject string) int64 {
	t.Helper()
	var id int64
	err := pool.QueryRow(context.Background(),
		`INSERT INTO changes (at, kind, subject, after) VALUES (now(), $1, $2, '{"n":1}') RETURNING id`,
		kind, subject).Scan(&id)
	if err != nil {
		t.Fatalf("add change: %v", err)
	}
	return id
}

// deliveries reads relay_deliveries of consumer test by change id.
func deliveries(t *testing.T, pool *pgxpool.Pool) map[int64]relay.Delivery {
	t.Helper()
	out := map[int64]relay.Delivery{}
	err := relay.List(context.Background(), pool, "test", "", func(d relay.Delivery) error {
		out[d.ChangeID] = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond until it holds, failing the test after a deadline
// generous enough for a loaded machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitState(t *testing.T, pool *pgxpool.Pool, id int64, want relay.State) relay.Delivery {
	t.Helper()
	var got relay.Delivery
	waitFor(t, fmt.Sprintf("change %d %s", id, want), func() bool {
		got = deliveries(t, pool)[id]
		return got.State == want
	})
	return got
}

// waitConsumer waits for the relay to have placed its one consumer.
func waitConsumer(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
}

// failUntilMended makes the rig's destination fail subject's changes
// (a 503) until mend is called.
func failUntilMended(r *rig, subject string) (mend func()) {
	var mu sync.Mutex
	failing := true
	r.dest.set(subject, func(int) error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return errors.New("503")
		}
		return nil
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		failing = false
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, fast)
	boom := errors.New("connection reset")
	r.dest.set("skip", func(int) error { return fmt.Errorf("%w: a loop", relay.ErrSkip) })
	r.dest.set("dead", func(int) error { return fmt.Errorf("%w: 422 bad address", relay.ErrPermanent) })
	r.dest.set("flaky", func(n int) error {
		if n == 1 {
			return boom
		}
		return nil
	})
	r.dest.set("down", func(int) error { return boom })
	r.dest.set("later", func(int) error { return &relay.RetryAfterError{After: time.Hour, Err: errors.New("429")} })
	r.start(t, nil)
	// The consumer is new: it starts at the end of the feed, so the
	// changes go in once it has taken its place.
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	ids := map[string]int64{}
	for _, s := range []string{"ok", "skip", "dead", "flaky", "down", "later"} {
		ids[s] = addChange(t, pool, ledger.KindSupportMessage, s)
	}
	other := addChange(t, pool, ledger.KindSubscription, "sub_1")

	type want struct {
		state    relay.State
		attempts int
		result   string
		err      bool
	}
	for subject, w := range map[string]want{
		"ok":    {relay.Delivered, 1, fmt.Sprintf("ok %d", ids["ok"]), false},
		"skip":  {relay.Skipped, 1, "", true},
		"dead":  {relay.Dead, 1, "", true},
		"flaky": {relay.Delivered, 2, fmt.Sprintf("ok %d", ids["flaky"]), false}, // delivered clears the error
		"down":  {relay.Dead, 3, "", true},                                       // the first attempt and the schedule's two
		"later": {relay.Failed, 1, "", true},
	} {
		d := waitState(t, pool, ids[subject], w.state)
		got := want{d.State, d.Attempts, deref(d.Result), d.LastError != nil}
		if diff := cmp.Diff(w, got, cmp.AllowUnexported(want{})); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", subject, diff)
		}
	}
	later := deliveries(t, pool)[ids["later"]]
	if later.NextAttemptAt == nil || time.Until(*later.NextAttemptAt) < 50*time.Minute {
		t.Errorf("429 with Retry-After 1h: next attempt at %v, want about an hour from now (the schedule says 1ms)", later.NextAttemptAt)
	}
	if _, ok := deliveries(t, pool)[other]; ok {
		t.Errorf("a subscription change was taken by a consumer of support messages")
	}
	for outcome, want := range map[string]float64{"delivered": 2, "skipped": 1, "dead": 2, "failed": 4} {
		if got := testutil.ToFloat64(metric(t, r.reg, "relay_deliveries_total", "test", outcome)); got != want {
			t.Errorf("relay_deliveries_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// metric finds one series of a vector registered in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var vals []string
			for _, l := range m.GetLabel() {
				vals = append(vals, l.GetValue())
			}
			if slices.Equal(vals, labels) {
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(v)
				return g
			}
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return nil
}

// TestOrderWithinSubject: a change waits for the older changes of its
// subject, and only for those.
func TestOrderWithinSubject(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	// Retries every 10 ms for as long as the test takes: thread a fails
	// until the test says otherwise, and must not run out of retries.
	r := newRig(t, pool, slices.Repeat([]time.Duration{10 * time.Millisecond}, 100000))
	var mu sync.Mutex
	failing := true
	r.dest.set("thread-a", func(int) error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return errors.New("503")
		}
		return nil
	})
	r.start(t, nil)
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	a1 := addChange(t, pool, ledger.KindSupportMessage, "thread-a")
	a2 := addChange(t, pool, ledger.KindSupportMessage, "thread-a")
	b1 := addChange(t, pool, ledger.KindSupportMessage, "thread-b")
	b2 := addChange(t, pool, ledger.KindSupportMessage, "thread-b")
	waitState(t, pool, b2, relay.Delivered)
	waitFor(t, "a1 to fail twice", func() bool { return deliveries(t, pool)[a1].Attempts >= 2 })
	if got := deliveries(t, pool)[a2]; got.State != relay.Pending || got.Attempts != 0 {
		t.Fatalf("a2 while a1 fails: %s after %d attempts, want pending, never tried", got.State, got.Attempts)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	waitState(t, pool, a2, relay.Delivered)

	var order []string
	for _, a := range r.dest.log() {
		if !slices.Contains(order, a) {
			order = append(order, a)
		}
	}
	first := func(s string) int { return slices.Index(order, s) }
	name := func(subject string, id int64) string { return fmt.Sprintf("%s/%d", subject, id) }
	if first(name("thread-a", a1)) > first(name("thread-a", a2)) || first(name("thread-b", b1)) > first(name("thread-b", b2)) {
		t.Errorf("attempts out of order within a subject: %v", order)
	}
	// b went while a was failing: b2's first attempt came before a2's.
	if first(name("thread-b", b2)) > first(name("thread-a", a2)) {
		t.Errorf("thread b waited for thread a: %v", order)
	}
}

// TestNewConsumerStartsAtEnd: what was in the feed before a consumer was
// first enabled is not sent.
func TestNewConsumerStartsAtEnd(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	old := addChange(t, pool, ledger.KindSupportMessage, "old")
	r := newRig(t, pool, fast)
	r.start(t, nil)
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	fresh := addChange(t, pool, ledger.KindSupportMessage, "new")
	waitState(t, pool, fresh, relay.Delivered)
	if d, ok := deliveries(t, pool)[old]; ok {
		t.Errorf("the change from before the consumer existed was taken: %+v", d)
	}
}

// TestFence: a relay whose fence fails records nothing and stops.
func TestFence(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	// A first run places the consumer; the change comes after it.
	first := newRig(t, pool, fast)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.relay.Run(ctx, nil) }()
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run ended by its context: %v, want nil", err)
	}
	id := addChange(t, pool, ledger.KindSupportMessage, "x")

	lost := errors.New("lease lost")
	var mu sync.Mutex
	leads := true
	fence := func(context.Context, pgx.Tx) error {
		mu.Lock()
		defer mu.Unlock()
		if !leads {
			return lost
		}
		return nil
	}
	mu.Lock()
	leads = false
	mu.Unlock()
	r := newRig(t, pool, fast)
	err := r.relay.Run(context.Background(), fence)
	if !errors.Is(err, relay.ErrFenced) || !errors.Is(err, lost) {
		t.Fatalf("Run with a failing fence = %v, want ErrFenced wrapping the fence's error", err)
	}
	if got := deliveries(t, pool); len(got) != 0 {
		t.Errorf("a fenced relay recorded %v", got)
	}
	if n := len(r.dest.log()); n != 0 {
		t.Errorf("a fenced relay delivered %d times", n)
	}
	_ = id
}

// TestRetryByHand: a dead delivery runs again at once with relay retry;
// one that is delivered is refused.
func TestRetryByHand(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, fast)
	var mu sync.Mutex
	refuse := true
	r.dest.set("x", func(int) error {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return fmt.Errorf("%w: 403 domain not verified", relay.ErrPermanent)
		}
		return nil
	})
	r.start(t, nil)
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	id := addChange(t, pool, ledger.KindSupportMessage, "x")
	waitState(t, pool, id, relay.Dead)
	mu.Lock()
	refuse = false
	mu.Unlock()
	got, err := r.relay.Retry(context.Background(), "test", id)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != relay.Delivered || got.Attempts != 2 || deref(got.Result) != fmt.Sprintf("ok %d", id) {
		t.Errorf("after retry by hand: %+v, want delivered on the second attempt", got)
	}
	if _, err := r.relay.Retry(context.Background(), "test", id); !errors.Is(err, relay.ErrNotRetryable) {
		t.Errorf("retry of a delivered delivery: %v, want ErrNotRetryable", err)
	}
	if _, err := r.relay.Retry(context.Background(), "test", id+100); !errors.Is(err, relay.ErrNoDelivery) {
		t.Errorf("retry of no delivery: %v, want ErrNoDelivery", err)
	}
	if _, err := r.relay.Retry(context.Background(), "nobody", id); !errors.Is(err, relay.ErrNotConfigured) {
		t.Errorf("retry for an unknown consumer: %v, want ErrNotConfigured", err)
	}
}

// TestGap: a consumer switched off holds retention back no more; switched
// on again after its changes were deleted, the relay counts the gap and
// goes on from what is kept.
func TestGap(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	first := newRig(t, pool, fast)
	first.start(t, nil)
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	first.cancel()
	<-first.done
	first.done <- nil // for the cleanup's receive

	// Switched off (a relay without it runs), the consumer's changes come
	// and go: old enough for retention, deleted.
	off := relay.New(relay.Config{Pool: pool, Poll: 10 * time.Millisecond})
	offCtx, stopOff := context.WithCancel(ctx)
	offDone := make(chan error, 1)
	go func() { offDone <- off.Run(offCtx, nil) }()
	waitFor(t, "the consumer switched off", func() bool {
		var enabled bool
		_ = pool.QueryRow(ctx, `SELECT enabled FROM feed_consumers`).Scan(&enabled)
		return !enabled
	})
	stopOff()
	if err := <-offDone; err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO changes (at, kind, subject, after)
VALUES (now() - interval '40 days', 'support_message', 'lost', '{}')`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "retention to delete the change", func() bool {
		_, n, err := ledger.New(pool, 0).Trim(ctx, 720*time.Hour)
		return err == nil && n == 1
	})

	again := newRig(t, pool, fast)
	again.start(t, nil)
	kept := addChange(t, pool, ledger.KindSupportMessage, "kept")
	waitState(t, pool, kept, relay.Delivered)
	if got := testutil.ToFloat64(metric(t, again.reg, "relay_gaps_total", "test")); got != 1 {
		t.Errorf("relay_gaps_total = %v, want 1", got)
	}
	for _, a := range again.dest.log() {
		if strings.HasPrefix(a, "lost/") {
			t.Errorf("a deleted change was delivered: %s", a)
		}
	}
}

// TestOldestPendingGauge: a delivery that keeps failing shows in
// relay_oldest_pending_seconds; none open is 0.
func TestOldestPendingGauge(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, []time.Duration{time.Hour})
	r.dest.set("down", func(int) error { return errors.New("503") })
	r.start(t, nil)
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	id := addChange(t, pool, ledger.KindSupportMessage, "down")
	waitState(t, pool, id, relay.Failed)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.relay.Observe(ctx, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the gauge to show the failing delivery", func() bool {
		return testutil.ToFloat64(metric(t, r.reg, "relay_oldest_pending_seconds", "test")) > 0
	})
	if _, err := pool.Exec(context.Background(), `UPDATE relay_deliveries SET state = 'dead'`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the gauge back at 0", func() bool {
		return testutil.ToFloat64(metric(t, r.reg, "relay_oldest_pending_seconds", "test")) == 0
	})
}

// TestTrimFinished: delivered and skipped deliveries past the retention
// go; a dead one stays, whatever its age.
func TestTrimFinished(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, change, created_at)
VALUES ('test', 1, 'a', 'a', 'delivered', 1, '{}', now() - interval '40 days'),
       ('test', 2, 'b', 'b', 'skipped', 1, '{}', now() - interval '40 days'),
       ('test', 3, 'c', 'c', 'dead', 8, '{}', now() - interval '40 days'),
       ('test', 4, 'd', 'd', 'delivered', 1, '{}', now())`); err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Config{Pool: pool, Retention: 720 * time.Hour, Poll: 10 * time.Millisecond})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the trim", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries`).Scan(&n)
		return n == 2
	})
	var left []int64
	rows, _ := pool.Query(ctx, `SELECT change_id FROM relay_deliveries ORDER BY change_id`)
	for rows.Next() {
		var id int64
		_ = rows.Scan(&id)
		left = append(left, id)
	}
	rows.Close()
	if !slices.Equal(left, []int64{3, 4}) {
		t.Errorf("left %v, want the dead one and the new one", left)
	}
}

// inFlight is a Destination that takes 5 ms a delivery and notes how many
// run at once, overall and per subject, and each subject's order.
type inFlight struct {
	mu               sync.Mutex
	now, most        int
	bySubject        map[string]int
	mostOfOneSubject int
	order            map[string][]int64
}

func (f *inFlight) Deliver(_ context.Context, ch ledger.Change) (string, error) {
	f.mu.Lock()
	f.now++
	f.bySubject[ch.Subject]++
	f.most = max(f.most, f.now)
	f.mostOfOneSubject = max(f.mostOfOneSubject, f.bySubject[ch.Subject])
	f.order[ch.Subject] = append(f.order[ch.Subject], ch.ID)
	f.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	f.mu.Lock()
	f.now--
	f.bySubject[ch.Subject]--
	f.mu.Unlock()
	return "ok", nil
}

// TestParallelNeverTwoOfASubject: the app's webhook runs several
// deliveries at once, but never two of one subject, and each subject's in
// order.
func TestParallelNeverTwoOfASubject(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	dest := &inFlight{bySubject: map[string]int{}, order: map[string][]int64{}}
	rel := relay.New(relay.Config{Pool: pool, Poll: 10 * time.Millisecond,
		Consumers: []relay.Consumer{{Name: relay.AppWebhookConsumer, Kinds: []string{ledger.KindSubscription},
			Destination: dest, Parallel: relay.AppWebhookParallel}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rel.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers`).Scan(&n)
		return n == 1
	})
	want := map[string][]int64{}
	for range 5 {
		for s := range 12 {
			subject := fmt.Sprintf("sub_%d", s)
			want[subject] = append(want[subject], addChange(t, pool, ledger.KindSubscription, subject))
		}
	}
	waitFor(t, "every delivery", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM relay_deliveries WHERE state = 'delivered'`).Scan(&n)
		return n == 60
	})
	dest.mu.Lock()
	defer dest.mu.Unlock()
	if dest.mostOfOneSubject != 1 {
		t.Errorf("%d deliveries of one subject at once, want 1", dest.mostOfOneSubject)
	}
	if dest.most < 2 || dest.most > relay.AppWebhookParallel {
		t.Errorf("%d deliveries at once, want 2 to %d", dest.most, relay.AppWebhookParallel)
	}
	for subject, ids := range want {
		if !slices.Equal(dest.order[subject], ids) {
			t.Errorf("%s delivered as %v, want %v", subject, dest.order[subject], ids)
		}
	}
}

// TestOrderAcrossPages: a change that comes after an older one of its
// subject failed, in a later read of the feed, is recorded pending and
// not sent until the older one is delivered.
func TestOrderAcrossPages(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, slices.Repeat([]time.Duration{10 * time.Millisecond}, 100000))
	mend := failUntilMended(r, "thread-a")
	r.start(t, nil)
	waitConsumer(t, pool)
	a1 := addChange(t, pool, ledger.KindSupportMessage, "thread-a")
	waitFor(t, "a1 to fail", func() bool { return deliveries(t, pool)[a1].State == relay.Failed })
	a2 := addChange(t, pool, ledger.KindSupportMessage, "thread-a")
	b1 := addChange(t, pool, ledger.KindSupportMessage, "thread-b")
	waitState(t, pool, b1, relay.Delivered)
	waitFor(t, "a1 to fail again", func() bool { return deliveries(t, pool)[a1].Attempts >= 3 })
	if got := deliveries(t, pool)[a2]; got.State != relay.Pending || got.Attempts != 0 {
		t.Fatalf("a2 while a1 fails: %s after %d attempts, want pending, never tried", got.State, got.Attempts)
	}
	mend()
	waitState(t, pool, a2, relay.Delivered)
	if got := deliveries(t, pool)[a1]; got.State != relay.Delivered {
		t.Errorf("a1 %s, want delivered", got.State)
	}
}
