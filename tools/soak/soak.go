package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// The service's settings for the soak: a short handler deadline and
// processing TTL, so that a killed delivery's claim expires in seconds.
const (
	handlerTimeout = 2 * time.Second
	processingTTL  = 4 * time.Second
)

// report is what a soak did and found.
type report struct {
	cfg      config
	w        *workload
	p        *providers
	c        *chaos
	sup      *supervisor
	v        verdict
	checked  bool
	duration time.Duration
	workDir  string
}

func (r *report) ok() bool {
	return r.checked && r.v.ok() && r.p.undelivered.Load() == 0 && r.p.rejected.Load() == 0
}

// soak runs one soak and reports on it; progress lines go to out.
func soak(ctx context.Context, cfg config, out io.Writer) (*report, error) {
	start := time.Now()
	out = &lockedWriter{w: out} // progress and chaos write from their own goroutines
	dir, err := os.MkdirTemp("", "soak-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if !cfg.Keep {
			os.RemoveAll(dir)
		}
	}()

	bin := cfg.Bin
	if bin == "" {
		fmt.Fprintln(out, "soak: building the service")
		if bin, err = faulttest.Build(ctx, dir); err != nil {
			return nil, err
		}
	}

	rs, stopRedis, err := launchRedis(dir)
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	pg, stopPostgres, err := launchPostgres()
	if err != nil {
		return nil, err
	}
	defer stopPostgres()
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := faulttest.DurableCommits(setup, pg.URL()); err != nil {
		return nil, err
	}

	w := newWorkload(cfg)
	api := faulttest.NewResendAPI()
	defer api.Close()
	for _, m := range w.mails {
		api.Add(m.Email)
	}
	api.SetHook(resendFaults)

	env := faulttest.BaseEnv()
	env["DATABASE_URL"] = pg.URL()
	env["REDIS_URL"] = rs.URL()
	env["RESEND_API_URL"] = api.URL()
	env["HANDLER_TIMEOUT"] = handlerTimeout.String()
	env["CLAIM_PROCESSING_TTL"] = processingTTL.String()
	env["DATABASE_MAX_CONNS"] = strconv.Itoa(cfg.Concurrency + 8)
	svc, err := faulttest.NewService(bin, env, filepath.Join(dir, "service.log"))
	if err != nil {
		return nil, err
	}
	defer svc.Kill()
	if err := svc.Start(setup); err != nil {
		return nil, err
	}

	rep := &report{cfg: cfg, w: w, workDir: dir}
	rep.sup = &supervisor{svc: svc}
	rep.c = &chaos{redis: rs, pg: pg, svc: svc, every: cfg.Chaos, seed: cfg.Seed, log: out}
	rep.p = newProviders(svc.URL(), cfg.Concurrency, start.Add(cfg.Timeout))
	fmt.Fprintf(out, "soak: %d events, %d deliveries, concurrency %d, rate %v/s, chaos every ~%v per component, work dir %s\n",
		w.events, len(w.deliveries), cfg.Concurrency, cfg.Rate, cfg.Chaos, dir)

	chaosCtx, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	var background sync.WaitGroup
	background.Add(3)
	go func() {
		defer background.Done()
		rep.sup.run(chaosCtx)
	}()
	go func() {
		defer background.Done()
		if cfg.Chaos > 0 {
			rep.c.run(chaosCtx)
		}
	}()
	go func() {
		defer background.Done()
		progress(chaosCtx, out, start, rep)
	}()

	rep.p.run(ctx, w.deliveries, cfg.Concurrency, cfg.Rate)
	rep.duration = time.Since(start)
	stopChaos()
	background.Wait() // every server is up again once the chaos loops return

	// The service may be down (killed just before the chaos stopped).
	final, cancelFinal := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelFinal()
	if !svc.Running() {
		if err := svc.Start(final); err != nil {
			return rep, fmt.Errorf("restart the service for the check: %w", err)
		}
	}
	if err := svc.WaitReady(final); err != nil {
		return rep, err
	}
	rep.v, err = check(final, pg.URL(), w)
	if err != nil {
		return rep, err
	}
	rep.checked = true
	rep.duration = time.Since(start)
	if _, err := svc.Terminate(30 * time.Second); err != nil {
		return rep, err
	}
	return rep, nil
}

// resendFaults makes the fake Resend API behave like the real one on a bad
// day: 3 % of fetches fail with 500, 2 % are rate limited (429: a few
// requests a second per team), 10 % take 20-220 ms.
func resendFaults(ctx context.Context, _ string) int {
	switch r := rand.Float64(); {
	case r < 0.03:
		return http.StatusInternalServerError
	case r < 0.05:
		return http.StatusTooManyRequests
	case r < 0.15:
		select {
		case <-ctx.Done():
		case <-time.After(20*time.Millisecond + rand.N(200*time.Millisecond)):
		}
	}
	return 0
}

func launchRedis(dir string) (*dbtest.RedisServer, func(), error) {
	redisDir := filepath.Join(dir, "redis")
	if err := os.Mkdir(redisDir, 0o755); err != nil {
		return nil, nil, err
	}
	port, err := dbtest.FreePort()
	if err != nil {
		return nil, nil, err
	}
	rs, err := dbtest.LaunchRedis(redisDir, port)
	if err != nil {
		return nil, nil, err
	}
	return rs, func() { _ = rs.Stop() }, nil
}

// launchPostgres starts a cluster in a directory of its own under the
// system temporary directory: under root it runs as the postgres user, who
// must be able to reach it.
func launchPostgres() (*dbtest.PostgresServer, func(), error) {
	dir, err := os.MkdirTemp("", "soak-postgres-")
	if err != nil {
		return nil, nil, err
	}
	pg, err := dbtest.LaunchPostgres(dir)
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	return pg, func() {
		_ = pg.Stop()
		_ = os.RemoveAll(dir)
	}, nil
}

// progress prints a line every 5 seconds until ctx ends.
func progress(ctx context.Context, out io.Writer, start time.Time, r *report) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p, c := r.p, r.c
		fmt.Fprintf(out, "soak: %3.0fs sent %d/%d, acked %d, attempts %d (409 %d, 500 %d, no answer %d, degraded %d); chaos: redis %d, postgres %d, kill -9 %d, SIGTERM %d\n",
			time.Since(start).Seconds(), p.sent.Load(), len(r.w.deliveries), p.acked.Load(), p.attempts.Load(),
			p.conflict.Load(), p.failed.Load(), p.noAnswer.Load(), p.degraded.Load(),
			c.redisKills.Load(), c.pgKills.Load(), c.svcKills.Load(), c.svcTerms.Load())
	}
}

func (r *report) print(out io.Writer) {
	w, p, c := r.w, r.p, r.c
	stripe, terminal, afterEnd, ties, mails, support, twins := 0, 0, 0, 0, len(w.mails), 0, 0
	for _, s := range w.subs {
		stripe += len(s.events)
		terminal += s.terminal
		afterEnd += s.afterEnd
		ties += s.ties
	}
	for _, m := range w.mails {
		if m.support {
			support++
		}
		if m.twinOf != nil {
			twins++
		}
	}
	redeliveries := 0
	for _, d := range w.deliveries {
		if d.redelivery {
			redeliveries++
		}
	}
	fmt.Fprintf(out, "\nsoak (seed %d): %d events: %d subscription events for %d subscriptions (%d same-second pairs, %d terminal, %d updates after the end), %d inbound mails (%d to support, %d twins)\n",
		r.cfg.Seed, w.events, stripe, len(w.subs), ties, terminal, afterEnd, mails, support, twins)
	fmt.Fprintf(out, "deliveries: %d (%d redeliveries), attempts %d (%d retries), duration %v\n",
		len(w.deliveries), redeliveries, p.attempts.Load(), p.retries.Load(), r.duration.Round(100*time.Millisecond))
	fmt.Fprintf(out, "answers: 200 first %d, 200 duplicate %d, 200 degraded %d, 409 %d, 500 %d, 503 %d, 400 %d, other %d, no answer %d (refused %d, broken %d, timed out %d); slowest attempt %v\n",
		p.first.Load(), p.duplicate.Load(), p.degraded.Load(), p.conflict.Load(), p.failed.Load(),
		p.unavailable.Load(), p.rejected.Load(), p.other.Load(), p.noAnswer.Load(),
		p.refused.Load(), p.broken.Load(), p.timedOut.Load(), time.Duration(p.slowest.Load()).Round(time.Millisecond))
	fmt.Fprintf(out, "chaos: %d actions: redis-server kill %d (down %.1fs in all), postgres kill %d (down %.1fs), service kill -9 %d, service SIGTERM %d (%d unclean exits); service restarts %d (%d failed starts); %d restore errors\n",
		c.redisKills.Load()+c.pgKills.Load()+c.svcKills.Load()+c.svcTerms.Load(),
		c.redisKills.Load(), time.Duration(c.redisDown.Load()).Seconds(),
		c.pgKills.Load(), time.Duration(c.pgDown.Load()).Seconds(),
		c.svcKills.Load(), c.svcTerms.Load(), c.uncleanExits.Load(),
		r.sup.starts.Load(), r.sup.failedStarts.Load(), c.restoreErrors.Load())
	if !r.checked {
		fmt.Fprintln(out, "model: not checked")
		return
	}
	v := r.v
	fmt.Fprintf(out, "model: lost %d (%d subscriptions, %d mails), regressed %d, duplicated %d, revived %d, unexpected %d, acked early %d, undelivered %d; kept out as unordered %d\n",
		v.lost(), v.lostSubs, v.lostMails, v.regressed, v.duplicated, v.revived, v.unexpected, v.ackedEarly, p.undelivered.Load(), v.unordered)
	for _, e := range v.examples {
		fmt.Fprintln(out, "  "+e)
	}
	verdict := "PASS"
	if !r.ok() {
		verdict = "FAIL"
		if r.cfg.Keep {
			verdict += " (service log in " + r.workDir + ")"
		}
	}
	fmt.Fprintln(out, verdict)
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
