// Package migrations holds the service's SQL schema as ordered, embedded
// migrations and applies the pending ones.
//
// A migration never makes deliveries wait longer than its lock timeout: it
// runs with lock_timeout set, so a statement queued behind a lock another
// session holds (a report's open transaction, a pg_dump) gives up instead
// of holding every delivery's write queued behind it, and the migration is
// tried again after a pause. docs/OPERATIONS.md ("Migrations") has the
// rules the files follow.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// Options bound what a migration may cost the sessions around it.
type Options struct {
	// LockTimeout is the session's lock_timeout while migrations run: the
	// longest any statement waits for a lock, and so the longest a write
	// queued behind that statement waits for it.
	LockTimeout time.Duration
	// Attempts is how many tries that end waiting for a lock held
	// elsewhere one call may make, all its migrations together: the
	// call's budget, so that its worst case is the same whatever the
	// number of pending migrations. Backoff is the pause after the first
	// such try, doubled after each further one up to MaxBackoff.
	Attempts   int
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// DefaultOptions waits 2 s for a lock, 10 times in all, with pauses of 1,
// 2, 4, 8 then 15 s between: at most 110 s of waiting for the whole call,
// long enough to outlast a report or a dump's snapshot of a busy table,
// short enough for a Job's deadline and a pod's start.
func DefaultOptions() Options {
	return Options{LockTimeout: 2 * time.Second, Attempts: 10, Backoff: time.Second, MaxBackoff: 15 * time.Second}
}

// Postgres's SQLSTATEs for the lock waits a migration is tried again
// after: "canceling statement due to lock timeout", and a deadlock with
// another session, which Postgres ends by cancelling one side (the
// migration's transaction is rolled back, as after a lock timeout).
const (
	lockNotAvailable = "55P03"
	deadlockDetected = "40P01"
)

// waitedForLock says whether err is a lock wait that ended without the
// lock: the migration changed nothing and may be tried again.
func waitedForLock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == lockNotAvailable || pgErr.Code == deadlockDetected)
}

// Apply runs every pending migration with DefaultOptions and returns the
// names of those it applied.
func Apply(ctx context.Context, db *sql.DB, logger *slog.Logger) ([]string, error) {
	return ApplyWith(ctx, db, logger, DefaultOptions())
}

// ApplyWith runs every pending migration, one at a time, each in its own
// transaction unless its file says -- +goose NO TRANSACTION, and returns
// the names of those it applied. A Postgres session advisory lock
// serialises replicas that start together, so each migration runs once.
// db needs room for two connections: goose's session and the one that
// looks for the session blocking it.
func ApplyWith(ctx context.Context, db *sql.DB, logger *slog.Logger, opts Options) ([]string, error) {
	inner, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	session := &timeoutSession{inner: inner, lockTimeout: opts.LockTimeout}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(session),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	)
	if err != nil {
		return nil, fmt.Errorf("migration provider: %w", err)
	}
	var applied []string
	b := &budget{opts: opts, backoff: opts.Backoff}
	for {
		name, err := applyNext(ctx, provider, db, session, logger, b)
		if errors.Is(err, goose.ErrNoNextVersion) {
			return applied, nil
		}
		if err != nil {
			return applied, err
		}
		applied = append(applied, name)
	}
}

// budget is what is left of one call's tries (Options.Attempts), shared
// by its migrations, and the pause before the next.
type budget struct {
	opts    Options
	waits   int // tries that ended waiting for a lock, so far
	backoff time.Duration
}

// applyNext applies the next pending migration, trying it again while it
// times out on a lock or loses a deadlock and b allows, and returns its
// file's name.
func applyNext(ctx context.Context, provider *goose.Provider, db *sql.DB, session *timeoutSession, logger *slog.Logger, b *budget) (string, error) {
	opts := b.opts
	for {
		watch := watchBlockers(ctx, db, session)
		res, err := provider.UpByOne(ctx)
		blocker := watch()
		if errors.Is(err, goose.ErrNoNextVersion) {
			return "", err
		}
		if err == nil {
			return res.Source.Path, nil
		}
		if !waitedForLock(err) {
			return "", fmt.Errorf("apply migrations: %w", err)
		}
		var partial *goose.PartialError
		name := "the next migration"
		if errors.As(err, &partial) && partial.Failed != nil {
			name = partial.Failed.Source.Path
		}
		b.waits++
		if b.waits >= opts.Attempts {
			return "", fmt.Errorf("apply migrations: %s: migrations waited %d times for a lock, the most one run may (lock_timeout %s each): %s: %w",
				name, b.waits, opts.LockTimeout, blocker, err)
		}
		logger.Warn("migration waited for a lock held elsewhere; trying again",
			"migration", name, "attempt", b.waits, "attempts", opts.Attempts, "lock_timeout", opts.LockTimeout.String(),
			"blocked_by", blocker.String(), "next_in", b.backoff.String())
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("apply migrations: %s: %w", name, ctx.Err())
		case <-time.After(b.backoff):
		}
		b.backoff = min(2*b.backoff, opts.MaxBackoff)
	}
}

// timeoutSession is goose's session lock plus the session's settings: goose
// runs every migration of a call on the connection it locks, so the
// lock_timeout set here covers each of their statements, and pid lets the
// watcher ask who blocks that session.
type timeoutSession struct {
	inner       lock.SessionLocker
	lockTimeout time.Duration
	pid         atomic.Int64
}

func (s *timeoutSession) SessionLock(ctx context.Context, conn *sql.Conn) error {
	// A whole number of milliseconds: SET takes no placeholder.
	set := fmt.Sprintf("SET lock_timeout = %d", s.lockTimeout.Milliseconds())
	if _, err := conn.ExecContext(ctx, set); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	var pid int64
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return fmt.Errorf("backend pid: %w", err)
	}
	s.pid.Store(pid)
	return s.inner.SessionLock(ctx, conn)
}

func (s *timeoutSession) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	s.pid.Store(0)
	err := s.inner.SessionUnlock(ctx, conn)
	// The connection goes back to db's pool: leave it as it came.
	if _, rerr := conn.ExecContext(ctx, "RESET lock_timeout"); rerr != nil && err == nil {
		err = fmt.Errorf("reset lock_timeout: %w", rerr)
	}
	return err
}
