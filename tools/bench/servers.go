package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// Secrets of the throwaway service; the "wrong" one signs the rejected
// deliveries.
const (
	stripeSecret = "whsec_bench_stripe"
	wrongSecret  = "whsec_bench_wrong"
)

// benchDB is the database the service writes to and pgbench runs in;
// againstDB the one the build compared with (-against) writes to.
const (
	benchDB   = "bench"
	againstDB = "bench_against"
)

// harness owns everything one bench run starts, and stops it in close.
type harness struct {
	o       options
	log     io.Writer
	started time.Time
	work    string // temporary files, removed in close
	stops   []func() error

	redis    *dbtest.RedisServer
	rdb      *redis.Client
	pg       *dbtest.PostgresServer
	admin    *pgx.Conn // to the postgres database
	benchURL string    // of benchDB
	app      int       // the pid of -app-webhook's receiver, whose CPU is not ours
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "bench %5.1fs: "+format+"\n", append([]any{time.Since(h.started).Seconds()}, args...)...)
}

func (h *harness) onClose(stop func() error) { h.stops = append(h.stops, stop) }

// close stops what was started, last first.
func (h *harness) close() {
	for _, stop := range slices.Backward(h.stops) {
		if err := stop(); err != nil {
			h.logf("cleanup: %v", err)
		}
	}
}

// startServers starts Redis, and Postgres with pg_stat_statements loaded
// (it must be preloaded, so the server is restarted once). Their directory
// is the harness's own: under root, postgres runs as user postgres and must
// be able to reach it.
func (h *harness) startServers(ctx context.Context) error {
	var err error
	if h.work, err = os.MkdirTemp("", "bench-"); err != nil {
		return err
	}
	h.onClose(func() error { return os.RemoveAll(h.work) })
	port, err := dbtest.FreePort()
	if err != nil {
		return err
	}
	if h.redis, err = dbtest.LaunchRedis(h.work, port); err != nil {
		return err
	}
	h.onClose(h.redis.Stop)
	h.rdb = redis.NewClient(&redis.Options{Addr: h.redis.Addr()})
	h.onClose(h.rdb.Close)
	launch := dbtest.LaunchPostgres
	if h.o.durable {
		launch = dbtest.LaunchDurablePostgres
	}
	if h.pg, err = launch(h.work); err != nil {
		return err
	}
	h.onClose(h.pg.Stop)
	if err := adminExec(ctx, h.pg.URL(), "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"); err != nil {
		return err
	}
	if err := errors.Join(h.pg.Stop(), h.pg.Restart()); err != nil {
		return err
	}
	if h.admin, err = pgx.Connect(ctx, h.pg.URL()); err != nil {
		return err
	}
	h.onClose(func() error { return h.admin.Close(context.Background()) })
	h.benchURL = strings.Replace(h.pg.URL(), "/postgres?", "/"+benchDB+"?", 1)
	// The service applies its migrations when it starts. The harness reads
	// the statistics from the postgres database, so that its own queries
	// are not counted in the service's.
	// track_planning counts the plans Postgres builds: a prepared statement
	// planned again on every run costs more than the rest of it. It adds a
	// little to each plan, and a statement on its generic plan has none.
	// The setting exists once the library is loaded; the reload applies it
	// to the connections opened after it, which trackingPlans waits for.
	stmts := []string{"CREATE EXTENSION pg_stat_statements", "CREATE DATABASE " + benchDB,
		"ALTER SYSTEM SET pg_stat_statements.track_planning = on", "SELECT pg_reload_conf()"}
	if h.o.against != "" {
		stmts = append(stmts, "CREATE DATABASE "+againstDB)
	}
	if err := adminExec(ctx, h.pg.URL(), stmts...); err != nil {
		return err
	}
	return trackingPlans(ctx, h.pg.URL())
}

// trackingPlans waits, for at most a second, until a new connection has
// pg_stat_statements.track_planning on.
func trackingPlans(ctx context.Context, url string) error {
	for range 50 {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		var on string
		err = conn.QueryRow(ctx, "SHOW pg_stat_statements.track_planning").Scan(&on)
		conn.Close(context.Background())
		if err != nil || on == "on" {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("pg_stat_statements.track_planning is still off after the reload")
}

func adminExec(ctx context.Context, url string, stmts ...string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// target is a server under load: the service or a ceiling.
type target struct {
	addr string
	pid  int
	db   string // the database a service writes to; "" for a ceiling
}

// startService builds the service from the module in dir and starts it as
// operators run it, writing to database db, with LOG_LEVEL=warn:
// deliveries that succeed or are duplicates then log nothing, rejected
// ones still log their warning line.
func (h *harness) startService(ctx context.Context, dir, db string, extraEnv ...string) (target, error) {
	bin := filepath.Join(h.work, "munchable-webhooks-"+db)
	// `make build`, the build the Dockerfile repeats, static and stripped:
	// a plain go build links libc for cgo and maps 1.5 MiB more at idle,
	// which peak RSS would count against the service.
	build := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", dir, "build", "GO="+h.o.goBin, "BIN="+bin)
	if out, err := build.CombinedOutput(); err != nil {
		return target{}, fmt.Errorf("make build in %s: %w\n%s", dir, err, out)
	}
	env := []string{
		"DATABASE_URL=" + strings.Replace(h.benchURL, "/"+benchDB+"?", "/"+db+"?", 1),
		"REDIS_URL=" + h.redis.URL(),
		"STRIPE_WEBHOOK_SECRET=" + stripeSecret,
		"RESEND_WEBHOOK_SECRET=whsec_YmVuY2gtb25seS1yZXNlbmQtc2VjcmV0", // base64("bench-only-resend-secret")
		"RESEND_API_KEY=re_bench_only",
		"SUPPORT_INBOUND_ADDRESSES=support@munchable.app",
		"LOG_LEVEL=warn",
	}
	if h.o.serviceEnv != "" {
		env = append(env, strings.Split(h.o.serviceEnv, ",")...)
	}
	env = append(env, extraEnv...)
	t, err := h.start("service-"+db, "/readyz", func(addr string) *exec.Cmd {
		cmd := exec.Command(bin, "serve")
		cmd.Env = append(env, "LISTEN_ADDR="+addr)
		return cmd
	})
	t.db = db
	return t, err
}

// startCeiling starts this binary as a ceiling server.
func (h *harness) startCeiling(mode string) (target, error) {
	self, err := os.Executable()
	if err != nil {
		return target{}, err
	}
	return h.start("ceiling-"+mode, "/healthz", func(addr string) *exec.Cmd {
		return exec.Command(self, "ceiling", mode, addr)
	})
}

// start finds a free port and runs the command made to listen on it, with
// PATH added to the command's own environment and its output in a log
// file, until close; it waits until the command answers 200 on readyPath.
func (h *harness) start(name, readyPath string, command func(addr string) *exec.Cmd) (target, error) {
	port, err := dbtest.FreePort()
	if err != nil {
		return target{}, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := command(addr)
	cmd.Env = append(cmd.Env, "PATH="+os.Getenv("PATH"))
	logPath := filepath.Join(h.work, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return target{}, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Killed with the harness, should it die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return target{}, fmt.Errorf("start %s: %w", name, err)
	}
	h.onClose(func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait() // a ceiling dies of the signal
		return nil
	})
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + readyPath); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return target{addr: addr, pid: cmd.Process.Pid}, nil
			}
		}
	}
	// The log goes with the temporary directory: show its end now.
	log, _ := os.ReadFile(logPath)
	return target{}, fmt.Errorf("%s not ready after 60s:\n%s", name, log[max(0, len(log)-3000):])
}

// startReceiver builds and starts examples/appreceiver as the app's
// webhook endpoint and returns the service environment that points at it.
// It runs at nice 19: the app's server is not on the service's machine, so
// it should take only the CPU the service, Postgres and Redis leave.
func (h *harness) startReceiver(ctx context.Context) ([]string, error) {
	bin := filepath.Join(h.work, "appreceiver")
	build := exec.CommandContext(ctx, h.o.goBin, "build", "-o", bin, "./examples/appreceiver")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build examples/appreceiver: %w\n%s", err, out)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	t, err := h.start("appreceiver", "/access", func(addr string) *exec.Cmd {
		cmd := exec.Command("nice", "-n", "19", bin, "-addr", addr)
		cmd.Env = []string{"APP_WEBHOOK_SECRET=" + secret}
		return cmd
	})
	if err != nil {
		return nil, err
	}
	h.app = t.pid
	return []string{"APP_WEBHOOK_URL=http://" + t.addr + "/hooks", "APP_WEBHOOK_SECRET=" + secret, "APP_WEBHOOK_ALLOW_HTTP=true"}, nil
}
