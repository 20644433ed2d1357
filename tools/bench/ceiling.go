package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// serveCeiling is the "ceiling" subcommand: a process like the service
// that runs the service's own intake (claim.Endpoint.Handler) and answers
// every delivery as ignored, so it never reaches the claim. Mode "chi" only
// reads the body and answers; mode "intake" also runs the Stripe handler's
// own verify and decode (stripehook.Receiver.Decoder), which the service must run
// before it can claim: it needs the event id, and a malformed event is
// refused before any claim.
func serveCeiling(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ceiling", flag.ContinueOnError)
	mode := fs.String("mode", "chi", "chi or intake")
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	secret := fs.String("secret", "", "Stripe webhook secret (mode intake)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	decode := func(http.Header, []byte) (claim.Event, error) { return claim.Event{ID: "ceiling"}, nil }
	switch *mode {
	case "chi":
	case "intake":
		service := stripehook.New(stripehook.Config{}).Decoder(*secret)
		decode = func(h http.Header, body []byte) (claim.Event, error) {
			ev, err := service(h, body)
			ev.Apply = nil // answered as ignored: no claim, no store
			return ev, err
		}
	default:
		return fmt.Errorf("ceiling: unknown mode %q", *mode)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	ep := claim.NewFlow(claim.NewStore(nil, claim.StoreConfig{}), claim.FlowConfig{}).Endpoint(claim.Provider{Name: "stripe"})
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Method(http.MethodPost, "/webhooks/stripe", ep.Handler(decode))
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 40 * time.Second, IdleTimeout: 120 * time.Second}
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
