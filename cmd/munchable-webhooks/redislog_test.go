package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRedisLoggerHoldsBackRepeats: while Redis is unreachable go-redis logs
// each failed dial, so a line of one kind is written once per interval,
// with the count held back since; other kinds pass on their own.
func TestRedisLoggerHoldsBackRepeats(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	r := newRedisLogger(newLogger(&buf, slog.LevelWarn), time.Minute)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	const dial = "redis: connection pool: failed to dial after %d attempts: %v"

	for i := range 50 {
		r.Printf(ctx, dial, 1, "connection refused")
		now = now.Add(time.Second) // 50 s in all: within the minute
		if i == 10 {
			r.Printf(ctx, "redis: failed to close connection: %v", "EOF")
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
		{"WARN", "redis: connection pool: failed to dial after 1 attempts: connection refused", "go-redis", 49},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}
