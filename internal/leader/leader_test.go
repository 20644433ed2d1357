package leader

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestSchedulerRunsOnceAndRemembers: two replicas' schedulers run a due
// job once between them, hand the next run the first one's start as its
// position, and a restarted replica reads the last success back.
func TestSchedulerRunsOnceAndRemembers(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	var runs atomic.Int32
	var mu sync.Mutex
	var sinces []time.Time
	job := Job{Name: "sweep_test", Interval: time.Hour, Run: func(ctx context.Context, since time.Time) (any, error) {
		runs.Add(1)
		mu.Lock()
		sinces = append(sinces, since)
		mu.Unlock()
		time.Sleep(100 * time.Millisecond) // long enough for both to try
		return map[string]int{"n": int(runs.Load())}, nil
	}}
	logger := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 2 {
		s := Scheduler{Pool: replica(t, url), Poll: 20 * time.Millisecond, Logger: logger}
		wg.Go(func() { s.Run(ctx, job) })
	}
	time.Sleep(500 * time.Millisecond)
	cancel()
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs = %d, want 1 (interval an hour, two replicas)", n)
	}
	if !sinces[0].IsZero() {
		t.Errorf("first run's since = %v, want zero", sinces[0])
	}

	// A restarted replica, the job due again.
	pool := replica(t, url)
	if _, err := pool.Exec(t.Context(), `UPDATE scheduled_jobs SET started_at = started_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	var heard time.Time
	var result string
	job.Succeeded = func(at time.Time, r []byte) { heard, result = at, string(r) }
	s := Scheduler{Pool: pool, Poll: time.Hour, Logger: logger}
	if err := s.check(t.Context(), NewLease(pool, job.Name, s.Lease), job); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 || heard.IsZero() || result != `{"n":2}` {
		t.Errorf("runs = %d, last success heard %v with %s; want a second run, heard with its result", runs.Load(), heard, result)
	}
	if !sinces[1].Before(time.Now().Add(-time.Hour)) {
		t.Errorf("second run's since = %v, want the first run's start", sinces[1])
	}
}

// TestSchedulerLateRunRecordsNothing: a run that goes on after its lease
// was taken over (its leader froze past the TTL and woke, and its pass
// ignores the cancelled context to finish) records nothing: the
// successor's record stands, and the late run is reported as ErrLost.
func TestSchedulerLateRunRecordsNothing(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	admin := replica(t, url)
	successor := NewLease(admin, "sweep_test", LeaseConfig{TTL: time.Minute, Holder: "b"})
	job := Job{Name: "sweep_test", Interval: time.Hour, Run: func(ctx context.Context, _ time.Time) (any, error) {
		// Meanwhile: the lease expires, the successor takes it and records.
		expire(t, admin, "sweep_test")
		f, ok, err := successor.acquire(t.Context())
		if err != nil || !ok {
			t.Fatalf("successor acquires: %t, %v", ok, err)
		}
		if err := record(t.Context(), admin, f, "sweep_test", time.Now(), time.Now(), []byte(`"successor"`)); err != nil {
			t.Fatal(err)
		}
		return "late", nil
	}}
	s := Scheduler{Pool: replica(t, url), Poll: time.Hour, Lease: LeaseConfig{TTL: time.Minute, Holder: "a"}}
	err := s.check(t.Context(), NewLease(s.Pool, job.Name, s.Lease), job)
	if !errors.Is(err, ErrLost) {
		t.Errorf("late run: %v, want ErrLost", err)
	}
	var result string
	if err := admin.QueryRow(t.Context(), `SELECT result::text FROM scheduled_jobs WHERE name = 'sweep_test'`).Scan(&result); err != nil || result != `"successor"` {
		t.Errorf("scheduled_jobs result = %s, %v; want the successor's", result, err)
	}
}
