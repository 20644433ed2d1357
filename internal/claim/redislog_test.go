package claim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRedisLoggerHoldsBackRepeats: while Redis is unreachable go-redis logs
// each failed dial, so the same line is written once per interval, with the
// count held back since; other lines, a failover's included, pass at once.
func TestRedisLoggerHoldsBackRepeats(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	r := NewRedisLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})), time.Minute)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	const dial = "redis: connection pool: failed to dial after %d attempts: %v"

	for i := range 50 {
		r.Printf(ctx, dial, 1, "connection refused")
		now = now.Add(time.Second) // 50 s in all: within the minute
		switch i {
		case 10:
			r.Printf(ctx, "redis: failed to close connection: %v", "EOF")
		case 20, 30:
			r.Printf(ctx, "sentinel: new master=%q addr=%q", "mymaster", fmt.Sprintf("127.0.0.1:%d", 7000+i))
		}
	}
	now = now.Add(10 * time.Second)
	r.Printf(ctx, dial, 1, "connection refused")

	type line struct {
		Level     string `json:"level"`
		Msg       string `json:"msg"`
		Component string `json:"component"`
		HeldBack  int    `json:"held_back"`
	}
	var got []line
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var l line
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("not a JSON line: %v", err)
		}
		got = append(got, l)
	}
	want := []line{
		{"WARN", "redis: connection pool: failed to dial after 1 attempts: connection refused", "go-redis", 0},
		{"WARN", "redis: failed to close connection: EOF", "go-redis", 0},
		{"WARN", `sentinel: new master="mymaster" addr="127.0.0.1:7020"`, "go-redis", 0},
		{"WARN", `sentinel: new master="mymaster" addr="127.0.0.1:7030"`, "go-redis", 0},
		{"WARN", "redis: connection pool: failed to dial after 1 attempts: connection refused", "go-redis", 49},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}

// TestRedisLoggerForgets: lines that differ each time (a connection's
// number in them) do not grow the logger's memory past its bound once
// they are older than the interval.
func TestRedisLoggerForgets(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	r := NewRedisLogger(slog.New(slog.DiscardHandler), time.Minute)
	r.now = func() time.Time { return now }
	for i := range 3 * redisLinesKept {
		r.Printf(context.Background(), "conn[%d] has nil state machine, removing it", i)
		now = now.Add(time.Second)
	}
	if n := len(r.last); n > redisLinesKept {
		t.Errorf("%d lines remembered, want at most %d", n, redisLinesKept)
	}
}
