package dbtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRunWithNothingSet runs this package's TestNewPool and TestRedis again
// in a test binary of their own with neither variable set, as
// `go test ./internal/...` on a fresh clone does: Run must start the
// servers, so both pass. With the Postgres binaries out of reach, the
// Postgres test must fail naming the command to run, and never skip.
func TestRunWithNothingSet(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, extraEnv ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run", "^(TestNewPool|TestRedis)$", "-test.v", "-test.count=1")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, DatabaseURLEnv+"=") && !strings.HasPrefix(kv, RedisURLEnv+"=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, extraEnv...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("servers start", func(t *testing.T) {
		t.Parallel()
		out, err := run(t)
		if err != nil {
			t.Fatalf("test binary with nothing set: %v\n%s", err, out)
		}
		for _, want := range []string{"--- PASS: TestNewPool", "--- PASS: TestRedis"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "--- SKIP") {
			t.Errorf("a test skipped:\n%s", out)
		}
	})

	t.Run("no postgres", func(t *testing.T) {
		t.Parallel()
		out, err := run(t, "PG_BIN="+t.TempDir())
		if err == nil {
			t.Fatalf("test binary without Postgres passed:\n%s", out)
		}
		for _, want := range []string{"--- FAIL: TestNewPool", installHint, "--- PASS: TestRedis"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "--- SKIP") {
			t.Errorf("a test skipped:\n%s", out)
		}
	})
}
