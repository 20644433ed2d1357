package logsample_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/munchable/munchable-webhooks/internal/logsample"
)

// clock is a fake clock the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// line is what the test reads back of a log line.
type line struct {
	Msg        string `json:"msg"`
	Level      string `json:"level"`
	N          int    `json:"n"`
	Sampled    string `json:"sampled"`
	Suppressed int    `json:"suppressed"`
}

func lines(t *testing.T, buf *bytes.Buffer) []line {
	t.Helper()
	var got []line
	for s := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		if s == "" {
			continue
		}
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		got = append(got, l)
	}
	buf.Reset()
	return got
}

func newSampler(buf *bytes.Buffer, c *clock) *logsample.Sampler {
	logger := slog.New(slog.NewJSONHandler(buf, nil))
	return logsample.New(logger, logsample.Config{First: 3, Window: time.Minute, Now: c.now})
}

func TestSamplerFirstThenSummary(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := newSampler(&buf, c)
	ctx := context.Background()
	for i := range 1000 {
		s.Log(ctx, slog.LevelWarn, "a", "refused a", slog.Int("n", i))
		if i%2 == 0 {
			s.Log(ctx, slog.LevelWarn, "b", "refused b", slog.Int("n", i))
		}
		c.advance(50 * time.Millisecond) // 1000 lines of a over 50 s: one window
	}
	want := []line{
		{Msg: "refused a", Level: "WARN", N: 0},
		{Msg: "refused b", Level: "WARN", N: 0},
		{Msg: "refused a", Level: "WARN", N: 1},
		{Msg: "refused a", Level: "WARN", N: 2},
		{Msg: "refused b", Level: "WARN", N: 2},
		{Msg: "refused b", Level: "WARN", N: 4},
	}
	if diff := cmp.Diff(want, lines(t, &buf)); diff != "" {
		t.Fatalf("lines within the first window (-want +got):\n%s", diff)
	}

	s.Flush(ctx) // 50 s in: the window has not ended
	if got := lines(t, &buf); len(got) != 0 {
		t.Fatalf("flush before the window ended wrote %v", got)
	}
	c.advance(10 * time.Second)
	s.Flush(ctx)
	got := lines(t, &buf)
	want = []line{
		{Msg: "refused a", Level: "WARN", Sampled: "a", Suppressed: 997},
		{Msg: "refused b", Level: "WARN", Sampled: "b", Suppressed: 497},
	}
	bySampled := cmpopts.SortSlices(func(a, b line) bool { return a.Sampled < b.Sampled })
	if diff := cmp.Diff(want, got, bySampled); diff != "" {
		t.Fatalf("summaries (-want +got):\n%s", diff)
	}

	// A new window logs its first lines again; a window that ends with
	// the next line of its kind is summarised then, before that line.
	for i := range 5 {
		s.Log(ctx, slog.LevelWarn, "a", "refused a", slog.Int("n", i))
	}
	c.advance(time.Minute)
	s.Log(ctx, slog.LevelWarn, "a", "refused a", slog.Int("n", 99))
	want = []line{
		{Msg: "refused a", Level: "WARN", N: 0},
		{Msg: "refused a", Level: "WARN", N: 1},
		{Msg: "refused a", Level: "WARN", N: 2},
		{Msg: "refused a", Level: "WARN", Sampled: "a", Suppressed: 2},
		{Msg: "refused a", Level: "WARN", N: 99},
	}
	if diff := cmp.Diff(want, lines(t, &buf)); diff != "" {
		t.Fatalf("second and third windows (-want +got):\n%s", diff)
	}
}

// A window that logged everything has nothing to summarise; Run writes
// what is left when it stops.
func TestSamplerRunFlushesAtTheEnd(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := newSampler(&buf, c)
	ctx, cancel := context.WithCancel(context.Background())
	for range 2 {
		s.Log(ctx, slog.LevelWarn, "quiet", "refused quiet")
	}
	for range 7 {
		s.Log(ctx, slog.LevelInfo, "loud", "refused loud")
	}
	lines(t, &buf)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	cancel()
	<-done
	want := []line{{Msg: "refused loud", Level: "INFO", Sampled: "loud", Suppressed: 4}}
	if diff := cmp.Diff(want, lines(t, &buf)); diff != "" {
		t.Fatalf("lines at the end (-want +got):\n%s", diff)
	}
}

// A level the logger does not log costs nothing and is not counted.
func TestSamplerDisabledLevel(t *testing.T) {
	var buf bytes.Buffer
	c := &clock{t: time.Now()}
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	s := logsample.New(logger, logsample.Config{First: 1, Now: c.now})
	for range 10 {
		s.Log(context.Background(), slog.LevelWarn, "a", "refused a")
	}
	c.advance(time.Hour)
	s.Flush(context.Background())
	if buf.Len() != 0 {
		t.Fatalf("wrote %q at a level the logger does not log", buf.String())
	}
}
