package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// Postgres runs twice on one data directory: first as dbtest.LaunchPostgres
// starts it (fast: fsync, synchronous_commit and full_page_writes off), then
// restarted by the harness with durable settings. dbtest passes its settings
// on the postgres command line, which outranks ALTER SYSTEM, so the durable
// run needs a command line of its own.

// pgSettings are reported with each run, read back from the server.
var pgSettings = []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers", "max_connections", "shared_preload_libraries"}

// startFastPostgres starts the throwaway cluster with pg_stat_statements
// loaded (it must be preloaded, so the server is restarted once).
func startFastPostgres(ctx context.Context) (*dbtest.PostgresServer, string, int, error) {
	// Its own temporary directory: under root, postgres runs as user
	// postgres and must be able to reach it.
	dir, err := os.MkdirTemp("", "bench-postgres-")
	if err != nil {
		return nil, "", 0, err
	}
	port, err := dbtest.FreePort()
	if err != nil {
		return nil, dir, 0, err
	}
	pg, err := dbtest.LaunchPostgres(dir, port)
	if err != nil {
		return nil, dir, 0, err
	}
	if err := adminExec(ctx, pg.URL(), "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"); err != nil {
		return pg, dir, port, err
	}
	if err := pg.Stop(); err != nil {
		return pg, dir, port, err
	}
	if err := pg.Restart(); err != nil {
		return pg, dir, port, err
	}
	// The harness reads the view from the postgres database, so that its
	// own queries are not counted in the service's.
	err = adminExec(ctx, pg.URL(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	return pg, dir, port, err
}

// launchDurablePostgres starts postgres on the same data directory and port
// with every durability setting on: each commit waits for its WAL flush.
func launchDurablePostgres(dir string, port int) (*child, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port),
		"-k", dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=on",
		"-c", "synchronous_commit=on",
		"-c", "full_page_writes=on",
		"-c", "max_connections=200",
	)
	cmd.Dir = dir
	c, err := startChild("postgres (durable)", cmd, filepath.Join(dir, "postgres-durable.log"), cred)
	if err != nil {
		return nil, err
	}
	url := postgresURL(port, "postgres")
	if err := c.waitReady(60*time.Second, func() error { return pingPostgres(url) }); err != nil {
		_ = c.stop(syscall.SIGKILL, time.Second)
		return nil, err
	}
	return c, nil
}

func postgresURL(port int, db string) string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/" + db + "?sslmode=disable"
}

func pingPostgres(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// createBenchDatabase creates an empty database with pg_stat_statements
// installed; the service applies its migrations when it starts.
func createBenchDatabase(ctx context.Context, port int, name string) (string, error) {
	if err := adminExec(ctx, postgresURL(port, "postgres"), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	url := postgresURL(port, name)
	if err := adminExec(ctx, url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return "", err
	}
	return url, nil
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

// showSettings reads back the settings a run is reported with.
func showSettings(ctx context.Context, url string) (string, []string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(context.Background())
	var version string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return "", nil, err
	}
	var out []string
	for _, name := range pgSettings {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return "", nil, err
		}
		out = append(out, name+"="+v)
	}
	return version, out, nil
}

// postgresBin finds the directory holding postgres and pgbench the way
// dbtest does: $PG_BIN, else the newest /usr/lib/postgresql/<version>/bin,
// else the directory of postgres on PATH.
func postgresBin() (string, error) {
	if dir := os.Getenv("PG_BIN"); dir != "" {
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(b, a) })
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	if path, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(path), nil
	}
	return "", errors.New("no postgres in $PG_BIN, /usr/lib/postgresql/*/bin or PATH")
}

func compareVersions(a, b string) int {
	va := strings.Split(filepath.Base(filepath.Dir(a)), ".")
	vb := strings.Split(filepath.Base(filepath.Dir(b)), ".")
	for i := range min(len(va), len(vb)) {
		x, _ := strconv.Atoi(va[i])
		y, _ := strconv.Atoi(vb[i])
		if x != y {
			return x - y
		}
	}
	return len(va) - len(vb)
}

// serverCredential: postgres refuses to run as root, so root runs it as the
// postgres user (dbtest.LaunchPostgres has already handed it the directory).
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, err
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
