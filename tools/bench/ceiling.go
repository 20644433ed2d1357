package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// serveCeiling is the "ceiling" subcommand: the part of the service's work
// that every delivery pays, and nothing else, in a process of its own like
// the service. Mode "chi" reads the body through the service's intake and
// answers 200; mode "verify" also checks the signature as the Stripe
// handler does. The server has the service's timeouts.
func serveCeiling(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ceiling", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", "chi", "chi: read the body and answer; verify: also check the Stripe signature")
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	secret := fs.String("secret", "", "Stripe webhook secret (mode verify)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *mode != "chi" && *mode != "verify" {
		return fmt.Errorf("ceiling: unknown mode %q", *mode)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The service's own intake (claim.Endpoint.Handler) with a decode that
	// stops before the claim: every delivery is answered as ignored, so the
	// ceiling pays exactly the reading, verifying and answering the service
	// pays, and the compiler sees the dependency.
	ep := claim.NewFlow(claim.NewStore(nil, claim.StoreConfig{}), claim.FlowConfig{}).
		Endpoint(claim.Provider{Name: "stripe"})
	intake := ep.Handler(func(h http.Header, body []byte) (claim.Event, error) {
		if *mode == "verify" {
			if err := webhook.ValidatePayloadWithTolerance(body, h.Get("Stripe-Signature"), *secret, stripehook.Tolerance); err != nil {
				return claim.Event{}, fmt.Errorf("%w: %w", claim.ErrSignature, err)
			}
		}
		return claim.Event{ID: "ceiling"}, nil
	})
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Method(http.MethodPost, "/webhooks/stripe", intake)
	srv := &http.Server{
		Handler:           r,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      40 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
