// Command bench is the load harness behind `make bench`. From a clean clone
// (Go, postgres, pgbench and redis-server installed, nothing running) it
// starts throwaway Postgres and Redis, builds and starts the service and
// two ceiling servers, drives them with pre-signed Stripe events, runs
// pgbench on the service's own upsert, and writes the measured tables to
// docs/bench-latest.md. docs/PERFORMANCE.md explains them. With -scale N
// it measures instead how the costs grow with the tables (scale.go). It runs from the
// module's root, as `go run ./tools/bench` does.
//
// Run as `bench ceiling chi|intake ADDR` it is a ceiling server.
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
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the harness's flags.
type options struct {
	out               string
	duration, warmup  time.Duration
	concurrency, rate int
	rounds            int
	goBin, serviceEnv string
	against           string
	durable           bool
	scale             int
	appWebhook        bool
}

// postgres says how the harness's Postgres is set up, for the reports.
func (o options) postgres() string {
	if o.durable {
		return "Postgres durable (fsync, synchronous_commit and full_page_writes on)"
	}
	return "Postgres as internal/dbtest starts it (fsync, synchronous_commit and full_page_writes off)"
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "ceiling" {
		return serveCeiling(args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.out, "out", "docs/bench-latest.md", "file to write the tables to (- for stdout)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each run")
	fs.IntVar(&o.concurrency, "concurrency", 32, "requests in flight in saturation runs; also pgbench's connections")
	fs.IntVar(&o.rate, "rate", 1000, "requests a second in fixed-rate runs")
	fs.IntVar(&o.rounds, "rounds", 2, "runs are split into this many interleaved rounds")
	fs.StringVar(&o.goBin, "go", "go", "go command, to build the service")
	fs.StringVar(&o.serviceEnv, "service-env", "", "extra environment for the service, comma-separated KEY=VALUE (e.g. GOGC=200)")
	fs.BoolVar(&o.durable, "durable", false, "run Postgres with its own durability (fsync, synchronous_commit and full_page_writes on)\nas production does, instead of dbtest's fast settings")
	fs.IntVar(&o.scale, "scale", 0, "instead, grow the tables to 0, N/10 and N subscriptions and measure each size:\ndeliveries, access lookups, feed pages, retention of 0.9 N expired rows, disk per row (make bench-scale)")
	fs.StringVar(&o.against, "against", "", "instead, compare first deliveries with the build of the module in this directory\n(a git worktree of the commit before a change), in alternating rounds")
	fs.BoolVar(&o.appWebhook, "app-webhook", false, "with -against (default: this module), the compared build sends the app's webhook for every change\nto examples/appreceiver, started at nice 19 as a stand-in for the app's own machine")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if o.rounds < 1 || o.duration/time.Duration(o.rounds) < time.Second {
		return fmt.Errorf("-rounds %d: each round's slice of -duration %s must be at least 1s (pgbench counts whole seconds)", o.rounds, o.duration)
	}
	if o.appWebhook && o.against == "" {
		o.against = "."
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	h := &harness{o: o, log: stderr, started: time.Now()}
	defer h.close()
	if o.scale > 0 {
		r, err := h.scale(ctx)
		if err != nil {
			return err
		}
		return h.write(r, stdout)
	}
	if o.against != "" {
		c, err := h.compare(ctx)
		if err != nil {
			return err
		}
		return h.write(c, stdout)
	}
	rep, err := h.measure(ctx)
	if err != nil {
		return err
	}
	return h.write(rep, stdout)
}
