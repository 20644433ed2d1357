// Command munchable-webhooks receives Stripe and Resend webhooks and applies
// each event's effect once: entitlements from Stripe subscription events,
// support-queue messages from inbound mail and the site's support form.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := run(context.Background(), os.Args, os.Environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, errStripeUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

const usage = `usage: munchable-webhooks [command]

commands:
  serve        apply pending migrations, then serve HTTP until SIGTERM/SIGINT (default)
  migrate      apply pending migrations and exit
  version      print the build version
  send         sign a sample event and post it to the service (send -h)
  claims       show, release, mark done or list stuck claims in Redis (claims help)
  healthcheck  exit 0 when the service on LISTEN_ADDR answers /healthz
  stripe       sync or replay Stripe's state through its API (stripe -h)

Configuration comes from the environment; see README.md.`

// run is the whole program, with its surroundings passed in so that tests
// can run it in-process.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 1 {
		cmd = args[1]
	}
	switch cmd {
	case "serve":
		return serve(ctx, environ, stdout)
	case "migrate":
		return migrate(ctx, environ, stdout)
	case "version":
		fmt.Fprintln(stdout, version)
		return nil
	case "send":
		return send(ctx, args[2:], environ, stdout, stderr)
	case "claims":
		return claims(ctx, args[2:], environ, stdout, stderr)
	case "healthcheck":
		return healthcheck(ctx, environ, stdout)
	case "stripe":
		return stripeCommand(ctx, args[2:], environ, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
}
