package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

// newServer is the service's HTTP handler. Each route's handler is built by
// serve and handed in; metrics is nil when METRICS_ADDR serves it
// elsewhere.
func newServer(logger *slog.Logger, readyz, metrics, stripe, resend, form http.Handler, formLimit func(http.Handler) http.Handler) http.Handler {
	r := chi.NewRouter()
	r.Use(recoverer(logger))
	r.NotFound(jsonError(http.StatusNotFound, "not found"))
	r.MethodNotAllowed(jsonError(http.StatusMethodNotAllowed, "method not allowed"))
	addRoutes(r, readyz, metrics, stripe, resend, form, formLimit)
	return r
}

func handleHealthz() http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}

// handleReadyz fails while shutting down or while Postgres does not answer.
// Redis is reported but never fails readiness: without it the service
// fails open, and pulling every replica out of the load balancer would turn
// a degraded service into a dead one.
func handleReadyz(pool *pgxpool.Pool, claims *claim.Store, draining *atomic.Bool) http.Handler {
	type report struct {
		Ready    bool   `json:"ready"`
		Draining bool   `json:"draining"`
		Postgres string `json:"postgres"`
		Redis    string `json:"redis"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep := report{Ready: true, Postgres: "ok", Redis: "ok"}
		if draining.Load() {
			rep.Ready, rep.Draining = false, true
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			rep.Ready, rep.Postgres = false, "unavailable"
		}
		// Not ctx: a hung Postgres must not make Redis look down. Ping has
		// its own REDIS_TIMEOUT.
		switch err := claims.Ping(r.Context()); {
		case err == nil:
		case errors.Is(err, claim.ErrNoRedis):
			rep.Redis = "not configured: deliveries run degraded"
		default:
			rep.Redis = "unavailable: deliveries run degraded"
		}
		status := http.StatusOK
		if !rep.Ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, rep)
	})
}

// recoverer turns a panic outside the claim flow (which recovers its own and
// releases the claim) into a logged 500.
func recoverer(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					if v == http.ErrAbortHandler {
						panic(v)
					}
					logger.Error("panic", "path", r.URL.Path, "panic", v)
					writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}

func jsonError(status int, msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, status, map[string]string{"error": msg})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
