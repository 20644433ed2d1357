package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

const changesUsage = `usage: munchable-webhooks changes tail [--after CURSOR] [--follow]

Prints the change feed (changes in DATABASE_URL) as JSON lines on stdout, in
the order a consumer must handle them, each with the cursor that resumes
just after it. A change whose transaction commits late is never skipped:
the feed is read only as far as no running transaction can still add to
it (docs/APP.md). When it stops (all read, or with --follow on SIGINT or
SIGTERM), the cursor to resume from is the last line on stderr:

  cursor c2.742.0

Without --after it starts at the oldest change kept (EVENTS_RETENTION).
A cursor older than that (retention deleted changes it had not read) is
refused, exit 4: reading on would skip them silently; start again without
--after, and reconcile what was missed from the tables themselves.
--follow keeps reading as changes commit: LISTEN munchable_changes rings it,
and it polls every second for what no notification announces.`

// changesPoll is how often tail --follow reads without a notification:
// one can be missed (see ledger.Tail), and with no replica of the service
// running none rings.
const changesPoll = time.Second

type changesConfig struct {
	DatabaseURL secret `env:"DATABASE_URL"`
}

func (c *changesConfig) validate() []error {
	if strings.TrimSpace(string(c.DatabaseURL)) == "" {
		return []error{errors.New("DATABASE_URL is required: " + wantDatabaseURL)}
	}
	return nil
}

func changes(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	top := newCommand("changes", changesUsage, stdout, stderr)
	if len(args) == 0 {
		return top.misuse("want a command")
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		top.printUsage(stdout)
		return flag.ErrHelp
	case "tail":
	default:
		return top.misuse("unknown command %q", args[0])
	}
	cmd := newCommand("changes tail", changesUsage, stdout, stderr)
	after := cmd.flags.String("after", "", "resume after this cursor (printed by an earlier tail)")
	follow := cmd.flags.Bool("follow", false, "keep reading as changes commit, until SIGINT or SIGTERM")
	if _, err := cmd.parse(args[1:], 0); err != nil {
		return err
	}
	cursor, err := ledger.ParseCursor(*after)
	if err != nil {
		return cmd.misuse("--after: %v: want the \"cursor\" of a line that changes tail or events show printed, not a change id", err)
	}
	cfg, err := parseEnv[changesConfig](environ)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := ledger.CheckCursor(ctx, pool, cursor); err != nil {
		return err
	}
	enc := jsonLines(stdout)
	cursor, err = ledger.New(pool, 0).Tail(ctx, cursor, *follow, changesPoll, func(c ledger.Change) error {
		return enc.Encode(c)
	})
	fmt.Fprintf(stderr, "cursor %s\n", cursor)
	return err
}
