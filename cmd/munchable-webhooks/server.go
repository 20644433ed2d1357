package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

// newServer is the service's HTTP handler. What serves each route is
// built by serve and handed in (routes.go).
func newServer(logger *slog.Logger, rt routes) http.Handler {
	r := chi.NewRouter()
	r.Use(recoverer(logger))
	r.NotFound(jsonError(http.StatusNotFound, "not found"))
	r.MethodNotAllowed(jsonError(http.StatusMethodNotAllowed, "method not allowed"))
	addRoutes(r, rt)
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
// a degraded service into a dead one. Redis is "ok" only when a claim
// works there (claim.Usable), not merely when something answers PING.
func handleReadyz(postgres *postgresProbe, claims *claim.Usable, draining *atomic.Bool) http.Handler {
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
		if err := postgres.ping(ctx); err != nil {
			rep.Ready, rep.Postgres = false, "unavailable"
		}
		// Not ctx: a hung Postgres must not make Redis look down. The probe
		// has its own REDIS_TIMEOUT. The reason is logged, not answered:
		// it may name internal addresses.
		var shards *claim.ShardsError
		switch err := claims.Check(r.Context()); {
		case err == nil:
		case errors.Is(err, claim.ErrNoRedis):
			rep.Redis = "not configured: deliveries run degraded"
		case errors.As(err, &shards):
			// Slot ranges name no address.
			rep.Redis = fmt.Sprintf("unusable on slots %s (%d of %d shards): deliveries whose keys hash there run degraded (the log says why)",
				shards.Slots(), len(shards.Failed), shards.Of)
		default:
			rep.Redis = "unusable: deliveries run degraded (the log says why)"
		}
		status := http.StatusOK
		if !rep.Ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, rep)
	})
}

// postgresProbe asks Postgres whether it answers, on a connection of its
// own. A ping through the pool waits for a free connection, so a pool held
// by slow work (say, form posts waiting on a locked table) read as a dead
// database and failed readiness on every replica at once.
//
// /readyz is public, so an answer under probeFresh old is given again
// rather than asked anew: a flood of /readyz requests once queued on the
// probe's one connection until the kubelet's own probe timed out, and every
// replica went unready at once.
type postgresProbe struct {
	cfg  *pgx.ConnConfig
	lock chan struct{} // one probe at a time; a waiting one keeps its deadline
	conn *pgx.Conn
	now  func() time.Time

	at   time.Time // of the last answer, under lock
	last error
}

// probeFresh is how long a readiness answer stands: well under the
// kubelet's probe period, long enough that a flood costs one ping a second.
const probeFresh = time.Second

func newPostgresProbe(pool *pgxpool.Pool) *postgresProbe {
	return &postgresProbe{cfg: pool.Config().ConnConfig.Copy(), lock: make(chan struct{}, 1), now: time.Now}
}

// ping answers whether Postgres answers: the last answer while it is under
// probeFresh old, else a ping on the probe's connection, opened when it has
// none. A connection that failed is dropped, so the next probe starts
// afresh.
func (p *postgresProbe) ping(ctx context.Context) error {
	select {
	case p.lock <- struct{}{}:
		defer func() { <-p.lock }()
	case <-ctx.Done():
		return fmt.Errorf("wait for the previous probe: %w", ctx.Err())
	}
	if !p.at.IsZero() && p.now().Sub(p.at) < probeFresh {
		return p.last
	}
	p.last = p.pingNow(ctx)
	p.at = p.now()
	return p.last
}

func (p *postgresProbe) pingNow(ctx context.Context) error {
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		p.conn = conn
	}
	if err := p.conn.Ping(ctx); err != nil {
		p.closeConn()
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// close ends the probe's connection, once the server no longer answers.
func (p *postgresProbe) close() {
	p.lock <- struct{}{}
	defer func() { <-p.lock }()
	p.closeConn()
}

func (p *postgresProbe) closeConn() {
	if p.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.conn.Close(ctx)
	p.conn = nil
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
