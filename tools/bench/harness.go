package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// Secrets of the throwaway service; the "wrong" one signs the rejected
// deliveries.
const (
	stripeSecret = "whsec_bench_stripe"
	wrongSecret  = "whsec_bench_wrong"
)

// harness owns everything one bench run starts, and stops it in close.
type harness struct {
	o       options
	log     io.Writer
	started time.Time
	root    string
	work    string // temporary files, removed in close
	self    string // this binary, re-run as the ceiling servers
	tmpl    template
	stops   []func() error

	redis  *dbtest.RedisServer
	rdb    *redis.Client
	pg     *dbtest.PostgresServer
	pgDir  string
	pgPort int
	pgBin  string

	serviceBin string
	goVersion  string
}

func newHarness(o options, log io.Writer) (*harness, error) {
	h := &harness{o: o, log: log, started: time.Now()}
	var err error
	if h.root, err = moduleRoot(); err != nil {
		return nil, err
	}
	if h.self, err = os.Executable(); err != nil {
		return nil, err
	}
	if h.tmpl, err = loadTemplate(h.root); err != nil {
		return nil, err
	}
	if h.pgBin, err = postgresBin(); err != nil {
		return nil, err
	}
	for _, tool := range []string{filepath.Join(h.pgBin, "pgbench"), "redis-benchmark"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is needed: %w", tool, err)
		}
	}
	if h.work, err = os.MkdirTemp("", "bench-"); err != nil {
		return nil, err
	}
	h.stops = append(h.stops, func() error { return os.RemoveAll(h.work) })
	return h, nil
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "bench %5.1fs: "+format+"\n", append([]any{time.Since(h.started).Seconds()}, args...)...)
}

// close stops what was started, last first.
func (h *harness) close() {
	for _, stop := range slices.Backward(h.stops) {
		if err := stop(); err != nil {
			h.logf("cleanup: %v", err)
		}
	}
}

func (h *harness) onClose(stop func() error) { h.stops = append(h.stops, stop) }

// startServers starts Redis and the fast Postgres, and builds the service.
func (h *harness) startServers(ctx context.Context) error {
	redisDir := filepath.Join(h.work, "redis")
	if err := os.Mkdir(redisDir, 0o755); err != nil {
		return err
	}
	port, err := dbtest.FreePort()
	if err != nil {
		return err
	}
	if h.redis, err = dbtest.LaunchRedis(redisDir, port); err != nil {
		return err
	}
	h.onClose(h.redis.Stop)
	opts, err := redis.ParseURL(h.redis.URL())
	if err != nil {
		return err
	}
	h.rdb = redis.NewClient(opts)
	h.onClose(h.rdb.Close)

	pg, dir, pgPort, err := startFastPostgres(ctx)
	if dir != "" {
		h.onClose(func() error { return os.RemoveAll(dir) })
	}
	if pg != nil {
		h.onClose(pg.Stop)
	}
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	h.pg, h.pgDir, h.pgPort = pg, dir, pgPort

	h.serviceBin = filepath.Join(h.work, "munchable-webhooks")
	build := exec.CommandContext(ctx, h.o.goBin, "build", "-o", h.serviceBin, "./cmd/munchable-webhooks")
	build.Dir = h.root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/munchable-webhooks: %w\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, h.o.goBin, "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("go env GOVERSION: %w", err)
	}
	h.goVersion = strings.TrimSpace(string(out))
	return nil
}

// service is one run of the service binary.
type service struct {
	proc *child
	target
}

// startService starts the built binary on db, as operators would run it,
// with LOG_LEVEL=warn: deliveries that succeed or are duplicates then log
// nothing, rejected ones still log their warning line.
func (h *harness) startService(ctx context.Context, name, db string, pgPort int) (*service, error) {
	port, err := dbtest.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.CommandContext(ctx, h.serviceBin, "serve")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"LISTEN_ADDR=" + addr,
		"DATABASE_URL=" + postgresURL(pgPort, db),
		"REDIS_URL=" + h.redis.URL(),
		"STRIPE_WEBHOOK_SECRET=" + stripeSecret,
		"RESEND_WEBHOOK_SECRET=whsec_ZGV2LW9ubHktcmVzZW5kLXNlY3JldA==",
		"RESEND_API_KEY=re_bench_only",
		"SUPPORT_INBOUND_ADDRESSES=support@munchable.app",
		"LOG_LEVEL=warn",
	}
	if h.o.serviceEnv != "" {
		// Later entries win, so these override the ones above.
		cmd.Env = append(cmd.Env, strings.Split(h.o.serviceEnv, ",")...)
	}
	c, err := startChild(name, cmd, filepath.Join(h.work, name+".log"), nil)
	if err != nil {
		return nil, err
	}
	if err := c.waitReady(60*time.Second, httpReady("http://"+addr+"/readyz")); err != nil {
		_ = c.stop(syscall.SIGKILL, time.Second)
		return nil, err
	}
	return &service{proc: c, target: target{
		name: name, addr: addr, pid: c.pid(),
		metricsURL: "http://" + addr + "/metrics",
		db:         db, pgPort: pgPort,
	}}, nil
}

func (s *service) stop() error { return s.proc.stop(syscall.SIGTERM, 40*time.Second) }

// startCeiling starts this binary as a ceiling server.
func (h *harness) startCeiling(ctx context.Context, mode string) (target, error) {
	port, err := dbtest.FreePort()
	if err != nil {
		return target{}, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.CommandContext(ctx, h.self, "ceiling", "-mode", mode, "-addr", addr, "-secret", stripeSecret)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	name := "ceiling-" + mode
	c, err := startChild(name, cmd, filepath.Join(h.work, name+".log"), nil)
	if err != nil {
		return target{}, err
	}
	h.onClose(func() error { return c.stop(syscall.SIGTERM, 10*time.Second) })
	if err := c.waitReady(30*time.Second, httpReady("http://"+addr+"/healthz")); err != nil {
		return target{}, err
	}
	return target{name: name, addr: addr, pid: c.pid()}, nil
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}
