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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
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
	logger := newLogger(stdout, cfg.LogLevel)
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

	rdb, err := openRedis(string(cfg.RedisURL), cfg.RedisTimeout, logger)
	if err != nil {
		return err
	}
	if rdb != nil {
		defer rdb.Close()
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	claims := claim.NewStore(rdb, claim.StoreConfig{
		Prefix:        cfg.RedisKeyPrefix,
		Timeout:       cfg.RedisTimeout,
		ProcessingTTL: cfg.ClaimProcessingTTL,
	})
	if err := claims.Ping(ctx); err != nil && rdb != nil {
		logger.Warn("redis unavailable at startup: deliveries fail open until it answers", "err", err)
	}
	flow := claim.NewFlow(claims, claim.FlowConfig{
		HandlerTimeout: cfg.HandlerTimeout,
		Logger:         logger,
		Registerer:     registry,
	})

	queue := support.NewQueue(pool)
	resend, err := resendhook.NewHandler(
		flow.Endpoint(claim.Provider{Name: "resend", DedupeTTL: cfg.ResendDedupeTTL, FailClosed: cfg.ResendClaimFailureMode == "closed"}),
		queue,
		resendhook.Config{
			Secret:     string(cfg.ResendWebhookSecret),
			APIKey:     string(cfg.ResendAPIKey),
			APIURL:     cfg.ResendAPIURL,
			Inbound:    cfg.SupportInboundAddresses,
			Logger:     logger,
			Registerer: registry,
		})
	if err != nil {
		return err
	}

	var draining atomic.Bool
	handler := newServer(serverDeps{
		logger:       logger,
		registry:     registry,
		pool:         pool,
		claims:       claims,
		draining:     &draining,
		stripe:       flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: cfg.StripeDedupeTTL, FailClosed: cfg.StripeClaimFailureMode == "closed"}),
		stripeSecret: string(cfg.StripeWebhookSecret),
		entitlements: entitlements.NewStore(pool, registry),
		resend:       resend,
		supportForm:  support.FormHandler(queue, logger),
		formLimit:    support.RateLimit(cfg.SupportFormRate, cfg.trustedProxies()),
	})

	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		// A delivery may run for the whole handler deadline before it answers.
		WriteTimeout: cfg.HandlerTimeout + 2*cfg.RedisTimeout + 10*time.Second,
		IdleTimeout:  120 * time.Second,
		ErrorLog:     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.ListenAddr, err)
	}
	logger.Info("serving", "addr", ln.Addr().String(), "redis", rdb != nil)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stop() // a second signal ends the process the default way

	// Readiness fails first, so the load balancer stops sending; then the
	// listener closes and in-flight deliveries finish under their deadline,
	// releasing any claim they cannot complete.
	draining.Store(true)
	logger.Info("shutting down", "delay", cfg.ShutdownDelay)
	time.Sleep(cfg.ShutdownDelay)
	grace := cfg.HandlerTimeout + 2*cfg.RedisTimeout + 5*time.Second
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stopped")
	return nil
}

func migrate(ctx context.Context, environ []string, stdout io.Writer) error {
	cfg, err := loadMigrateConfig(environ)
	if err != nil {
		return err
	}
	logger := newLogger(stdout, cfg.LogLevel)
	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrateUp(ctx, pool, logger)
}

func newLogger(w io.Writer, level string) *slog.Logger {
	l, _ := parseLevel(level) // validated with the config
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

func openPostgres(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("DATABASE_URL is invalid") // the error would echo the URL
	}
	pcfg.MaxConns = maxConns
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
func openRedis(url string, timeout time.Duration, logger *slog.Logger) (*redis.Client, error) {
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
	opts.MinIdleConns = 4
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	// go-redis logs through a package-level logger of its own; route it into
	// ours so that every line stays one JSON object.
	redis.SetLogger(redisLogger{logger})
	return redis.NewClient(opts), nil
}

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
