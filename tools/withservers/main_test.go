package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// The test binary plays two more parts, chosen by its first argument:
// withservers itself, and the command withservers runs.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "as-withservers":
			os.Args = append(os.Args[:1], os.Args[2:]...)
			main()
		case "as-draining-command":
			os.Exit(drainingCommand())
		}
	}
	os.Exit(m.Run())
}

// drainingCommand stands in for the service under `make dev`: it waits for
// SIGINT, then, as a draining service would, still uses Postgres and Redis
// a moment later. It exits 0 only if both still answered.
func drainingCommand() int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt)
	fmt.Println("ready")
	<-sigs
	// Long enough for a server that got the same Ctrl-C to have shut down.
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err == nil {
		err = conn.Ping(ctx)
		conn.Close(ctx)
	}
	if err != nil {
		fmt.Println("postgres gone while draining:", err)
		return 1
	}
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		fmt.Println("redis gone while draining:", err)
		return 1
	}
	fmt.Println("drained with both servers up")
	return 0
}

// requireServerBinaries skips the test without redis-server or Postgres's
// initdb (the Debian layout, or on PATH), and fails it under CI=true.
func requireServerBinaries(t *testing.T) {
	t.Helper()
	_, redisErr := exec.LookPath("redis-server")
	initdb, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if _, err := exec.LookPath("initdb"); err == nil {
		initdb = append(initdb, "initdb")
	}
	if redisErr == nil && len(initdb) > 0 {
		return
	}
	msg := "redis-server or the Postgres server binaries are not installed: scripts/ensure-deps installs them"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// A Ctrl-C in a terminal signals the terminal's whole foreground process
// group. It must reach the command (once, through withservers) and not the
// servers, which stop only after the command has ended: a service draining
// on SIGINT still needs its database. Meanwhile the env file names both
// servers, and it is gone once they are.
func TestCtrlCReachesCommandBeforeServers(t *testing.T) {
	requireServerBinaries(t)
	t.Parallel()
	// The servers' files go to the system's temporary directory: as root,
	// postgres runs as user postgres, who cannot enter t.TempDir().
	envFile := filepath.Join(t.TempDir(), "env")
	cmd := exec.Command(os.Args[0], "as-withservers", "-env-file", envFile, "-database-env", "DATABASE_URL", "-redis-env", "REDIS_URL",
		"--", os.Args[0], "as-draining-command")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// A group of its own, as a terminal's foreground job.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	lines := bufio.NewScanner(stdout)
	ready := make(chan bool, 1)
	go func() { ready <- lines.Scan() && lines.Text() == "ready" }()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("the command never said ready; withservers:\n%s", &stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("servers not started after 60s:\n%s", &stderr)
	}

	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatalf("env file while the servers run: %v", err)
	}
	for _, want := range []string{"DATABASE_URL='postgres://", "REDIS_URL='redis://"} {
		if !strings.Contains(string(env), want) {
			t.Errorf("env file lacks %s...:\n%s", want, env)
		}
	}
	if info, err := os.Stat(envFile); err == nil && info.Mode().Perm() != 0o600 {
		t.Errorf("env file mode %v, want 0600 (a URL may hold a password)", info.Mode().Perm())
	}

	// The terminal's Ctrl-C: SIGINT to every process of the group.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	err = cmd.Wait()
	if err != nil || !strings.Contains(string(rest), "drained with both servers up") {
		t.Errorf("withservers: %v; the command said %q; withservers:\n%s", err, rest, &stderr)
	}
	if _, err := os.Stat(envFile); !os.IsNotExist(err) {
		t.Errorf("env file still there after the servers stopped (%v)", err)
	}
}

// -h answers with the flags and exit 0; a wrong command line is exit 2,
// and neither starts a server.
func TestHelpAndMisuse(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"-h"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"-no-such-flag", "--", "true"}, 2},
		{nil, 2},
	} {
		var out strings.Builder
		code, _ := run(tt.args, nil, nil, &out, &out)
		if code != tt.want {
			t.Errorf("withservers %q: exit %d, want %d", tt.args, code, tt.want)
		}
		if strings.Contains(out.String(), "started") {
			t.Errorf("withservers %q started a server:\n%s", tt.args, out.String())
		}
	}
}

// make dev keeps the servers' files under .dev of the clone. A clone under
// a private directory (root's 0700 home, a mktemp -d) is out of the reach
// of the postgres user that root runs Postgres as: withservers says so in
// one line and keeps Postgres's files in the system's temporary directory,
// instead of failing on a "permission denied" that blames initdb.
func TestPrivateDirAsRoot(t *testing.T) {
	requireServerBinaries(t)
	if os.Geteuid() != 0 {
		t.Skip("only root runs Postgres as another user; as anyone else a private directory is the user's own")
	}
	t.Parallel()
	private := t.TempDir() // 0700, owned by root
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(private, "clone", ".dev")
	var out strings.Builder
	code, err := run([]string{"-dir", dir, "-database-env", "DATABASE_URL", "-redis-env", "REDIS_URL",
		"--", "sh", "-c", `test -n "$DATABASE_URL" && test -n "$REDIS_URL"`}, nil, nil, &out, &out)
	if code != 0 || err != nil {
		t.Fatalf("withservers -dir under a 0700 directory: exit %d, %v:\n%s", code, err, out.String())
	}
	if !strings.Contains(out.String(), "keeping Postgres's files under") {
		t.Errorf("withservers did not say where Postgres's files went:\n%s", out.String())
	}
}

// -export writes variables of withservers' own environment to the env
// file beside the URLs, quoted for a shell, so that a second shell gets
// what the command got (make dev: LISTEN_ADDR, the dev secrets); an unset
// one is left out. Servers named in the environment are reused, so none
// is started here.
func TestExport(t *testing.T) {
	t.Parallel()
	envFile := filepath.Join(t.TempDir(), "env")
	environ := []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=postgres://db", "REDIS_URL=redis://r",
		"LISTEN_ADDR=127.0.0.1:9999", "SUPPORT_INBOUND_ADDRESSES=a@x.test,b@x.test", "ODD=it's"}
	// The command sources the file in a clean environment, as a second
	// shell would, and prints what it got.
	script := `env -i sh -c 'set -a; . "$0"; set +a; echo "$LISTEN_ADDR|$SUPPORT_INBOUND_ADDRESSES|$ODD|${UNSET-unset}|$DATABASE_URL"' "$1"`
	var out strings.Builder
	code, err := run([]string{"-env-file", envFile, "-database-env", "DATABASE_URL", "-redis-env", "REDIS_URL",
		"-export", "LISTEN_ADDR", "-export", "SUPPORT_INBOUND_ADDRESSES", "-export", "ODD", "-export", "UNSET",
		"--", "sh", "-c", script, "sh", envFile}, environ, nil, &out, io.Discard)
	if code != 0 || err != nil {
		t.Fatalf("withservers -export: exit %d, %v:\n%s", code, err, out.String())
	}
	if got, want := strings.TrimSpace(out.String()), "127.0.0.1:9999|a@x.test,b@x.test|it's|unset|postgres://db"; got != want {
		t.Errorf("a shell sourcing the env file got %q, want %q", got, want)
	}
	var stderr strings.Builder
	if code, _ := run([]string{"-export", "A=B", "--", "true"}, environ, nil, io.Discard, &stderr); code != 2 {
		t.Errorf("-export A=B: exit %d, want 2 (not a name)\n%s", code, stderr.String())
	}
}
