package main

import (
	"net/http"
	"sync/atomic"

	"github.com/go-chi/chi/v5"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// routes is what serves each route. Every field has a type of its own
// (each provider's handler is its package's Handler, not an http.Handler),
// so a handler put on another's route does not compile.
type routes struct {
	// readyz reports on these.
	postgres *postgresProbe
	claims   *claim.Usable
	draining *atomic.Bool
	// metrics is nil when METRICS_ADDR serves it on a listener of its own.
	metrics http.Handler
	stripe  stripehook.Handler
	resend  resendhook.Handler
	form    *support.Form
	// access is GET /v1/access; nil when it is off or METRICS_ADDR
	// serves it.
	access http.Handler
}

// addRoutes is the service's whole HTTP surface.
func addRoutes(r chi.Router, rt routes) {
	r.Get("/healthz", handleHealthz())
	r.Method(http.MethodGet, "/readyz", handleReadyz(rt.postgres, rt.claims, rt.draining))
	if rt.metrics != nil {
		r.Method(http.MethodGet, "/metrics", rt.metrics)
	}

	r.Method(http.MethodPost, "/webhooks/stripe", rt.stripe)
	r.Method(http.MethodPost, "/webhooks/resend", rt.resend)
	r.Method(http.MethodGet, "/support", rt.form.Page())
	r.Method(http.MethodOptions, "/support/messages", rt.form.Preflight())
	r.Method(http.MethodPost, "/support/messages", rt.form.Submit())
	if rt.access != nil {
		r.Method(http.MethodGet, "/v1/access", rt.access)
	}
}

// addPrivateRoutes is the METRICS_ADDR listener's surface: /metrics, and
// /healthz and /readyz again, so that the kubelet's probes need not share
// the public listener, whose connections anyone can hold; and the read
// API, unless it is off (access nil).
func addPrivateRoutes(mux *http.ServeMux, metrics http.Handler, postgres *postgresProbe, claims *claim.Usable, draining *atomic.Bool, access http.Handler) {
	mux.Handle("GET /metrics", metrics)
	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(postgres, claims, draining))
	if access != nil {
		mux.Handle("GET /v1/access", access)
	}
}
