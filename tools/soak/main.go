// Command soak plays Stripe and Resend against munchable-webhooks while a
// chaos loop kills and restarts Redis, Postgres and the service, then holds
// the database against a model of what the events must have left: nothing
// lost, nothing regressed, nothing duplicated.
//
//	go run ./tools/soak                 # 20,000 events (make soak)
//	go run ./tools/soak -events 3000    # a short one
//
// It starts everything it needs on free ports and removes it at the end: a
// redis-server, a Postgres cluster (dbtest's throwaway servers), a fake
// Resend API, and the service built from ./cmd/munchable-webhooks and run as
// a child process. It exits 1 when the database disagrees with the model.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// config is one soak's shape.
type config struct {
	Events      int           // distinct events: subscription events and inbound mails
	Subs        int           // subscriptions the Stripe events are spread over
	MailShare   float64       // share of the events that are inbound mails
	Redeliver   float64       // share of the deliveries sent again
	OutOfOrder  float64       // share of the deliveries moved later
	Concurrency int           // deliveries in flight at once
	Rate        float64       // first attempts a second; 0: as fast as the workers go
	Chaos       time.Duration // mean pause between two faults of one component; 0: no chaos
	Seed        int64
	Timeout     time.Duration // after it no retry is scheduled; the rest count as undelivered
	Bin         string        // the service binary; "": build ./cmd/munchable-webhooks
	Keep        bool          // keep the work directory (logs) after the run
}

func defaultConfig() config {
	return config{
		Events:      20000,
		Subs:        300,
		MailShare:   0.25,
		Redeliver:   0.30,
		OutOfOrder:  0.10,
		Concurrency: 32,
		Rate:        300,
		Chaos:       3 * time.Second,
		Seed:        1,
		Timeout:     10 * time.Minute,
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Events, "events", cfg.Events, "distinct events to send (subscription events and inbound mails)")
	fs.IntVar(&cfg.Subs, "subs", cfg.Subs, "subscriptions the Stripe events are spread over")
	fs.Float64Var(&cfg.MailShare, "mail-share", cfg.MailShare, "share of the events that are inbound mails")
	fs.Float64Var(&cfg.Redeliver, "redeliver", cfg.Redeliver, "share of the deliveries sent again")
	fs.Float64Var(&cfg.OutOfOrder, "out-of-order", cfg.OutOfOrder, "share of the deliveries moved later")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "deliveries in flight at once")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "first attempts a second (0: as fast as possible)")
	fs.DurationVar(&cfg.Chaos, "chaos", cfg.Chaos, "mean pause between two faults of one component (0: no chaos)")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the workload and the chaos")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "give up retrying after this long")
	fs.StringVar(&cfg.Bin, "bin", cfg.Bin, "service binary to run (default: build ./cmd/munchable-webhooks)")
	fs.BoolVar(&cfg.Keep, "keep", cfg.Keep, "keep the work directory with the service's log")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.Events < 2 || cfg.Subs < 1 || cfg.Concurrency < 1 || cfg.MailShare < 0 || cfg.MailShare > 1 {
		return errors.New("want -events >= 2, -subs >= 1, -concurrency >= 1, 0 <= -mail-share <= 1")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := soak(ctx, cfg, stdout)
	if rep != nil {
		rep.print(stdout)
	}
	if err != nil {
		return err
	}
	if !rep.ok() {
		return errors.New("the database disagrees with the model")
	}
	return nil
}
