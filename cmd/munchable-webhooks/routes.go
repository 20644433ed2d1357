package main

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// addRoutes is the service's whole HTTP surface.
func addRoutes(r chi.Router, readyz, metrics, stripe, resend, formPage, formPreflight, formSubmit http.Handler) {
	r.Get("/healthz", handleHealthz())
	r.Method(http.MethodGet, "/readyz", readyz)
	if metrics != nil {
		r.Method(http.MethodGet, "/metrics", metrics)
	}

	r.Method(http.MethodPost, "/webhooks/stripe", stripe)
	r.Method(http.MethodPost, "/webhooks/resend", resend)
	r.Method(http.MethodGet, "/support", formPage)
	r.Method(http.MethodOptions, "/support/messages", formPreflight)
	r.Method(http.MethodPost, "/support/messages", formSubmit)
}
