package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
	"github.com/munchable/munchable-webhooks/internal/support"
	"github.com/munchable/munchable-webhooks/migrations"
)

// serve is the composition root: everything the service runs on is built
// here, in dependency order, and torn down in reverse.
func serve(ctx context.Context, environ []string, stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	logger := newLogger(stdout, cfg.logLevel)
	for _, w := range cfg.warnings() {
		logger.Warn(w)
	}

	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), int32(cfg.DatabaseMaxConns))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrateUp(ctx, pool, logger); err != nil {
		return err
	}
	claims, closeRedis, err := cfg.openStore()
	if err != nil {
		return err
	}
	defer closeRedis()

	registry := newRegistry()
	if err := claims.Ping(ctx); err != nil && cfg.RedisURL != "" {
		logger.Warn("redis unavailable at startup: deliveries fail open until it answers", "err", err)
	}
	led := ledger.New(pool, cfg.PoisonAfter)
	// The trim is serve's goroutine: it ends when serve returns (or ctx
	// ends), and serve waits for it before the pool closes.
	trimCtx, stopTrim := context.WithCancel(ctx)
	trimmed := make(chan struct{})
	go func() {
		defer close(trimmed)
		led.RunRetention(trimCtx, cfg.EventsRetention, retentionInterval, logger)
	}()
	defer func() { stopTrim(); <-trimmed }()
	flow := claim.NewFlow(claims, claim.FlowConfig{
		HandlerTimeout: cfg.HandlerTimeout,
		PoisonAfter:    cfg.PoisonAfter,
		Logger:         logger,
		Registerer:     registry,
		Ledger:         led,

		// Both providers' bodies share one deadline and one memory budget.
		BodyReadTimeout:      cfg.BodyReadTimeout,
		MaxInflightBodyBytes: cfg.MaxInflightBodyBytes,
	})
	queue := support.NewQueue(pool)
	form := support.NewForm(queue, support.FormConfig{
		Origins:          cfg.SupportFormOrigins,
		RedirectURL:      cfg.SupportFormRedirectURL,
		Rate:             cfg.SupportFormRate,
		TrustedProxies:   cfg.trustedProxies,
		DatabaseMaxConns: cfg.DatabaseMaxConns,
		Logger:           logger,
		Registerer:       registry,
	})
	probe := newPostgresProbe(pool)
	defer probe.close()

	var draining atomic.Bool
	metrics := promhttp.HandlerFor(registry, promhttp.HandlerOpts{})
	handler := newServer(logger,
		handleReadyz(probe, claims, &draining),
		publicMetrics(cfg, metrics),
		stripehook.New(stripehook.Config{
			Store:      entitlements.NewStore(pool, registry),
			API:        stripeAPI(cfg, logger),
			Logger:     logger,
			Registerer: registry,
		}).Handler(
			flow.Endpoint(cfg.provider("stripe")),
			string(cfg.StripeWebhookSecret)),
		resendhook.NewHandler(
			flow.Endpoint(cfg.provider("resend")),
			queue,
			resendhook.Config{
				Webhook:    cfg.resendWebhook,
				APIKey:     string(cfg.ResendAPIKey),
				APIURL:     cfg.resendAPIURL,
				Inbound:    cfg.inbound,
				Logger:     logger,
				Registerer: registry,

				AttachmentMaxBytes: cfg.SupportAttachmentMaxBytes,
			}),
		form.Page(), form.Preflight(), form.Submit(),
	)
	return listenAndServe(ctx, stop, cfg, logger, handler, metrics, &draining)
}

// retentionInterval is how often serve trims the ledger and the feed: a
// pass finds little to do, and rows outlive EVENTS_RETENTION by at most
// this.
const retentionInterval = 10 * time.Minute

// stripeAPI is the Stripe API client, or nil without STRIPE_API_KEY: the
// service then works offline from payloads.
func stripeAPI(cfg config, logger *slog.Logger) *client.API {
	if cfg.StripeAPIKey == "" {
		return nil
	}
	return stripehook.NewAPI(string(cfg.StripeAPIKey), cfg.stripeAPIURL, logger)
}

// newRegistry is the service's own metrics registry (no global one).
func newRegistry() *prometheus.Registry {
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "webhook_build_info",
		Help: "The running build: always 1, labelled with its version and Go version.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	registry.MustRegister(buildInfo)
	return registry
}

// publicMetrics is /metrics on the public listener: nil (404) when
// METRICS_ADDR moves it to a listener of its own.
func publicMetrics(cfg config, metrics http.Handler) http.Handler {
	if cfg.MetricsAddr != "" {
		return nil
	}
	return metrics
}

// listenAndServe serves until ctx ends, then drains: readiness fails first,
// so the load balancer stops sending; then the listener closes and
// in-flight deliveries finish under their deadline, releasing any claim
// they cannot complete.
func listenAndServe(ctx context.Context, stop func(), cfg config, logger *slog.Logger, handler, metrics http.Handler, draining *atomic.Bool) error {
	errorLog := slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		// A delivery may run for the whole handler deadline before it answers.
		WriteTimeout: cfg.HandlerTimeout + 2*cfg.RedisTimeout + 10*time.Second,
		IdleTimeout:  120 * time.Second,
		ErrorLog:     errorLog,
	}
	servers := []*http.Server{srv}
	if cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics)
		servers = append(servers, &http.Server{
			Addr: cfg.MetricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: errorLog,
		})
	}
	served := make(chan error, len(servers))
	for i, s := range servers {
		addr := cfg.ListenAddr
		if i > 0 {
			addr = cfg.MetricsAddr
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, started := range servers[:i] {
				_ = started.Close()
			}
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		logger.Info("serving", "addr", ln.Addr().String(), "metrics_only", i > 0)
		go func() { served <- s.Serve(ln) }()
	}

	select {
	case err := <-served:
		for _, s := range servers {
			_ = s.Close()
		}
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stop() // a second signal ends the process the default way

	draining.Store(true)
	logger.Info("shutting down", "delay_ms", cfg.ShutdownDelay.Milliseconds())
	time.Sleep(cfg.ShutdownDelay)
	grace := cfg.HandlerTimeout + 2*cfg.RedisTimeout + 5*time.Second
	// A fresh context: ctx is already done.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var errs []error
	for _, s := range servers {
		if err := s.Shutdown(shutdownCtx); err != nil {
			_ = s.Close()
			errs = append(errs, fmt.Errorf("shutdown: %w", err))
		}
	}
	for range servers {
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("serve: %w", err))
		}
	}
	if len(errs) == 0 {
		logger.Info("stopped")
	}
	return errors.Join(errs...)
}

func migrate(ctx context.Context, environ []string, stdout io.Writer) error {
	cfg, err := loadMigrateConfig(environ)
	if err != nil {
		return err
	}
	level, _ := parseLevel(cfg.LogLevel) // validated
	logger := newLogger(stdout, level)
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrateUp(ctx, pool, logger)
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

func openPostgres(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("DATABASE_URL is invalid") // the error would echo the URL
	}
	pcfg.MaxConns = maxConns
	// The service runs about fifteen distinct statements, but pgx sizes each
	// connection's statement and description caches for 512 (two maps
	// allocated up front): 0.9 MiB of live heap over 16 connections, which
	// the GC doubles into the heap goal (heap profile under make bench).
	pcfg.ConnConfig.StatementCacheCapacity = 64
	pcfg.ConnConfig.DescriptionCacheCapacity = 64
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres ping: %w", err)
	}
	return pool, nil
}

func migrateUp(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	applied, err := migrations.Apply(ctx, db, logger)
	if err != nil {
		return err
	}
	logger.Info("migrations applied", "count", len(applied), "applied", applied)
	return nil
}

// openRedis returns nil for an empty URL: claims disabled.
func openRedis(url string, timeout time.Duration) (*redis.Client, error) {
	if url == "" {
		return nil, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, errors.New("REDIS_URL is invalid")
	}
	// Every call is bounded by REDIS_TIMEOUT and never retried: a slow Redis
	// must degrade a delivery quickly, not multiply its wait.
	opts.DialTimeout = timeout
	opts.ReadTimeout = timeout
	opts.WriteTimeout = timeout
	opts.PoolTimeout = timeout
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = -1
	// go-redis also retries a failed dial (5 times, 100 ms apart, by
	// default), which made each delivery wait ~250-400 ms while Redis was
	// down. One attempt fails fast; the cost is that recovery is noticed
	// within about a second instead of at once.
	opts.DialerRetries = 1
	opts.PoolSize = 64
	// A claim's commands and replies are a few hundred bytes, but go-redis
	// gives every connection 32 KiB read and write buffers: with 64
	// deliveries in flight that was 4 MiB, most of the heap (heap profile
	// under 64 concurrent duplicates). 1 KiB holds any claim command or
	// reply; a bigger reply just takes more reads.
	opts.ReadBufferSize = 1 << 10
	opts.WriteBufferSize = 1 << 10
	opts.MinIdleConns = 4
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(opts), nil
}

// redisLogger routes go-redis's own lines (pool and dial trouble) into JSON
// logs. go-redis has one package-level logger and no per-client option, so
// main sets it once, before anything runs: setting it here, per client,
// raced with the clients of commands that tests run side by side.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
