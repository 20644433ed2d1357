// Package logsample bounds the log lines a flood of refusals costs. A
// refused request (a bad signature, a body too slow, a client over its
// limit) is logged so that an operator can see what is refused and why,
// but anyone can send them by the thousand: one line each made 26,022 WARN
// lines of a 20 s flood, which buries everything else and costs the log
// pipeline more than the flood costs the service.
//
// A Sampler logs the first few lines of each kind in full within a window,
// counts the rest, and writes one summary line per window for what it
// left out: a flood costs a bounded number of lines per kind and minute,
// and the first occurrence keeps all its details. Only refusals go through
// it; failures of real work are logged in full by their callers.
package logsample

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults: the first 10 lines of a kind in a minute, then one summary.
const (
	DefaultFirst  = 10
	DefaultWindow = time.Minute
)

// Config configures a Sampler. Zero fields take the defaults; a nil Now
// is time.Now.
type Config struct {
	// First is how many lines of one kind are logged in full per window.
	First int
	// Window is how long a window lasts.
	Window time.Duration
	// Now is the clock; tests hand in a fake one.
	Now func() time.Time
}

// Sampler logs the first lines of each kind per window and summarises the
// rest. It is safe for concurrent use.
type Sampler struct {
	logger *slog.Logger
	first  int
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	kinds map[string]*tally
}

// tally is one kind's current window.
type tally struct {
	start      time.Time
	logged     int
	suppressed int
	level      slog.Level
	msg        string
}

// New returns a Sampler writing to logger (nil: discard).
func New(logger *slog.Logger, cfg Config) *Sampler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Sampler{logger: logger, first: cfg.First, window: cfg.Window, now: cfg.Now, kinds: map[string]*tally{}}
	if s.first <= 0 {
		s.first = DefaultFirst
	}
	if s.window <= 0 {
		s.window = DefaultWindow
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Log logs a line of kind, or counts it when the window has had its first
// lines of that kind already. kind names what is refused and why
// ("webhook rejected stripe signature"); callers draw it from a fixed set,
// never from the request, so the kinds kept stay few.
func (s *Sampler) Log(ctx context.Context, level slog.Level, kind, msg string, attrs ...slog.Attr) {
	if !s.logger.Enabled(ctx, level) {
		return
	}
	s.mu.Lock()
	now := s.now()
	t := s.kinds[kind]
	if t != nil && now.Sub(t.start) >= s.window {
		s.summarise(ctx, kind, t)
		t = nil
	}
	if t == nil {
		t = &tally{start: now, level: level, msg: msg}
		s.kinds[kind] = t
	}
	if t.logged >= s.first {
		t.suppressed++
		s.mu.Unlock()
		return
	}
	t.logged++
	s.mu.Unlock()
	s.logger.LogAttrs(ctx, level, msg, attrs...)
}

// Flush writes the summary of every window that has ended and forgets it,
// so the count of a flood that stopped is still told.
func (s *Sampler) Flush(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for kind, t := range s.kinds {
		if now.Sub(t.start) >= s.window {
			s.summarise(ctx, kind, t)
			delete(s.kinds, kind)
		}
	}
}

// Run flushes every window's length until ctx ends, then writes what is
// left, ended or not.
func (s *Sampler) Run(ctx context.Context) {
	tick := time.NewTicker(s.window)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			s.Flush(ctx)
		case <-ctx.Done():
			s.mu.Lock()
			defer s.mu.Unlock()
			for kind, t := range s.kinds {
				s.summarise(context.WithoutCancel(ctx), kind, t)
				delete(s.kinds, kind)
			}
			return
		}
	}
}

// summarise writes t's summary line, if it left anything out: the kind's
// message at its level, with how many lines were left out since when.
// Called with s.mu held, so that a kind's summary follows its own lines.
func (s *Sampler) summarise(ctx context.Context, kind string, t *tally) {
	if t.suppressed == 0 {
		return
	}
	s.logger.LogAttrs(ctx, t.level, t.msg,
		slog.String("sampled", kind),
		slog.Int("suppressed", t.suppressed),
		slog.Time("since", t.start),
		slog.Float64("window_seconds", s.window.Seconds()))
}
