package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// serveCeiling is the "ceiling MODE ADDR" subcommand: a process like the
// service that runs the service's own intake (claim.Endpoint.Handler) and
// answers every delivery as ignored, so it never reaches the claim. Mode
// "chi" only reads the body and answers; mode "intake" also runs the Stripe
// handler's own verify and decode (stripehook.Receiver.Decoder), which the
// service must run before it can claim: it needs the event id, and a
// malformed event is refused before any claim. It serves until killed: the
// harness stops it with SIGTERM.
func serveCeiling(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: bench ceiling chi|intake ADDR")
	}
	decode := func(http.Header, []byte) (claim.Event, error) { return claim.Event{ID: "ceiling"}, nil }
	switch args[0] {
	case "chi":
	case "intake":
		service := stripehook.New(stripehook.Config{Secret: stripeSecret}).Decoder()
		decode = func(h http.Header, body []byte) (claim.Event, error) {
			ev, err := service(h, body)
			ev.Apply = nil // answered as ignored: no claim, no store
			return ev, err
		}
	default:
		return fmt.Errorf("ceiling: unknown mode %q", args[0])
	}
	ep := claim.NewFlow(claim.NewStore(nil, claim.StoreConfig{}), claim.FlowConfig{}).Endpoint(claim.Provider{Name: "stripe"})
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Method(http.MethodPost, "/webhooks/stripe", ep.Handler(decode))
	srv := &http.Server{Addr: args[1], Handler: r, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 40 * time.Second, IdleTimeout: 120 * time.Second}
	return srv.ListenAndServe()
}
