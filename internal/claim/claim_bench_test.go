package claim

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// The claim's round trips against a real Redis (TEST_REDIS_URL, or a
// throwaway server started by TestMain, like the tests), and the flow around them (body reading is
// benchmarked in internal/intake).

func benchStore(b *testing.B) *Store {
	b.Helper()
	rdb, prefix := dbtest.Redis(b)
	return NewStore(rdb, StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: 2 * time.Minute})
}

// benchFingerprint is what a 3 KiB body's fingerprint looks like.
var benchFingerprint = fingerprint(bytes.Repeat([]byte("x"), 3<<10))

// BenchmarkClaimNew: one round trip that takes a new claim.
func BenchmarkClaimNew(b *testing.B) {
	s := benchStore(b)
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		r, err := tryClaim(s, ctx, "stripe", "evt_new_"+strconv.Itoa(i), benchFingerprint)
		if err != nil || !r.claimed() {
			b.Fatalf("claim = %+v, %v", r, err)
		}
	}
}

// BenchmarkClaimDone: one round trip that finds the event done, as a
// duplicate delivery does.
func BenchmarkClaimDone(b *testing.B) {
	s := benchStore(b)
	ctx := b.Context()
	if err := s.confirm(ctx, "stripe", "evt_done", benchFingerprint, time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		r, err := tryClaim(s, ctx, "stripe", "evt_done", benchFingerprint)
		if err != nil || r.Found.State != Done {
			b.Fatalf("claim = %+v, %v", r, err)
		}
	}
}

// BenchmarkConfirm: the round trip that marks an event done.
func BenchmarkConfirm(b *testing.B) {
	s := benchStore(b)
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := s.confirm(ctx, "stripe", "evt_confirm_"+strconv.Itoa(i), benchFingerprint, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func benchFlow(b *testing.B) *Flow {
	return NewFlow(benchStore(b), FlowConfig{
		HandlerTimeout: 30 * time.Second,
		Logger:         slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Registerer:     prometheus.NewRegistry(),
	})
}

func noop(context.Context) (Effect, error) { return Applied, nil }

// BenchmarkRunFirst: the whole flow for a new event with an effect that
// costs nothing: claim, apply, confirm (two round trips).
func BenchmarkRunFirst(b *testing.B) {
	f := benchFlow(b)
	body := bytes.Repeat([]byte("x"), 3<<10)
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		o := f.run(ctx, stripe, body, Event{ID: "evt_run_" + strconv.Itoa(i), Type: "t", Apply: noop})
		if o.outcome != Processed {
			b.Fatalf("run = %+v", o)
		}
	}
}

// BenchmarkRunDuplicate: the whole flow for a done event (one round trip).
func BenchmarkRunDuplicate(b *testing.B) {
	f := benchFlow(b)
	body := bytes.Repeat([]byte("x"), 3<<10)
	ctx := b.Context()
	ev := Event{ID: "evt_dup", Type: "t", Apply: noop}
	if o := f.run(ctx, stripe, body, ev); o.outcome != Processed {
		b.Fatalf("first run = %+v", o)
	}
	b.ReportAllocs()
	for b.Loop() {
		if o := f.run(ctx, stripe, body, ev); o.outcome != Duplicate {
			b.Fatalf("run = %+v", o)
		}
	}
}

// BenchmarkFingerprint: the body fingerprint stored with each claim.
func BenchmarkFingerprint(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 3115)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		fingerprint(body)
	}
}
