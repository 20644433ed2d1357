package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// leaseRow is the lease's row as Postgres has it.
type leaseRow struct {
	Holder string
	Token  int64
	Live   bool // expires_at in the future, by Postgres's clock
}

func readLease(t *testing.T, pool *pgxpool.Pool, name string) leaseRow {
	t.Helper()
	var r leaseRow
	err := pool.QueryRow(t.Context(), `SELECT holder, token, expires_at > clock_timestamp() FROM leader_leases WHERE name = $1`, name).
		Scan(&r.Holder, &r.Token, &r.Live)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return r
}

// expire moves the lease's expiry into the past, as a holder that stopped
// renewing a TTL ago would leave it, without the test waiting out a TTL.
func expire(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `UPDATE leader_leases SET expires_at = now() - interval '1 second' WHERE name = $1`, name); err != nil {
		t.Fatal(err)
	}
}

// TestTryRunOneAtATime: while one replica holds the lease, another's
// TryRun passes without running; once it is released, the other runs,
// with the next fencing token.
func TestTryRunOneAtATime(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	a := NewLease(replica(t, url), "job", LeaseConfig{Holder: "a"})
	b := NewLease(replica(t, url), "job", LeaseConfig{Holder: "b"})
	inside := make(chan Fence)
	leave := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := a.TryRun(t.Context(), func(_ context.Context, f Fence) error {
			inside <- f
			<-leave
			return nil
		})
		done <- err
	}()
	fa := <-inside
	if got := readLease(t, a.pool, "job"); got != (leaseRow{Holder: "a", Token: fa.Token(), Live: true}) {
		t.Errorf("lease while a runs = %+v, want held by a with token %d", got, fa.Token())
	}
	ran, err := b.TryRun(t.Context(), func(context.Context, Fence) error { return nil })
	if err != nil || ran {
		t.Fatalf("second replica ran = %t, %v; want false: the lease is held", ran, err)
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var fb Fence
	if ran, err := b.TryRun(t.Context(), func(_ context.Context, f Fence) error { fb = f; return nil }); err != nil || !ran {
		t.Fatalf("after release: ran = %t, %v; want true", ran, err)
	}
	if got, want := fb.Token(), fa.Token()+1; got != want {
		t.Errorf("token of the next acquisition = %d, want %d", got, want)
	}
}

// TestLeaseRenewed: a run that lasts several TTLs keeps its lease (it is
// renewed), so another replica never gets it meanwhile.
func TestLeaseRenewed(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	const ttl = time.Second
	a := NewLease(replica(t, url), "job", LeaseConfig{TTL: ttl, Holder: "a"})
	b := NewLease(replica(t, url), "job", LeaseConfig{TTL: ttl, Holder: "b"})
	ran, err := a.TryRun(t.Context(), func(ctx context.Context, _ Fence) error {
		end := time.Now().Add(3 * ttl)
		for time.Now().Before(end) {
			if ran, err := b.TryRun(ctx, func(context.Context, Fence) error { return nil }); err != nil || ran {
				t.Errorf("b ran = %t, %v while a's lease is renewed", ran, err)
				return nil
			}
			select {
			case <-ctx.Done():
				t.Errorf("a's run ended while it renews: %v", context.Cause(ctx))
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("a ran = %t, %v", ran, err)
	}
}

// TestLeaseExpires: a holder that stops renewing (here: acquired and never
// renewed, as a frozen process leaves it) loses the lease by Postgres's
// clock within its TTL; the next replica takes it with the next token,
// and the old holder's fence is refused from then on.
func TestLeaseExpires(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	const ttl = 500 * time.Millisecond
	a := NewLease(replica(t, url), "job", LeaseConfig{TTL: ttl, Holder: "a"})
	b := NewLease(replica(t, url), "job", LeaseConfig{TTL: ttl, Holder: "b"})
	fa, ok, err := a.acquire(t.Context())
	if err != nil || !ok {
		t.Fatalf("a acquires: %t, %v", ok, err)
	}
	if err := checkIn(t, a.pool, fa); err != nil {
		t.Fatalf("a's fence while held: %v", err)
	}
	var fb Fence
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, ok, err := b.acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			fb = f
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b never took over the unrenewed lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, want := fb.Token(), fa.Token()+1; got != want {
		t.Errorf("b's token = %d, want %d", got, want)
	}
	if err := checkIn(t, a.pool, fa); !errors.Is(err, ErrLost) {
		t.Errorf("a's fence after b took over: %v, want ErrLost", err)
	}
	if err := checkIn(t, b.pool, fb); err != nil {
		t.Errorf("b's fence: %v", err)
	}
}

// checkIn runs f.Check in a transaction of its own.
func checkIn(t *testing.T, pool *pgxpool.Pool, f Fence) error {
	t.Helper()
	return pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error { return f.Check(t.Context(), tx) })
}

// TestRunCancelledWhenLost: when the lease is found taken over at a
// renewal, the run's context ends with ErrLost.
func TestRunCancelledWhenLost(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	admin := replica(t, url)
	a := NewLease(replica(t, url), "job", LeaseConfig{TTL: time.Second, Holder: "a"})
	b := NewLease(admin, "job", LeaseConfig{TTL: time.Minute, Holder: "b"})
	ran, err := a.TryRun(t.Context(), func(ctx context.Context, _ Fence) error {
		expire(t, admin, "job")
		if _, ok, err := b.acquire(t.Context()); err != nil || !ok {
			t.Fatalf("b takes the expired lease: %t, %v", ok, err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(10 * time.Second):
			return errors.New("not cancelled")
		}
	})
	if !ran || !errors.Is(err, ErrLost) {
		t.Errorf("a's run: ran %t, ended with %v; want ErrLost", ran, err)
	}
	if got := readLease(t, admin, "job"); got.Holder != "b" || !got.Live {
		t.Errorf("lease after a's run = %+v, want b's, live (a's release must not touch it)", got)
	}
}

// TestRecordOverStaleTokenRefused: a scheduled run whose lease was taken
// over records nothing; its successor's record stands.
func TestRecordOverStaleTokenRefused(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	pool := replica(t, url)
	a := NewLease(pool, "job", LeaseConfig{Holder: "a"})
	b := NewLease(pool, "job", LeaseConfig{Holder: "b"})
	fa, _, err := a.acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	expire(t, pool, "job")
	fb, ok, err := b.acquire(t.Context())
	if err != nil || !ok {
		t.Fatalf("b acquires: %t, %v", ok, err)
	}
	start := time.Now()
	if err := record(t.Context(), pool, fb, "job", start, start.Add(time.Second), []byte(`"b"`)); err != nil {
		t.Fatalf("b records: %v", err)
	}
	err = record(t.Context(), pool, fa, "job", start.Add(-time.Minute), start.Add(2*time.Second), []byte(`"a"`))
	if !errors.Is(err, ErrLost) {
		t.Errorf("a records over b: %v, want ErrLost", err)
	}
	var result string
	var token int64
	if err := pool.QueryRow(t.Context(), `SELECT result::text, token FROM scheduled_jobs WHERE name = 'job'`).Scan(&result, &token); err != nil {
		t.Fatal(err)
	}
	if result != `"b"` || token != fb.Token() {
		t.Errorf("scheduled_jobs has %s with token %d, want b's record with token %d", result, token, fb.Token())
	}
}

// TestCheckHoldsOffTakeover: a transaction that checked the fence holds
// the lease's row, so nobody takes the lease over while that transaction
// can still commit, even past the lease's expiry; a holder frozen inside
// it has its session ended by Postgres (idle in transaction for a TTL),
// after which the takeover goes through and the frozen transaction
// commits nothing.
func TestCheckHoldsOffTakeover(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDatabase(t)
	const ttl = time.Second
	a := NewLease(replica(t, url), "job", LeaseConfig{TTL: ttl, Holder: "a"})
	b := NewLease(replica(t, url), "job", LeaseConfig{TTL: ttl, Holder: "b"})
	fa, _, err := a.acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := a.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if err := fa.Check(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	// a freezes here. b tries until it has the lease.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		_, ok, err := b.acquire(ctx)
		cancel()
		if ok {
			break
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("b never took over")
		}
	}
	// a wakes: its transaction cannot commit what it would have written.
	if _, err := tx.Exec(context.Background(), `INSERT INTO scheduled_jobs (name, started_at, succeeded_at, result) VALUES ('job', now(), now(), '"a"')`); err == nil {
		if err := tx.Commit(context.Background()); err == nil {
			t.Fatal("a's fenced transaction committed after b took the lease over")
		}
	}
	var n int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM scheduled_jobs`).Scan(&n); err != nil || n != 0 {
		t.Errorf("scheduled_jobs rows = %d, %v; want 0", n, err)
	}
}
