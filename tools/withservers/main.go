// Command withservers runs a command with TEST_DATABASE_URL and
// TEST_REDIS_URL set. For each one not already set it starts a throwaway
// server (Postgres or redis-server, in a temporary directory) and stops it
// when the command ends. It exits with the command's exit code.
//
//	go run ./tools/withservers -- go test ./...
//
// Flags name other variables, keep the servers' files elsewhere and write
// the URLs to a file another shell can source, with any variables of
// withservers' own environment that -export names (the stand-ins the
// command starts append their URLs to it); `make dev` runs the service
// this way:
//
//	withservers -dir .dev -env-file .dev/env -database-env DATABASE_URL -redis-env REDIS_URL -export LISTEN_ADDR ... -- bin/munchable-webhooks serve
//
// The command runs in a process group of its own, and SIGINT or SIGTERM to
// withservers is passed on to that whole group once: a Ctrl-C in a terminal
// (which signals the terminal's group) then reaches the command exactly once,
// as it does a `kill`. The command should therefore not read the terminal.
// The servers run in groups of their own too (internal/dbtest), so the
// Ctrl-C does not reach them: they are stopped only after the command has
// ended, and a service that drains on SIGINT still has its database while it
// does.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

func main() {
	code, err := run(os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "withservers:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// run starts the servers that environ does not name, runs the command in
// args with their URLs added to its environment, stops the servers, and
// returns the command's exit code. An error means withservers itself failed,
// possibly after the command ran.
func run(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) (code int, err error) {
	fs := flag.NewFlagSet("withservers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "directory to keep the servers' data and logs in while they run (default: the system's temporary directory)")
	dbEnv := fs.String("database-env", dbtest.DatabaseURLEnv, "variable that names the Postgres URL: reused when set, else set to a throwaway server's")
	redisEnv := fs.String("redis-env", dbtest.RedisURLEnv, "variable that names the Redis URL: reused when set, else set to a throwaway server's")
	envFile := fs.String("env-file", "", "file to write both variables to, for `set -a; . FILE` in another shell; removed when the servers stop")
	var exports []string
	fs.Func("export", "`NAME` of a variable of this environment to write to the env file too, when set (repeatable)", func(name string) error {
		if name == "" || strings.ContainsAny(name, "= '") {
			return fmt.Errorf("%q is not a variable name", name)
		}
		exports = append(exports, name)
		return nil
	})
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0, nil // -h is an answer, not a failure
	} else if err != nil {
		return 2, err
	}
	args = fs.Args()
	if len(args) == 0 {
		return 2, errors.New("usage: withservers [-dir DIR] [-database-env NAME] [-redis-env NAME] [-env-file FILE [-export NAME]...] -- command [args...]")
	}
	if *dir != "" {
		// Absolute, because postgres resolves its data directory from a
		// working directory of its own.
		if *dir, err = filepath.Abs(*dir); err != nil {
			return 1, err
		}
		if err := os.MkdirAll(*dir, 0o755); err != nil {
			return 1, err
		}
	}

	// Caught from the start, so that a signal while the servers start or the
	// command runs still leads to the servers being stopped, below.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var stops []func() error
	defer func() {
		for _, stop := range slices.Backward(stops) {
			err = errors.Join(err, stop())
		}
	}()

	databaseURL, redisURL := lookup(environ, *dbEnv), lookup(environ, *redisEnv)
	var env []string
	if databaseURL == "" {
		pgDir := *dir
		if err := dbtest.ServerCanReach(pgDir); errors.Is(err, dbtest.ErrUnreachable) {
			// Root runs Postgres as the postgres user, who cannot enter a
			// clone under a private directory (root's home, a mktemp -d):
			// its files go to the system's temporary directory instead.
			fmt.Fprintf(stderr, "withservers: %v; keeping Postgres's files under %s instead\n", err, os.TempDir())
			pgDir = ""
		}
		pg, stop, err := startPostgres(pgDir)
		if err != nil {
			return 1, err
		}
		stops = append(stops, stop)
		databaseURL = pg.URL()
		env = append(env, *dbEnv+"="+databaseURL)
		fmt.Fprintf(stderr, "withservers: started postgres:     %s=%s\n", *dbEnv, databaseURL)
	} else {
		fmt.Fprintf(stderr, "withservers: reused %s\n", *dbEnv)
	}
	if redisURL == "" {
		rs, stop, err := startRedis(*dir)
		if err != nil {
			return 1, err
		}
		stops = append(stops, stop)
		redisURL = rs.URL()
		env = append(env, *redisEnv+"="+redisURL)
		fmt.Fprintf(stderr, "withservers: started redis-server: %s=%s\n", *redisEnv, redisURL)
	} else {
		fmt.Fprintf(stderr, "withservers: reused %s\n", *redisEnv)
	}
	if *envFile != "" {
		vars := [][2]string{{*dbEnv, databaseURL}, {*redisEnv, redisURL}}
		for _, name := range exports {
			if v, ok := lookupSet(environ, name); ok {
				vars = append(vars, [2]string{name, v})
			}
		}
		stop, err := writeEnvFile(*envFile, vars)
		if err != nil {
			return 1, err
		}
		stops = append(stops, stop)
		fmt.Fprintf(stderr, "withservers: wrote %s: in another shell, set -a; . %s; set +a\n", *envFile, *envFile)
	}

	select {
	case sig := <-sigs:
		return exitCodeFor(sig), fmt.Errorf("%v before the command started", sig)
	default:
	}

	cmd := exec.Command(args[0], args[1:]...)
	// Later entries win, so these override any empty ones in environ.
	cmd.Env = append(slices.Clone(environ), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	// A group of its own, so that only we signal it (see the package doc):
	// in the terminal's group it would get a Ctrl-C twice, from the terminal
	// and from us, and a server that takes a second signal as "stop now"
	// would skip its orderly shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 1, fmt.Errorf("start command: %w", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			// Passed on for the command (and its children: go test's test
			// binaries) to end in their own way; the servers are stopped
			// once it has.
			_ = syscall.Kill(-cmd.Process.Pid, sig.(syscall.Signal))
		case err := <-waited:
			return exitCode(err)
		}
	}
}

// startPostgres starts a server with its files in a new directory under
// parent ("": the system's temporary directory), removed when it stops.
func startPostgres(parent string) (*dbtest.PostgresServer, func() error, error) {
	dir, err := os.MkdirTemp(parent, "withservers-postgres-")
	if err != nil {
		return nil, nil, err
	}
	s, err := dbtest.LaunchPostgres(dir)
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	stop := func() error { return errors.Join(s.Stop(), os.RemoveAll(dir)) }
	return s, stop, nil
}

func startRedis(parent string) (*dbtest.RedisServer, func() error, error) {
	dir, err := os.MkdirTemp(parent, "withservers-redis-")
	if err != nil {
		return nil, nil, err
	}
	port, err := dbtest.FreePort()
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	s, err := dbtest.LaunchRedis(dir, port)
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	stop := func() error { return errors.Join(s.Stop(), os.RemoveAll(dir)) }
	return s, stop, nil
}

// writeEnvFile writes vars as shell assignments, single-quoted (a URL may
// hold & or ;), readable only by us (a URL may hold a password). The
// returned func removes the file: once the servers stop, its URLs are wrong.
func writeEnvFile(name string, vars [][2]string) (remove func() error, err error) {
	var b strings.Builder
	b.WriteString("# Written by withservers while its servers run; removed when they stop.\n")
	for _, kv := range vars {
		fmt.Fprintf(&b, "%s='%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", `'\''`))
	}
	if err := os.WriteFile(name, []byte(b.String()), 0o600); err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	return func() error { return os.Remove(name) }, nil
}

// lookup returns the value of key in environ, or "".
func lookup(environ []string, key string) string {
	v, _ := lookupSet(environ, key)
	return v
}

// lookupSet returns the value of key in environ and whether it is set.
func lookupSet(environ []string, key string) (v string, set bool) {
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v, set = val, true // the last one wins, as in exec
		}
	}
	return v, set
}

// exitCode turns the command's Wait result into our exit code, as a shell
// would: its own code, or 128+N when signal N ended it.
func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return 1, fmt.Errorf("wait for command: %w", err)
	}
	if status, ok := exitErr.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		return exitCodeFor(status.Signal()), nil
	}
	return exitErr.ExitCode(), nil
}

func exitCodeFor(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}
