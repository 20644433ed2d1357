// Package leader runs a job on one replica at a time, under a lease: a
// row of leader_leases that a replica takes over the service's pool (any
// pooler will do: no session is kept) and renews while it runs. The lease
// is judged by Postgres's clock, so a leader that stops renewing, dead,
// frozen or cut off, loses it within its TTL and the next replica to try
// takes over. A leader that wakes up late finds its run's context
// cancelled, and whatever it still tries to write is refused: every write
// of a run checks the lease's fencing token in its own transaction
// (Fence.Check), which also holds the lease until that transaction ends.
//
// A scheduled job (Scheduler) also records, in the table scheduled_jobs,
// when its last successful run began and ended, so that any replica, after
// any restart, knows when it is due and what its position is; that record
// is a fenced write.
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

// Job is work run on a schedule by one replica at a time.
type Job struct {
	// Name names the lease and the job's row in scheduled_jobs.
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
	// Pool reads and records the jobs' runs and holds their leases.
	Pool  *pgxpool.Pool
	Lease LeaseConfig
	// Poll is how often a replica checks whether a job is due; at most
	// the job's interval is used. A job whose leader stopped is taken
	// over within the lease's TTL and one Poll.
	Poll   time.Duration
	Logger *slog.Logger
}

// Run checks j now and every Poll until ctx ends, running it when due
// under its lease. It returns when ctx ends and a run in progress, whose
// context ends too, has returned.
func (s Scheduler) Run(ctx context.Context, j Job) {
	poll := min(s.Poll, j.Interval)
	if poll <= 0 {
		poll = j.Interval
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	lease := NewLease(s.Pool, j.Name, s.Lease)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		switch err := s.check(ctx, lease, j); {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, ErrLost):
			// Stopped (frozen, cut off) past the lease's TTL: another
			// replica may be running it now, so this run records nothing.
			s.Logger.Warn("scheduled job lost its lease during a run: nothing recorded", "job", j.Name, "err", err)
		default:
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
func (s Scheduler) check(ctx context.Context, lease *Lease, j Job) error {
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
	_, err = lease.TryRun(ctx, func(ctx context.Context, f Fence) error {
		// Again under the lease: another replica may have run it meanwhile.
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
		if err := record(ctx, s.Pool, f, j.Name, start, end, result); err != nil {
			return err
		}
		if j.Succeeded != nil {
			j.Succeeded(end, result)
		}
		return nil
	})
	return err
}

// record keeps a successful run in scheduled_jobs, fenced: a run whose
// lease was lost (its leader froze past the TTL, and another may have run
// and recorded since) records nothing, and returns ErrLost.
func record(ctx context.Context, pool *pgxpool.Pool, f Fence, name string, start, end time.Time, result []byte) error {
	const q = `INSERT INTO scheduled_jobs (name, started_at, succeeded_at, result, token) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE SET started_at = EXCLUDED.started_at, succeeded_at = EXCLUDED.succeeded_at,
    result = EXCLUDED.result, token = EXCLUDED.token`
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := f.Check(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, q, name, start, end, string(result), f.Token())
		return err
	})
	if err != nil {
		return fmt.Errorf("record %s: %w", name, err)
	}
	return nil
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
