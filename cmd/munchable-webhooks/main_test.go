package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/migrations"
)

// TestMain lets a test run this test binary as the program itself, to see
// main's exit status: MUNCHABLE_RUN_MAIN=1 makes it call main instead of
// the tests, which get throwaway Postgres and Redis servers when
// TEST_DATABASE_URL or TEST_REDIS_URL is unset (dbtest.Run).
func TestMain(m *testing.M) {
	if os.Getenv("MUNCHABLE_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(dbtest.Run(m))
}

// nowhere is an environment in which every command that acts fails at once:
// no server listens on these addresses. A help request that returns nil in
// it has done nothing but print.
func nowhere(t *testing.T) []string {
	t.Helper()
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := validEnv()
	env["DATABASE_URL"] = "postgres://app@127.0.0.1:" + strconv.Itoa(port) + "/app?connect_timeout=1"
	env["REDIS_URL"] = "redis://127.0.0.1:" + strconv.Itoa(port)
	env["LISTEN_ADDR"] = "127.0.0.1:" + strconv.Itoa(port)
	return environ(env)
}

func TestHelpNeverActs(t *testing.T) {
	t.Parallel()
	env := nowhere(t)
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"},
		{"serve", "-h"}, {"serve", "--help"},
		{"migrate", "-h"}, {"migrate", "--help"},
		{"version", "--help"},
		{"healthcheck", "-h"}, {"healthcheck", "--help"},
		{"send", "-h"}, {"send", "--help"}, {"send", "-n", "3", "--help", "missing.json"},
		{"claims", "-h"}, {"claims", "help"},
		{"claims", "show", "-h"}, {"claims", "show", "stripe", "evt_1", "--help"},
		{"claims", "release", "-h"}, {"claims", "done", "--help"}, {"claims", "stuck", "-h"},
		{"stripe", "-h"}, {"stripe", "sync", "-h"}, {"stripe", "replay", "--help"},
	} {
		if err := wantUsage(t, env, args, "stdout"); err != nil {
			t.Errorf("%q: err = %v, want nil (help acted?)", args, err)
		}
	}
}

// Each command's help names its own flags.
func TestHelpListsFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "-h"}, "-concurrency C"},
		{[]string{"claims", "release", "-h"}, "-force"},
		{[]string{"claims", "stuck", "-h"}, "-older-than"},
		{[]string{"send", "-h"}, "other than 2xx"},
	} {
		var stdout bytes.Buffer
		if err := run(t.Context(), append([]string{"munchable-webhooks"}, tt.args...), nil, &stdout, &stdout); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stdout.String(), tt.want) {
			t.Errorf("%q: usage lacks %q:\n%s", tt.args, tt.want, &stdout)
		}
	}
}

// A subcommand's -h is its own usage, not its parent's, and describes each
// of its flags.
func TestSubcommandHelpIsItsOwn(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"claims", "show"}, {"claims", "release"}, {"claims", "done"}, {"claims", "stuck"},
		{"stripe", "sync"}, {"stripe", "replay"}, {"send"},
		{"events", "show"}, {"events", "list"}, {"events", "retry"},
	} {
		for _, h := range []string{"-h", "--help"} {
			var stdout bytes.Buffer
			if err := run(t.Context(), append(append([]string{"munchable-webhooks"}, args...), h), nil, &stdout, &stdout); err != nil {
				t.Fatalf("%q %s: %v", args, h, err)
			}
			out := stdout.String()
			if want := "usage: munchable-webhooks " + strings.Join(args, " "); !strings.HasPrefix(out, want) {
				t.Errorf("%q %s: usage begins %.60q, want %q", args, h, out, want)
			}
			if strings.Contains(out, "commands:") {
				t.Errorf("%q %s: prints the parent's list of commands:\n%s", args, h, out)
			}
			// flag.PrintDefaults writes a description on the flag's line or
			// the next, after a tab; an empty one leaves the tab alone.
			if strings.Contains(out, "\t\n") || strings.HasSuffix(out, "\t") {
				t.Errorf("%q %s: a flag without a description:\n%s", args, h, out)
			}
		}
	}
}

func TestBadCommandLine(t *testing.T) {
	t.Parallel()
	env := nowhere(t)
	for _, args := range [][]string{
		{"frobnicate"}, {"--bogus"},
		{"serve", "--bogus"}, {"serve", "extra"}, {"migrate", "-x"}, {"version", "now"}, {"healthcheck", "-v"},
		{"send", "-bogus", "f.json"}, {"send"}, {"send", "-n", "0", "f.json"},
		{"claims"}, {"claims", "purge"}, {"claims", "show", "stripe"}, {"claims", "show", "-force", "stripe", "evt_1"},
		{"claims", "show", "paypal", "evt_1"}, {"claims", "stuck", "-older-than", "soon"},
	} {
		if err := wantUsage(t, env, args, "stderr"); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

// wantUsage runs the program with args and checks that it printed the
// usage on stream ("stdout" or "stderr") and nothing on the other.
func wantUsage(t *testing.T, env, args []string, stream string) error {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), append([]string{"munchable-webhooks"}, args...), env, &stdout, &stderr)
	used, other := &stdout, &stderr
	if stream == "stderr" {
		used, other = other, used
	}
	if !strings.HasPrefix(used.String(), "usage: munchable-webhooks") {
		t.Errorf("%q: %s = %q, want the usage", args, stream, used.String())
	}
	if other.Len() > 0 {
		t.Errorf("%q: the other stream = %q, want nothing", args, other.String())
	}
	return err
}

// Flags may follow arguments; after "--" everything is an argument.
func TestCommandParse(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"a", "-force", "b"}, []string{"a", "b"}},
		{[]string{"-force", "a", "--", "-h", "b"}, []string{"a", "-h", "b"}},
		{[]string{"--", "-x"}, []string{"-x"}},
	} {
		var out bytes.Buffer
		cmd := newCommand("test", "usage: munchable-webhooks test", &out, &out)
		force := cmd.flags.Bool("force", false, "")
		got, err := cmd.parse(tt.args, -1)
		if err != nil || !*force && tt.args[0] == "-force" || strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("parse(%q) = %q, %v (force %v); want %q", tt.args, got, err, *force, tt.want)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stdout bytes.Buffer
		if err := run(t.Context(), append([]string{"munchable-webhooks"}, args...), nil, &stdout, &stdout); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("version: %s\ncommit: %s\nschema: %d\n", version, buildCommit(), migrations.Version())
		if got := stdout.String(); got != want {
			t.Errorf("%q printed %q, want %q", args, got, want)
		}
	}
	// version -h's example names this build's schema, not an old one.
	if want := fmt.Sprintf("schema: %d`", migrations.Version()); !strings.HasSuffix(versionUsage+"`", want) {
		t.Errorf("version -h's example ends %q, want %q", versionUsage[len(versionUsage)-10:], strings.TrimSuffix(want, "`"))
	}
}

// main's exit status: 0 for help, 2 for a wrong command line, 1 for a
// command that ran and failed.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := append(nowhere(t), "MUNCHABLE_RUN_MAIN=1")
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"migrate", "--help"}, 0},
		{[]string{"migrate", "--bogus"}, 2},
		{[]string{"frobnicate"}, 2},
		{[]string{"migrate"}, 1}, // nothing listens on DATABASE_URL
	} {
		cmd := exec.CommandContext(t.Context(), self, tt.args...)
		cmd.Env = env
		err := cmd.Run()
		got := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			got = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if got != tt.want {
			t.Errorf("%q exited %d, want %d", tt.args, got, tt.want)
		}
	}
}

// A DATABASE_URL that does not parse is refused with the form it should
// take, by migrate as by serve, and without echoing its secret.
func TestMigrateBadDatabaseURL(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := []string{"DATABASE_URL=postgres://user:hunter2@[::1:5432/db"}
	err := run(t.Context(), []string{"munchable-webhooks", "migrate"}, env, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is invalid: want postgres://") {
		t.Fatalf("migrate with a bad DATABASE_URL: err = %v, want one naming the form", err)
	}
	if strings.Contains(err.Error()+out.String(), "hunter2") {
		t.Errorf("the refusal echoes the URL's password: %v %s", err, out.String())
	}
}
