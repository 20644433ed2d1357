package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// supervisor is the orchestrator that brings the service back: whenever the
// process exits, it launches it again (on the same address) until it serves.
// A launch fails while Postgres is down (the service pings it at startup),
// so it keeps trying, as a container restart policy would.
type supervisor struct {
	svc *faulttest.Service

	starts, failedStarts atomic.Int64
}

// run supervises until ctx ends.
func (s *supervisor) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.svc.Exited():
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			if err := s.svc.Launch(); err != nil {
				continue // still running: someone else launched it
			}
			hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := s.svc.WaitHealthy(hctx)
			cancel()
			if err == nil {
				s.starts.Add(1)
				break
			}
			s.failedStarts.Add(1)
			s.svc.Kill()
		}
	}
}

// chaos kills and restarts Redis, Postgres and the service at random, each
// on a loop of its own, so that faults overlap: Redis may be down while the
// service restarts, Postgres while Redis comes back.
type chaos struct {
	redis *dbtest.RedisServer
	pg    *dbtest.PostgresServer
	svc   *faulttest.Service
	every time.Duration // mean pause between two faults of one component
	seed  int64
	log   io.Writer // safe for concurrent use

	redisKills, pgKills, svcKills, svcTerms atomic.Int64
	uncleanExits, restoreErrors             atomic.Int64
	redisDown, pgDown                       atomic.Int64 // nanoseconds
}

// run breaks things until ctx ends, then returns with every server up.
func (c *chaos) run(ctx context.Context) {
	var wg sync.WaitGroup
	for i, loop := range []func(context.Context, *rand.Rand){c.redisLoop, c.postgresLoop, c.serviceLoop} {
		rng := rand.New(rand.NewPCG(uint64(c.seed), uint64(i+1)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(ctx, rng)
		}()
	}
	wg.Wait()
}

func (c *chaos) logf(format string, args ...any) {
	fmt.Fprintf(c.log, format+"\n", args...)
}

// pause waits a random time around c.every; false when ctx ended.
func (c *chaos) pause(ctx context.Context, rng *rand.Rand) bool {
	d := c.every/2 + time.Duration(rng.Int64N(int64(c.every)))
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// downtime is how long a killed server stays down before its restart
// begins: 0.2 s to 1.5 s (a Postgres restart adds crash recovery).
func downtime(rng *rand.Rand) time.Duration {
	return 200*time.Millisecond + time.Duration(rng.Int64N(int64(1300*time.Millisecond)))
}

func (c *chaos) redisLoop(ctx context.Context, rng *rand.Rand) {
	for c.pause(ctx, rng) {
		c.redis.Kill()
		c.redisKills.Add(1)
		down := time.Now()
		time.Sleep(downtime(rng))
		for err := c.redis.Restart(); err != nil; err = c.redis.Restart() {
			c.restoreErrors.Add(1)
			c.logf("chaos: restart redis-server: %v", err)
			time.Sleep(200 * time.Millisecond)
		}
		c.redisDown.Add(int64(time.Since(down)))
	}
}

func (c *chaos) postgresLoop(ctx context.Context, rng *rand.Rand) {
	for c.pause(ctx, rng) {
		c.pg.Kill()
		c.pgKills.Add(1)
		down := time.Now()
		time.Sleep(downtime(rng))
		for err := c.pg.Restart(); err != nil; err = c.pg.Restart() {
			c.restoreErrors.Add(1)
			c.logf("chaos: restart postgres: %v", err)
			time.Sleep(200 * time.Millisecond)
		}
		c.pgDown.Add(int64(time.Since(down)))
	}
}

// serviceLoop kills the service (kill -9, 70 %) or stops it (SIGTERM), only
// while it serves; the supervisor brings it back.
func (c *chaos) serviceLoop(ctx context.Context, rng *rand.Rand) {
	for c.pause(ctx, rng) {
		if c.svc.Probe(ctx, "/healthz") != http.StatusOK {
			continue // still starting: the supervisor's business
		}
		if rng.Float64() < 0.7 {
			c.svc.Kill()
			c.svcKills.Add(1)
			continue
		}
		c.svcTerms.Add(1)
		state, err := c.svc.Terminate(30 * time.Second)
		if err != nil || state.ExitCode() != 0 {
			// Exit 0 within HANDLER_TIMEOUT + 2 x REDIS_TIMEOUT + 5 s is the
			// contract.
			c.uncleanExits.Add(1)
			c.logf("chaos: SIGTERM: exit %v, %v", state, err)
		}
	}
}
