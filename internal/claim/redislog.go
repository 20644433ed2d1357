package claim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// RedisLogger routes go-redis's own lines (pool and dial trouble) into JSON
// logs. go-redis has one package-level logger and no per-client option, so
// main sets it once (redis.SetLogger), before anything runs: setting it per
// client raced with the clients of commands that tests run side by side.
//
// A line is written at most once per every, with the count of its
// repeats held back since: while Redis is unreachable or its certificate
// untrusted, go-redis logs the same failed dial for every delivery,
// readiness probe and scrape, and the claim probe already names the reason
// once a minute. A line that says something new (a failover's "new
// master" with its address) is another line and goes out at once.
type RedisLogger struct {
	l     *slog.Logger
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	last map[string]redisLine // by the line's text
}

type redisLine struct {
	at   time.Time
	held int
}

// redisLinesKept bounds RedisLogger's memory: past it, lines last written
// over an interval ago are forgotten (their held-back counts with them).
const redisLinesKept = 256

// NewRedisLogger writes go-redis's lines to l, each at most once per every.
func NewRedisLogger(l *slog.Logger, every time.Duration) *RedisLogger {
	return &RedisLogger{l: l, every: every, now: time.Now, last: map[string]redisLine{}}
}

// Printf is go-redis's logging interface.
func (r *RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	r.mu.Lock()
	now := r.now()
	prev, seen := r.last[msg]
	if seen && now.Sub(prev.at) < r.every {
		prev.held++
		r.last[msg] = prev
		r.mu.Unlock()
		return
	}
	if len(r.last) >= redisLinesKept {
		for k, line := range r.last {
			if now.Sub(line.at) >= r.every {
				delete(r.last, k)
			}
		}
	}
	r.last[msg] = redisLine{at: now}
	r.mu.Unlock()
	attrs := []any{"component", "go-redis"}
	if prev.held > 0 {
		attrs = append(attrs, "held_back", prev.held)
	}
	r.l.WarnContext(ctx, msg, attrs...)
}
