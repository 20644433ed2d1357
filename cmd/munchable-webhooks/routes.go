package main

import (
	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// addRoutes is the service's whole HTTP surface.
func addRoutes(r chi.Router, d serverDeps) {
	r.Get("/healthz", handleHealthz())
	r.Get("/readyz", handleReadyz(d.pool, d.claims, d.draining))
	r.Method("GET", "/metrics", promhttp.HandlerFor(d.registry, promhttp.HandlerOpts{}))

	r.Method("POST", "/webhooks/stripe", stripehook.Handler(d.stripe, d.stripeSecret, d.entitlements))
	r.Method("POST", "/webhooks/resend", d.resend)
	r.With(d.formLimit).Method("POST", "/support/messages", d.supportForm)
}
