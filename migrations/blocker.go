package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// blocker is the session a migration waited for, as pg_stat_activity saw
// it while the migration waited: what an operator needs to find it and
// decide whether to end it (pg_terminate_backend(pid)).
type blocker struct {
	found       bool
	pid         int64
	application string
	client      string
	state       string
	xactOpen    time.Duration
	query       string
	relation    string
}

func (b blocker) String() string {
	if !b.found {
		return "the blocking session was not seen (it ended, or the wait was too short to see)"
	}
	return fmt.Sprintf("blocked on %s by pid %d (application_name %q, client %s, state %q, transaction open %s, query %q)",
		b.relation, b.pid, b.application, b.client, b.state, b.xactOpen.Round(time.Second), b.query)
}

// blockerQuery names the oldest transaction among the sessions that block
// pid (pg_blocking_pids reads pg_locks), and what pid waits for: a table,
// or (a CONCURRENTLY build waiting out older snapshots) a transaction's end.
const blockerQuery = `
SELECT a.pid, coalesce(a.application_name, ''),
       coalesce(host(a.client_addr), 'local socket'), coalesce(a.state, ''),
       coalesce(extract(epoch FROM now() - a.xact_start), 0)::float8,
       left(coalesce(a.query, ''), 100),
       coalesce((SELECT CASE WHEN l.relation IS NOT NULL THEN l.relation::regclass::text
                             ELSE 'the end of its transaction (' || l.locktype || ' lock)' END
                 FROM pg_locks l WHERE l.pid = $1 AND NOT l.granted
                 LIMIT 1), 'a lock')
FROM pg_stat_activity a
WHERE a.pid = ANY (pg_blocking_pids($1::int))
ORDER BY a.xact_start NULLS LAST
LIMIT 1`

// watchBlockers looks, every 100 ms until stop is called, for the session
// blocking the migration's, and stop returns the last one seen. The
// question is asked while the migration waits: once lock_timeout ends the
// wait, nothing links the two sessions any more.
func watchBlockers(ctx context.Context, db *sql.DB, session *timeoutSession) (stop func() blocker) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan blocker, 1)
	go func() {
		var last blocker
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- last
				return
			case <-tick.C:
			}
			pid := session.pid.Load()
			if pid == 0 {
				continue
			}
			var b blocker
			var secs float64
			err := db.QueryRowContext(ctx, blockerQuery, pid).Scan(
				&b.pid, &b.application, &b.client, &b.state, &secs, &b.query, &b.relation)
			if err != nil {
				continue // no blocker now (sql.ErrNoRows), or the look failed: keep the last
			}
			b.found = true
			b.xactOpen = time.Duration(secs * float64(time.Second))
			last = b
		}
	}()
	return func() blocker {
		cancel()
		return <-done
	}
}
