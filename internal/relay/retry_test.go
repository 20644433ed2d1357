package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// TestRetryMatching: a destination that refused every change (dead at
// once) is mended, and one call runs every dead delivery again, each
// subject's in order; the relay that leads counts those attempts in
// relay_deliveries_total as its own, and the dead gauge goes back to 0.
// While the destination still refuses, the run gives up after the
// failures in a row it was given.
func TestRetryMatching(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	r := newRig(t, pool, fast)
	var mu sync.Mutex
	refuse := true
	down := func(int) error {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return fmt.Errorf("%w: 401 unauthorized", relay.ErrPermanent)
		}
		return nil
	}
	r.dest.set("a", down)
	r.dest.set("b", down)
	r.start(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	observed := make(chan struct{})
	go func() { r.relay.Observe(ctx, 10*time.Millisecond); close(observed) }()
	t.Cleanup(func() { cancel(); <-observed })
	waitConsumer(t, pool)
	a1 := addChange(t, pool, ledger.KindSupportMessage, "a")
	a2 := addChange(t, pool, ledger.KindSupportMessage, "a")
	b1 := addChange(t, pool, ledger.KindSupportMessage, "b")
	c1 := addChange(t, pool, ledger.KindSupportMessage, "c")
	for _, id := range []int64{a1, a2, b1} {
		waitState(t, pool, id, relay.Dead)
	}
	waitState(t, pool, c1, relay.Delivered)
	waitFor(t, "the dead gauge at 3", func() bool {
		return testutil.ToFloat64(metric(t, r.reg, "relay_dead_deliveries", "test")) == 3
	})

	// relay retry runs in a command, with a relay of its own that does
	// not run the loop and whose counters no one scrapes.
	hand := relay.New(relay.Config{
		Pool:       pool,
		Consumers:  []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: r.dest}},
		Schedule:   fast,
		Registerer: prometheus.NewRegistry(),
	})
	var seen []int64
	progress := func(d relay.Delivery, err error) { seen = append(seen, d.ChangeID) }
	sum, err := hand.RetryMatching(context.Background(), relay.RetryFilter{Consumer: "test", State: relay.Dead, Rate: 100, GiveUpAfter: 2}, progress)
	if !errors.Is(err, relay.ErrGaveUp) || !sum.GaveUp || sum.Attempted != 2 || sum.Matched != 3 {
		t.Fatalf("retry while the destination refuses: %+v, %v; want it to give up after 2 of 3", sum, err)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	before := len(r.dest.log())
	seen = nil
	sum, err = hand.RetryMatching(context.Background(), relay.RetryFilter{Consumer: "test", State: relay.Dead, Rate: 100}, progress)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Matched != 3 || sum.Attempted != 3 || sum.States[relay.Delivered] != 3 {
		t.Errorf("retry once mended: %+v, want 3 matched, 3 delivered", sum)
	}
	if want := []int64{a1, a2, b1}; !slices.Equal(seen, want) {
		t.Errorf("retried %v, want %v (by change, so each subject in order)", seen, want)
	}
	sends := r.dest.log()[before:]
	if want := []string{fmt.Sprintf("a/%d", a1), fmt.Sprintf("a/%d", a2), fmt.Sprintf("b/%d", b1)}; !slices.Equal(sends, want) {
		t.Errorf("sent %v, want %v", sends, want)
	}
	// 3 dead at first, 2 dead again, then 3 delivered by hand; c1 by the
	// relay.
	waitFor(t, "the leader to count the hand attempts", func() bool {
		return testutil.ToFloat64(metric(t, r.reg, "relay_deliveries_total", "test", "delivered")) == 4 &&
			testutil.ToFloat64(metric(t, r.reg, "relay_deliveries_total", "test", "dead")) == 5
	})
	if n := testutil.ToFloat64(metric(t, r.reg, "relay_deliveries_total", "test", "delivered")); n != 4 {
		t.Errorf("delivered counted %v times, want 4 (once each)", n)
	}
	waitFor(t, "the dead gauge back at 0", func() bool {
		return testutil.ToFloat64(metric(t, r.reg, "relay_dead_deliveries", "test")) == 0
	})
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM relay_hand_attempts`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d hand attempts left uncounted (%v)", left, err)
	}
}

// syncBuffer is a log destination the relay's goroutines share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for line := range bytes.Lines(b.buf.Bytes()) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestFailuresLogged: each failed attempt is logged once at warn, with the
// consumer, the change, the attempt, the error and the next attempt; the
// attempt that makes a delivery dead at error; a delivered one not at all.
func TestFailuresLogged(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	var logs syncBuffer
	dest := newScript()
	dest.set("down", func(int) error { return errors.New("connection refused") })
	dest.set("refused", func(int) error { return fmt.Errorf("%w: 401", relay.ErrPermanent) })
	rl := relay.New(relay.Config{
		Pool:      pool,
		Consumers: []relay.Consumer{{Name: "test", Kinds: []string{ledger.KindSupportMessage}, Destination: dest, Parallel: 4}},
		Schedule:  []time.Duration{time.Millisecond, time.Millisecond},
		Poll:      10 * time.Millisecond,
		Logger:    slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	waitConsumer(t, pool)
	down := addChange(t, pool, ledger.KindSupportMessage, "down")
	refused := addChange(t, pool, ledger.KindSupportMessage, "refused")
	ok := addChange(t, pool, ledger.KindSupportMessage, "ok")
	waitState(t, pool, down, relay.Dead)
	waitState(t, pool, refused, relay.Dead)
	waitState(t, pool, ok, relay.Delivered)

	type line struct {
		level   string
		change  int64
		attempt int
		next    bool
	}
	var got []line
	for _, m := range logs.lines(t) {
		// Only the attempts' lines: a pass that failed under load (a
		// timeout on a busy server) logs too, and is not an attempt.
		if msg, _ := m["msg"].(string); !strings.HasPrefix(msg, "relay: delivery ") {
			continue
		}
		if m["consumer"] != "test" || m["err"] == nil || m["err"] == "" {
			t.Errorf("log line without its consumer or error: %v", m)
		}
		id, _ := m["change_id"].(float64)
		attempt, _ := m["attempt"].(float64)
		_, next := m["next_attempt_at"]
		got = append(got, line{m["level"].(string), int64(id), int(attempt), next})
	}
	// Three attempts of down: two failed (retried), the third dead; one of
	// refused, dead at once; none of ok.
	want := []line{
		{"WARN", down, 1, true}, {"WARN", down, 2, true}, {"ERROR", down, 3, false},
		{"ERROR", refused, 1, false},
	}
	slices.SortFunc(got, func(a, b line) int {
		if a.change != b.change {
			return int(a.change - b.change)
		}
		return a.attempt - b.attempt
	})
	if !slices.Equal(got, want) {
		t.Errorf("log lines %+v, want %+v", got, want)
	}
}
