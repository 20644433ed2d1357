// Command withservers runs a command with TEST_DATABASE_URL and
// TEST_REDIS_URL set. For each one not already set it starts a throwaway
// server (Postgres or redis-server, in a temporary directory) and stops it
// when the command ends. It exits with the command's exit code.
//
//	go run ./tools/withservers -- go test ./...
//
// Flags name other variables and keep the servers' files elsewhere; `make
// dev` runs the service this way:
//
//	withservers -dir .dev -database-env DATABASE_URL -redis-env REDIS_URL -- bin/munchable-webhooks serve
//
// The command runs in a process group of its own, and SIGINT or SIGTERM to
// withservers is passed on to that whole group once: a Ctrl-C in a terminal
// (which signals the terminal's group) then reaches the command exactly once,
// as it does a `kill`. The command should therefore not read the terminal.
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
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	args = fs.Args()
	if len(args) == 0 {
		return 2, errors.New("usage: withservers [-dir DIR] [-database-env NAME] [-redis-env NAME] -- command [args...]")
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

	var env, report []string
	if v := lookup(environ, *dbEnv); v != "" {
		report = append(report, "reused "+*dbEnv)
	} else {
		pg, stop, err := startPostgres(*dir)
		if err != nil {
			return 1, err
		}
		stops = append(stops, stop)
		env = append(env, *dbEnv+"="+pg.URL())
		report = append(report, "started postgres: "+*dbEnv+"="+pg.URL())
	}
	if v := lookup(environ, *redisEnv); v != "" {
		report = append(report, "reused "+*redisEnv)
	} else {
		rs, stop, err := startRedis(*dir)
		if err != nil {
			return 1, err
		}
		stops = append(stops, stop)
		env = append(env, *redisEnv+"="+rs.URL())
		report = append(report, "started redis-server: "+*redisEnv+"="+rs.URL())
	}
	fmt.Fprintln(stderr, "withservers:", strings.Join(report, ", "))

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
	port, err := dbtest.FreePort()
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	s, err := dbtest.LaunchPostgres(dir, port)
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

// lookup returns the value of key in environ, or "".
func lookup(environ []string, key string) string {
	v := ""
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val // the last one wins, as in exec
		}
	}
	return v
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
