package main

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// addRoutes is the service's whole HTTP surface.
func addRoutes(r chi.Router, readyz, metrics, stripe, resend, form http.Handler, formLimit func(http.Handler) http.Handler) {
	r.Get("/healthz", handleHealthz())
	r.Method(http.MethodGet, "/readyz", readyz)
	if metrics != nil {
		r.Method(http.MethodGet, "/metrics", metrics)
	}

	r.Method(http.MethodPost, "/webhooks/stripe", stripe)
	r.Method(http.MethodPost, "/webhooks/resend", resend)
	r.With(formLimit).Method(http.MethodPost, "/support/messages", form)
}
