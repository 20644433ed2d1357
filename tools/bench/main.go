// Command bench is the load harness behind `make bench`. From a clean clone
// (Go, postgres and redis-server installed, nothing running) it starts
// throwaway Postgres and Redis, builds and starts the service binary and two
// ceiling servers, drives them with pre-generated signed Stripe events, runs
// pgbench and redis-benchmark on the service's own upsert and claim script,
// runs the Go benchmarks, repeats the first-delivery runs on a durable
// Postgres, and writes docs/PERFORMANCE.md.
//
//	go run ./tools/bench [-out docs/PERFORMANCE.md] [-duration 10s] ...
//
// Run as `bench ceiling -mode chi|verify -addr ...` it is one of the ceiling
// servers (the harness starts them so).
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
	rate        int
	rounds      int
	goBin       string
	benchtime   string
	profile     string
	poolSizes   string
	durable     bool
	serviceEnv  string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "ceiling" {
		return serveCeiling(ctx, args[1:], stderr)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.out, "out", "docs/PERFORMANCE.md", "report to write, relative to the module root (- for stdout)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured run")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each run")
	fs.IntVar(&o.concurrency, "concurrency", 32, "requests in flight in saturation runs; also pgbench and redis-benchmark clients")
	fs.IntVar(&o.rate, "rate", 1000, "requests a second in fixed-rate runs")
	fs.IntVar(&o.rounds, "rounds", 2, "saturation runs are split into this many interleaved rounds")
	fs.StringVar(&o.goBin, "go", "go", "go command, to build the service and run the Go benchmarks")
	fs.StringVar(&o.benchtime, "benchtime", "500ms", "go test -benchtime for the Go benchmarks; empty skips them")
	fs.StringVar(&o.profile, "profile", "auto", "perf profile of first deliveries: auto (when a target is missed), always, never")
	fs.StringVar(&o.poolSizes, "pool-sizes", "", "also run first deliveries at saturation with these DATABASE_MAX_CONNS, e.g. 8,16,32")
	fs.BoolVar(&o.durable, "durable", true, "repeat the first-delivery runs on Postgres with fsync and synchronous_commit on")
	fs.StringVar(&o.serviceEnv, "service-env", "", "extra environment for the service, comma-separated KEY=VALUE (e.g. LOG_LEVEL=info,GOGC=200)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.profile != "auto" && o.profile != "always" && o.profile != "never" {
		return fmt.Errorf("-profile %q: want auto, always or never", o.profile)
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
