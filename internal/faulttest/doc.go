// Package faulttest runs the service the way production runs it, as a child
// process built from ./cmd/munchable-webhooks, against throwaway Redis and
// Postgres servers, and breaks things around it: kill -9 mid-delivery, a
// confirm that never reaches Redis, Redis or Postgres dying under traffic, a
// handler stuck past its deadline, SIGTERM under load, three replicas racing
// for one event.
//
// The non-test files are the harness, shared with the soak (tools/soak):
// building the binary, running, killing and restarting it, playing the
// providers (Stripe and Resend deliveries, signed on every attempt as the
// providers do), a fake Resend API, and reading /metrics. The fault cases are
// the package's tests; they need the server binaries (redis-server, initdb and
// postgres) and the go command, and never touch the machine's shared
// services.
package faulttest
