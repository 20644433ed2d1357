package leader

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// replica is one process's pool on a shared database.
func replica(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestTryRunOneAtATime: while one replica holds the lock, another's
// TryRun passes without running; once it is released, it runs.
func TestTryRunOneAtATime(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	a, b := NewLock(Dial(url), "job"), NewLock(Dial(url), "job")
	inside := make(chan struct{})
	leave := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := a.TryRun(t.Context(), func(context.Context) error {
			close(inside)
			<-leave
			return nil
		})
		done <- err
	}()
	<-inside
	ran, err := b.TryRun(t.Context(), func(context.Context) error { return nil })
	if err != nil || ran {
		t.Fatalf("second replica ran = %t, %v; want false: the lock is held", ran, err)
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ran, err := b.TryRun(t.Context(), func(context.Context) error { return nil }); err != nil || !ran {
		t.Fatalf("after release: ran = %t, %v; want true", ran, err)
	}
}

// TestLeaderKilledHandsOver: the leader's session is terminated mid-run
// (as when its process dies, or its connection drops): the lock is free at
// once for another replica, and the old leader's run is cancelled with
// ErrLost.
func TestLeaderKilledHandsOver(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	admin := replica(t, url)
	a, b := NewLock(Dial(url), "job"), NewLock(Dial(url), "job")
	a.check = 50 * time.Millisecond
	inside := make(chan struct{})
	cause := make(chan error, 1)
	go func() {
		_, _ = a.TryRun(t.Context(), func(ctx context.Context) error {
			close(inside)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil
		})
	}()
	<-inside
	const kill = `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = hashtext('job')::oid AND granted`
	var killed bool
	if err := admin.QueryRow(t.Context(), kill).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the leader's session: %t, %v", killed, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ran, err := b.TryRun(t.Context(), func(context.Context) error { return nil })
		if ran && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second replica never took over: %t, %v", ran, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, ErrLost) {
			t.Errorf("old leader's run ended with %v, want ErrLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old leader's run was not cancelled")
	}
}

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
		s := Scheduler{Pool: replica(t, url), Connect: Dial(url), Poll: 20 * time.Millisecond, Logger: logger}
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
	s := Scheduler{Pool: pool, Connect: Dial(url), Poll: time.Hour, Logger: logger}
	if err := s.check(t.Context(), NewLock(Dial(url), job.Name), job); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 || heard.IsZero() || result != `{"n":2}` {
		t.Errorf("runs = %d, last success heard %v with %s; want a second run, heard with its result", runs.Load(), heard, result)
	}
	if !sinces[1].Before(time.Now().Add(-time.Hour)) {
		t.Errorf("second run's since = %v, want the first run's start", sinces[1])
	}
}
