// Command bench is the load harness behind `make bench`. From a clean clone
// (Go, postgres, pgbench, redis-server and redis-benchmark installed,
// nothing running) it starts throwaway Postgres and Redis, builds and
// starts the service and two ceiling servers, drives them with pre-signed
// Stripe events, runs pgbench and redis-benchmark on the service's own
// upsert and claim script and the Go benchmarks, repeats first deliveries
// on a durable Postgres, and writes the measured tables to
// docs/bench-latest.md. docs/PERFORMANCE.md explains them.
//
// Run as `bench ceiling -mode chi|intake -addr ...` it is a ceiling server.
package main

import (
	"context"
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
	out         string
	duration    time.Duration
	warmup      time.Duration
	concurrency int
	rssConc     int
	rate        int
	rounds      int
	goBin       string
	benchtime   string
	durable     bool
	serviceEnv  string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "ceiling" {
		return serveCeiling(ctx, args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.out, "out", "docs/bench-latest.md", "tables to write, relative to the module root (- for stdout)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each run")
	fs.IntVar(&o.concurrency, "concurrency", 32, "requests in flight in saturation runs; also pgbench and redis-benchmark clients")
	fs.IntVar(&o.rssConc, "rss-concurrency", 64, "duplicates in flight in the run after which peak RSS is read")
	fs.IntVar(&o.rate, "rate", 1000, "requests a second in fixed-rate runs")
	fs.IntVar(&o.rounds, "rounds", 2, "runs are split into this many interleaved rounds")
	fs.StringVar(&o.goBin, "go", "go", "go command, to build the service and run the Go benchmarks")
	fs.StringVar(&o.benchtime, "benchtime", "500ms", "go test -benchtime for the Go benchmarks; empty skips them")
	fs.BoolVar(&o.durable, "durable", true, "repeat first deliveries on Postgres with fsync and synchronous_commit on")
	fs.StringVar(&o.serviceEnv, "service-env", "", "extra environment for the service, comma-separated KEY=VALUE (e.g. GOGC=200)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.rounds < 1 || o.duration/time.Duration(o.rounds) < time.Second {
		return fmt.Errorf("-rounds %d: each round's slice of -duration %s must be at least 1s (pgbench counts whole seconds)", o.rounds, o.duration)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	h, err := newHarness(o, stderr)
	if err != nil {
		return err
	}
	defer h.close()
	rep, err := h.measure(ctx)
	if err != nil {
		return err
	}
	return h.write(rep, stdout)
}
