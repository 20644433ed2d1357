package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/support"
)

const supportUsage = `usage: munchable-webhooks support COMMAND [flags] ARGS

Reads the support queue (support_messages in DATABASE_URL, which is all it
needs); never writes.

commands:
  list [--since D] [--source email|web] [--state S[,S...]]
             one JSON line per message queued within D, oldest first: id, source,
             received, from, subject, thread, and its forward to the team (state
             pending, delivered, failed, dead, skipped; off: forwarding is off;
             not_yet: not reached yet); the count on stderr
  show ID    the whole message as the team reads it: headers, the sender's DMARC
             verdict, the thread, the forward's delivery, attachment names and
             sizes, then the text
  show ID --html             the HTML body as stored (untrusted: save it, do not open it)
  show ID --attachment NAME  the named attachment's bytes (support show 7 --attachment a.pdf > a.pdf)`

func supportCommand(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	top := newCommand("support", supportUsage, stdout, stderr)
	if len(args) == 0 {
		return top.misuse("want a command")
	}
	cmd := newCommand("support "+args[0], supportUsage, stdout, stderr)
	switch args[0] {
	case "help", "-h", "-help", "--help":
		top.printUsage(stdout)
		return flag.ErrHelp
	case "list":
		since := cmd.flags.Duration("since", 168*time.Hour, "only messages queued within this long: a `DURATION` such as 24h or 720h")
		source := cmd.flags.String("source", "", "only messages from this source: email or web")
		states := cmd.flags.String("state", "", "only messages whose forward is in one of these comma-separated states")
		if _, err := cmd.parse(args[1:], 0); err != nil {
			return err
		}
		if *since <= 0 {
			return cmd.misuse("--since %s: want a positive duration such as 24h or 720h", *since)
		}
		q := support.ListQuery{Since: time.Now().Add(-*since), Source: *source}
		if *source != "" && *source != support.SourceEmail && *source != support.SourceWeb {
			return cmd.misuse("--source %q: want email or web", *source)
		}
		for s := range strings.SplitSeq(*states, ",") {
			if s == "" {
				continue
			}
			if !slices.Contains(support.ForwardStates, support.ForwardState(s)) {
				return cmd.misuse("--state %q: want pending, delivered, failed, dead, skipped, off or not_yet", s)
			}
			q.States = append(q.States, support.ForwardState(s))
		}
		return listSupport(ctx, environ, q, stdout, stderr)
	case "show":
		html := cmd.flags.Bool("html", false, "print the HTML body instead")
		attachment := cmd.flags.String("attachment", "", "write the bytes of the attachment with this file `NAME` to stdout instead")
		pos, err := cmd.parse(args[1:], 1)
		if err != nil {
			return err
		}
		id, err := strconv.ParseInt(pos[0], 10, 64)
		if err != nil || id <= 0 {
			return cmd.misuse("ID %q: want a message's id, as support list prints it", pos[0])
		}
		if *html && *attachment != "" {
			return cmd.misuse("--html and --attachment: want one of them")
		}
		return showSupport(ctx, environ, id, *html, *attachment, stdout)
	}
	return top.misuse("unknown command %q", args[0])
}

// openDatabaseOnly opens a small pool on DATABASE_URL, the one variable
// the support commands read.
func openDatabaseOnly(ctx context.Context, environ []string) (*pgxpool.Pool, error) {
	cfg, err := parseEnv[changesConfig](environ)
	if err != nil {
		return nil, err
	}
	return openPostgres(ctx, string(cfg.DatabaseURL), 2)
}

func listSupport(ctx context.Context, environ []string, q support.ListQuery, stdout, stderr io.Writer) error {
	pool, err := openDatabaseOnly(ctx, environ)
	if err != nil {
		return err
	}
	defer pool.Close()
	enc, n := jsonLines(stdout), 0
	err = support.List(ctx, pool, q, func(l support.Listed) error {
		n++
		return enc.Encode(l)
	})
	// On stderr, so that stdout stays one JSON object a line.
	if err == nil {
		fmt.Fprintf(stderr, "%d support messages\n", n)
	}
	return err
}

func showSupport(ctx context.Context, environ []string, id int64, html bool, attachment string, stdout io.Writer) error {
	pool, err := openDatabaseOnly(ctx, environ)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch {
	case html:
		body, err := support.HTML(ctx, pool, id)
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, body)
		return err
	case attachment != "":
		b, err := support.AttachmentContent(ctx, pool, id, attachment)
		if err != nil {
			return err
		}
		_, err = stdout.Write(b)
		return err
	}
	m, err := support.Show(ctx, pool, id)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, formatMessage(m))
	return err
}
