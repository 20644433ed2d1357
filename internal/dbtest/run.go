package dbtest

import (
	"errors"
	"fmt"
	"os"
	"testing"
)

// installHint is what a test that cannot get a server tells the reader to
// run: the script installs the server binaries (as root with apt, else it
// prints the command), and make test runs everything with them.
const installHint = "scripts/ensure-deps test installs them; make test runs every test"

// Run runs a package's tests with TEST_DATABASE_URL and TEST_REDIS_URL set,
// starting a throwaway Postgres or redis-server for each one unset, once
// for the whole test binary, and stopping it when the tests end. So
// `go test ./internal/relay/` with nothing set runs every test, and under
// make test, which sets both, nothing is started twice. Every package whose
// tests call NewDatabase, NewPool, Redis or RedisURL calls it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(dbtest.Run(m)) }
//
// A server that cannot be started is reported here, and each test that
// needs it fails (never skips), naming the command that installs it.
func Run(m *testing.M) int {
	var stops []func() error
	for _, s := range []struct {
		env   string
		start func() (url string, stop func() error, err error)
	}{
		{DatabaseURLEnv, startThrowawayPostgres},
		{RedisURLEnv, startThrowawayRedis},
	} {
		if os.Getenv(s.env) != "" {
			continue
		}
		url, stop, err := s.start()
		if err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: %s not set and no throwaway server for it: %v\n", s.env, err)
			continue
		}
		stops = append(stops, stop)
		// Read by envURL in the tests; set before m.Run, so before any
		// test's goroutine reads the environment.
		if err := os.Setenv(s.env, url); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: set %s: %v\n", s.env, err)
		}
	}
	code := m.Run()
	for _, stop := range stops {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// startThrowawayPostgres starts a Postgres in a new temporary directory
// (not one under the test's: under root the postgres user must reach it)
// and returns its URL and the func that stops it and removes the directory.
func startThrowawayPostgres() (string, func() error, error) {
	dir, err := os.MkdirTemp("", "dbtest-postgres-")
	if err != nil {
		return "", nil, err
	}
	s, err := LaunchPostgres(dir)
	if err != nil {
		return "", nil, errors.Join(err, os.RemoveAll(dir))
	}
	return s.URL(), func() error { return errors.Join(s.Stop(), os.RemoveAll(dir)) }, nil
}

// startThrowawayRedis is startThrowawayPostgres for redis-server.
func startThrowawayRedis() (string, func() error, error) {
	dir, err := os.MkdirTemp("", "dbtest-redis-")
	if err != nil {
		return "", nil, err
	}
	var s *RedisServer
	err = onFreePort(func(port int) error {
		s, err = LaunchRedis(dir, port)
		return err
	})
	if err != nil {
		return "", nil, errors.Join(err, os.RemoveAll(dir))
	}
	return s.URL(), func() error { return errors.Join(s.Stop(), os.RemoveAll(dir)) }, nil
}

// envURL returns the value of the environment variable name, or fails the
// test: with Run in the package's TestMain it is set unless the server
// could not be started.
func envURL(t testing.TB, name string) string {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	t.Fatalf("%s not set and no throwaway server was started for it (see the message above the tests, "+
		"or call dbtest.Run from this package's TestMain): %s", name, installHint)
	return ""
}

// missingServer fails the test for a server binary that is not installed.
// It never skips: a test that did not run must not read as passed.
func missingServer(t testing.TB, msg string) {
	t.Helper()
	t.Fatalf("%s: %s", msg, installHint)
}
