// Package leader runs a job on one replica at a time. A replica that wants
// to run it takes a Postgres session advisory lock with
// pg_try_advisory_lock on a dedicated connection, opened for the attempt
// and held for the whole run: the others find it taken and pass. The
// connection must be a session of its own (direct, or session-pooled: a
// transaction pooler would hand the lock's session to someone else), so
// it is not the service's pool. The lock belongs to the
// session, so a leader that dies (its process, or its connection) frees it
// with its session, and the next replica to try takes over. While it runs,
// the leader checks its connection; when that is gone, so is the lock, and
// the run's context is cancelled, so that two runs never overlap for long.
//
// A scheduled job (Schedule) also records, in the table scheduled_jobs,
// when its last successful run began and ended, so that any replica, after
// any restart, knows when it is due and what its position is.
package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrLost is the cause of a run's context when its lock's session ended
// during the run.
var ErrLost = errors.New("leader: lock lost with its database session")

// Lock is a named session advisory lock. Its key is hashtext(name) in
// pg_try_advisory_lock's one-bigint key space, apart from the two-int keys
// that pg_advisory_xact_lock(int, int) takes elsewhere in the service.
type Lock struct {
	connect Connect
	name    string
	// check is how often a held lock's connection is checked.
	check time.Duration
}

// Connect opens a dedicated connection (a session of its own).
type Connect func(ctx context.Context) (*pgx.Conn, error)

// Dial is a Connect to the database at url.
func Dial(url string) Connect {
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, url) }
}

// NewLock returns the lock called name, taken on connections from connect.
func NewLock(connect Connect, name string) *Lock {
	return &Lock{connect: connect, name: name, check: 5 * time.Second}
}

// TryRun runs fn holding the lock, and reports whether it ran: false, with
// no error, when another session holds the lock. fn's context ends when
// ctx does or when the lock's connection is gone (cause ErrLost). The lock
// is released when fn returns, with its session: the connection is closed.
func (l *Lock) TryRun(ctx context.Context, fn func(context.Context) error) (bool, error) {
	conn, err := l.connect(ctx)
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", l.name, err)
	}
	defer closeConn(conn)
	var held bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1))`, l.name).Scan(&held); err != nil {
		return false, fmt.Errorf("lock %s: %w", l.name, err)
	}
	if !held {
		return false, nil
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() { // ends when fn has returned (cancel below) or the lock is lost
		defer close(watched)
		l.watch(runCtx, conn, cancel)
	}()
	err = fn(runCtx)
	cancel(nil)
	<-watched
	return true, err
}

// watch pings the lock's connection until ctx ends; a failed ping means
// the session, and so the lock, is gone.
func (l *Lock) watch(ctx context.Context, conn *pgx.Conn, cancel context.CancelCauseFunc) {
	t := time.NewTicker(l.check)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pingCtx, done := context.WithTimeout(ctx, l.check)
		err := conn.Ping(pingCtx)
		done()
		if err != nil && ctx.Err() == nil {
			cancel(fmt.Errorf("%w: %s: %w", ErrLost, l.name, err))
			return
		}
	}
}

// closeConn ends the session, and with it any lock it holds.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// Job is work run on a schedule by one replica at a time.
type Job struct {
	// Name names the lock and the job's row in scheduled_jobs.
	Name string
	// Interval is the time from one successful run's start to the next.
	Interval time.Duration
	// Run does the work. since is when the last successful run began
	// (zero: never), the job's position. What it returns is kept as JSON
	// with the run (nil: null).
	Run func(ctx context.Context, since time.Time) (any, error)
	// Succeeded, when not nil, hears the end of the last successful run and
	// what it returned, as scheduled_jobs has them, at every check on every
	// replica: so every replica exports the same values, a restarted one
	// included.
	Succeeded func(at time.Time, result []byte)
}

// Scheduler checks its jobs every Poll.
type Scheduler struct {
	// Pool reads and records the jobs' runs; Connect opens the dedicated
	// connections of their locks, and only once a job is due.
	Pool    *pgxpool.Pool
	Connect Connect
	// Poll is how often a replica checks whether a job is due; at most
	// the job's interval is used.
	Poll   time.Duration
	Logger *slog.Logger
}

// Run checks j now and every Poll until ctx ends, running it when due
// under its lock. It returns when ctx ends and a run in progress, whose
// context ends too, has returned.
func (s Scheduler) Run(ctx context.Context, j Job) {
	poll := min(s.Poll, j.Interval)
	if poll <= 0 {
		poll = j.Interval
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	lock := NewLock(s.Connect, j.Name)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		if err := s.check(ctx, lock, j); err != nil && ctx.Err() == nil {
			s.Logger.Error("scheduled job failed", "job", j.Name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check reports the last success, then runs the job if it is due and no
// other replica runs it.
func (s Scheduler) check(ctx context.Context, lock *Lock, j Job) error {
	last, err := s.last(ctx, j.Name)
	if err != nil {
		return err
	}
	if j.Succeeded != nil && !last.succeeded.IsZero() {
		j.Succeeded(last.succeeded, last.result)
	}
	if !last.started.IsZero() && time.Since(last.started) < j.Interval {
		return nil
	}
	_, err = lock.TryRun(ctx, func(ctx context.Context) error {
		// Again under the lock: another replica may have run it meanwhile.
		last, err := s.last(ctx, j.Name)
		if err != nil || (!last.started.IsZero() && time.Since(last.started) < j.Interval) {
			return err
		}
		start := time.Now()
		out, err := j.Run(ctx, last.started)
		if err != nil {
			return err
		}
		result, err := json.Marshal(out)
		if err != nil {
			return fmt.Errorf("record %s: %w", j.Name, err)
		}
		end := time.Now()
		const q = `INSERT INTO scheduled_jobs (name, started_at, succeeded_at, result) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET started_at = EXCLUDED.started_at, succeeded_at = EXCLUDED.succeeded_at, result = EXCLUDED.result`
		if _, err := s.Pool.Exec(ctx, q, j.Name, start, end, string(result)); err != nil {
			return fmt.Errorf("record %s: %w", j.Name, err)
		}
		if j.Succeeded != nil {
			j.Succeeded(end, result)
		}
		return nil
	})
	return err
}

type lastRun struct {
	started, succeeded time.Time
	result             []byte
}

func (s Scheduler) last(ctx context.Context, name string) (lastRun, error) {
	var r lastRun
	var result string
	err := s.Pool.QueryRow(ctx, `SELECT started_at, succeeded_at, result::text FROM scheduled_jobs WHERE name = $1`, name).Scan(&r.started, &r.succeeded, &result)
	r.result = []byte(result)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return lastRun{}, fmt.Errorf("last run of %s: %w", name, err)
	}
	return r, nil
}
