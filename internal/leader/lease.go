package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrLost is the cause of a run's context when its lease was lost during
// the run (a renewal failed, or found the lease expired or taken), and
// what Fence.Check wraps when the lease is no longer this holder's.
var ErrLost = errors.New("leader: lease lost")

// DefaultTTL is how long a lease lasts unless renewed.
const DefaultTTL = 15 * time.Second

// LeaseConfig is how a replica holds its leases.
type LeaseConfig struct {
	// TTL is how long a lease lasts after each renewal, by Postgres's
	// clock; it is renewed every TTL/3. 0: DefaultTTL.
	TTL time.Duration
	// Holder names this replica in leader_leases.holder; "": host/pid.
	Holder string
}

func (c LeaseConfig) withDefaults() LeaseConfig {
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.Holder == "" {
		host, _ := os.Hostname()
		c.Holder = host + "/" + strconv.Itoa(os.Getpid())
	}
	return c
}

// Renew is how often a held lease is renewed.
func (c LeaseConfig) Renew() time.Duration { return c.withDefaults().TTL / 3 }

// Lease is a named lease in leader_leases, taken and renewed over the
// service's pool. A row's lease is held while its expires_at, set from
// Postgres's now() at each renewal, is in the future: a holder that stops
// renewing (dead, frozen, partitioned) loses it within TTL, whatever its
// own clock says. Each acquisition adds one to the row's token, the
// fencing token its writes check (Fence).
type Lease struct {
	pool *pgxpool.Pool
	name string
	cfg  LeaseConfig
}

// NewLease returns the lease called name.
func NewLease(pool *pgxpool.Pool, name string, cfg LeaseConfig) *Lease {
	return &Lease{pool: pool, name: name, cfg: cfg.withDefaults()}
}

// Fence is one acquisition of a lease, the right to write while it lasts.
type Fence struct {
	name  string
	token int64
	ttl   time.Duration
}

// Token is the acquisition's fencing token.
func (f Fence) Token() int64 { return f.token }

// The lease's statements compare with statement_timestamp(), not now():
// in a transaction now() is when it began, and a holder that froze inside
// a transaction must be judged by when it speaks, not when it started.
const (
	acquireSQL = `
INSERT INTO leader_leases AS l (name, holder, token, expires_at)
VALUES ($1, $2, 1, statement_timestamp() + $3::interval)
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, token = l.token + 1, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= statement_timestamp()
RETURNING token`
	renewSQL = `
UPDATE leader_leases SET expires_at = statement_timestamp() + $3::interval
WHERE name = $1 AND token = $2 AND expires_at > statement_timestamp()`
	releaseSQL = `
UPDATE leader_leases SET expires_at = statement_timestamp()
WHERE name = $1 AND token = $2 AND expires_at > statement_timestamp()`
	// checkSQL locks the row FOR SHARE, so an acquisition (an UPDATE of
	// the row) waits for the checking transaction to end: nobody takes
	// over while a fenced write is in flight. It also bounds how long
	// that transaction may sit idle to the lease's TTL: a holder frozen
	// mid-transaction has its session ended by Postgres, the row lock
	// with it, so the lock cannot hold a takeover up for longer.
	checkSQL = `
SELECT set_config('idle_in_transaction_session_timeout', $3, true)
FROM leader_leases
WHERE name = $1 AND token = $2 AND expires_at > statement_timestamp()
FOR SHARE`
)

// Check verifies, inside tx, that f is still the lease's current,
// unexpired acquisition, and holds the lease's row until tx ends, so that
// no other replica can take the lease over before tx commits or rolls
// back. It returns an error wrapping ErrLost when the lease has expired
// or been taken since. A pass that writes calls Check in the transaction
// of the write, first.
func (f Fence) Check(ctx context.Context, tx pgx.Tx) error {
	var set string
	err := tx.QueryRow(ctx, checkSQL, f.name, f.token, strconv.FormatInt(f.ttl.Milliseconds(), 10)).Scan(&set)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("lease %s token %d: %w", f.name, f.token, ErrLost)
	}
	if err != nil {
		return fmt.Errorf("lease %s check: %w", f.name, err)
	}
	return nil
}

// acquire takes the lease if it is free (never taken, released or
// expired): ok false, with no error, when another holds it.
func (l *Lease) acquire(ctx context.Context) (Fence, bool, error) {
	var token int64
	err := l.pool.QueryRow(ctx, acquireSQL, l.name, l.cfg.Holder, l.cfg.TTL).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return Fence{}, false, nil
	}
	if err != nil {
		return Fence{}, false, fmt.Errorf("lease %s: %w", l.name, err)
	}
	return Fence{name: l.name, token: token, ttl: l.cfg.TTL}, true, nil
}

// TryRun runs fn holding the lease, and reports whether it ran: false,
// with no error, when another replica holds it. While fn runs the lease
// is renewed every TTL/3; fn's context ends when ctx does, or with cause
// ErrLost when a renewal fails or finds the lease gone, or when a full
// TTL has passed on this process's clock since the last renewal was sent
// without one succeeding (by then Postgres's expiry has passed too). fn
// writes under f.Check. The lease is released when fn returns.
func (l *Lease) TryRun(ctx context.Context, fn func(ctx context.Context, f Fence) error) (bool, error) {
	f, ok, err := l.acquire(ctx)
	if err != nil || !ok {
		return false, err
	}
	sent := time.Now() // before the acquisition's expiry was set
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Go(func() { l.keep(runCtx, f, sent, cancel) })
	err = fn(runCtx, f)
	// A run that ended because the lease was lost says so, whatever fn
	// made of its cancelled context.
	if cause := context.Cause(runCtx); err != nil && errors.Is(cause, ErrLost) && !errors.Is(err, ErrLost) {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	cancel(nil)
	wg.Wait()
	l.release(f)
	return true, err
}

// keep renews f every TTL/3 until ctx ends, and cancels ctx with ErrLost
// once the lease is gone or can no longer be known to be held. sent is
// when the statement that set the lease's current expiry was sent: the
// expiry is at least TTL after it.
func (l *Lease) keep(ctx context.Context, f Fence, sent time.Time, cancel context.CancelCauseFunc) {
	renew := time.NewTicker(l.cfg.TTL / 3)
	defer renew.Stop()
	// The deadline is read on this process's monotonic clock, which keeps
	// running while the process is stopped: a leader that wakes after
	// its TTL is cancelled at once, before any renewal answers.
	expiry := time.NewTimer(time.Until(sent.Add(l.cfg.TTL)))
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			cancel(fmt.Errorf("%w: %s: not renewed within %s", ErrLost, l.name, l.cfg.TTL))
			return
		case <-renew.C:
		}
		if time.Since(sent) >= l.cfg.TTL { // woke after a stop: the timer may not have fired yet
			cancel(fmt.Errorf("%w: %s: not renewed within %s", ErrLost, l.name, l.cfg.TTL))
			return
		}
		at := time.Now()
		rctx, done := context.WithDeadline(ctx, sent.Add(l.cfg.TTL))
		tag, err := l.pool.Exec(rctx, renewSQL, f.name, f.token, l.cfg.TTL)
		done()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			cancel(fmt.Errorf("%w: %s: renew: %w", ErrLost, l.name, err))
			return
		case tag.RowsAffected() == 0:
			cancel(fmt.Errorf("%w: %s: expired or taken over", ErrLost, l.name))
			return
		}
		sent = at
		expiry.Reset(time.Until(sent.Add(l.cfg.TTL)))
	}
}

// release ends f's hold at once, so that the next replica to try need not
// wait out the TTL. It uses a context of its own: the run's has ended. A
// release that fails leaves the lease to expire.
func (l *Lease) release(f Fence) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
	defer cancel()
	_, _ = l.pool.Exec(ctx, releaseSQL, f.name, f.token)
}
