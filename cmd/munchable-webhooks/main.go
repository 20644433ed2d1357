// Command munchable-webhooks receives Stripe and Resend webhooks and applies
// each event's effect once: entitlements from Stripe subscription events,
// support-queue messages from inbound mail and the site's support form.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/migrations"
)

// version is set at build time: -ldflags "-X main.version=...". commit
// too where the build has no git checkout to read it from (the image's
// build context leaves .git out): -ldflags "-X main.commit=...".
var (
	version = "dev"
	commit  = ""
)

func main() {
	// go-redis's lines are warnings: a pool or dial problem it works around.
	redis.SetLogger(claim.NewRedisLogger(newLogger(os.Stderr, slog.LevelWarn), claim.UsableLogEvery))
	err := run(context.Background(), os.Args, os.Environ(), os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	case errors.Is(err, errDrift):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	case errors.Is(err, ledger.ErrCursorExpired):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(4)
	default:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

const usage = `usage: munchable-webhooks [COMMAND] [-h]

commands:
  serve        apply pending migrations, then serve HTTP until SIGTERM/SIGINT (default)
  migrate      apply pending migrations and exit
  version      print the version, the commit and the schema version it expects (also: --version)
  send         sign a sample event and post it to the service
  claims       show, release, mark done or list stuck claims in Redis
  healthcheck  exit 0 when the service on LISTEN_ADDR answers /healthz
  stripe       sync, replay or verify Stripe's state through its API
  events       show, list or retry the events in the ledger
  changes      tail the change feed as JSON lines
  relay        list or retry the relay's deliveries (forwards to the team, webhooks to the app)
  support      list or read the support queue's messages and their forwards

Every command answers -h with its own usage. Configuration comes from the
environment; see README.md. Exit status: 0 done, 1 failed, 2 bad command line, 3 stripe verify found drift,
4 changes tail --after was given a cursor older than the oldest change kept.`

const (
	serveUsage = `usage: munchable-webhooks serve

Applies pending migrations, then serves HTTP on LISTEN_ADDR until SIGTERM or
SIGINT. Configuration comes from the environment; see README.md.`

	migrateUsage = `usage: munchable-webhooks migrate

Applies pending migrations to DATABASE_URL and exits.`

	versionUsage = `usage: munchable-webhooks version

Prints the build's version, its commit and the schema version it expects
(its highest migration), one per line:

  version: v0.5.0
  commit: 0123abc...
  schema: 21`

	healthcheckUsage = `usage: munchable-webhooks healthcheck

Exits 0 when the service on LISTEN_ADDR answers GET /healthz with 200, 1
otherwise: the container's health check (the image has no shell or curl).`
)

// run is the whole program, with its surroundings passed in so that tests
// can run it in-process. A -h anywhere it is accepted prints usage to
// stdout and returns nil; a wrong command line returns an error wrapping
// errUsage after printing usage to stderr.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, environ, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func dispatch(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	name, rest := "serve", []string(nil)
	if len(args) > 1 {
		name, rest = args[1], args[2:]
	}
	switch name {
	case "help", "-h", "-help", "--help":
		fmt.Fprintln(stdout, usage)
		return flag.ErrHelp
	case "--version", "-version":
		return printVersion(stdout)
	case "send":
		return send(ctx, rest, environ, stdout, stderr)
	case "claims":
		return claims(ctx, rest, environ, stdout, stderr)
	case "stripe":
		return stripeCommand(ctx, rest, environ, stdout, stderr)
	case "events":
		return events(ctx, rest, environ, stdout, stderr)
	case "changes":
		return changes(ctx, rest, environ, stdout, stderr)
	case "relay":
		return relayCommand(ctx, rest, environ, stdout, stderr)
	case "support":
		return supportCommand(ctx, rest, environ, stdout, stderr)
	}
	// The commands without flags or arguments of their own.
	commands := map[string]struct {
		usage string
		do    func() error
	}{
		"serve":       {serveUsage, func() error { return serve(ctx, environ, stdout) }},
		"migrate":     {migrateUsage, func() error { return migrate(ctx, environ, stdout) }},
		"version":     {versionUsage, func() error { return printVersion(stdout) }},
		"healthcheck": {healthcheckUsage, func() error { return healthcheck(ctx, environ, stdout) }},
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("%w: unknown command %q", errUsage, name)
	}
	cmd := newCommand(name, c.usage, stdout, stderr)
	if _, err := cmd.parse(rest, 0); err != nil {
		return err
	}
	return c.do()
}

// printVersion prints what an operator compares across releases: which
// build this is, and which schema it runs on (docs/OPERATIONS.md,
// "Upgrades and rollbacks").
func printVersion(w io.Writer) error {
	_, err := fmt.Fprintf(w, "version: %s\ncommit: %s\nschema: %d\n", version, buildCommit(), migrations.Version())
	return err
}

// buildCommit is the commit set at build time, else the one go build
// stamped from the git checkout it ran in ("-dirty" when the tree had
// changes), else "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && rev != "unknown" {
		rev += "-dirty"
	}
	return rev
}

// errUsage marks a wrong command line: main exits 2 on it, as flag-based
// tools do, so a script can tell "you called me wrong" from "it failed".
var errUsage = errors.New("bad command line")

// command is one (sub)command's usage text and flags. Every command parses
// through it, so -h never acts: it prints usage to stdout and parse returns
// flag.ErrHelp, which run turns into exit 0; an unknown flag or a wrong
// number of arguments prints usage to stderr and returns errUsage.
type command struct {
	name   string
	usage  string
	flags  *flag.FlagSet
	stdout io.Writer
	stderr io.Writer
}

func newCommand(name, usage string, stdout, stderr io.Writer) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// parse prints usage itself, to the stream the case calls for.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &command{name: name, usage: usage, flags: fs, stdout: stdout, stderr: stderr}
}

// parse parses flags wherever they stand ("release stripe evt_1 -force" as
// well as "release -force stripe evt_1"), up to a "--", and returns the
// other arguments, which must number want (-1: any number).
func (c *command) parse(args []string, want int) ([]string, error) {
	var pos []string
	for {
		err := c.flags.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			c.printUsage(c.stdout)
			return nil, flag.ErrHelp
		}
		if err != nil {
			return nil, c.misuse("%v", err)
		}
		if c.flags.NArg() == 0 {
			break
		}
		if n := len(args) - c.flags.NArg(); n > 0 && args[n-1] == "--" {
			pos = append(pos, c.flags.Args()...) // all after "--" are arguments
			break
		}
		pos = append(pos, c.flags.Arg(0))
		args = c.flags.Args()[1:]
	}
	if want >= 0 && len(pos) != want {
		return nil, c.misuse("want %d arguments, got %d", want, len(pos))
	}
	return pos, nil
}

// misuse prints usage to stderr and returns an error wrapping errUsage.
func (c *command) misuse(format string, args ...any) error {
	c.printUsage(c.stderr)
	return fmt.Errorf("%w: %s: %s", errUsage, c.name, fmt.Sprintf(format, args...))
}

func (c *command) printUsage(w io.Writer) {
	fmt.Fprintln(w, c.usage)
	var b strings.Builder
	c.flags.SetOutput(&b)
	c.flags.PrintDefaults()
	c.flags.SetOutput(io.Discard)
	if b.Len() > 0 {
		fmt.Fprintf(w, "\nflags:\n%s", b.String())
	}
}

// providerEvent reads the PROVIDER ID arguments of the claims and events
// commands.
func (c *command) providerEvent(pos []string) (provider, eventID string, err error) {
	provider, eventID = pos[0], pos[1]
	if provider != "stripe" && provider != "resend" {
		return "", "", c.misuse("provider %q: want stripe or resend", provider)
	}
	return provider, eventID, nil
}
