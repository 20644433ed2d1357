package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stripe/stripe-go/v79/client"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/intake"
	"github.com/munchable/munchable-webhooks/internal/leader"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/logsample"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
	"github.com/munchable/munchable-webhooks/internal/stripesync"
	"github.com/munchable/munchable-webhooks/internal/support"
	"github.com/munchable/munchable-webhooks/internal/sweep"
	"github.com/munchable/munchable-webhooks/internal/tracing"
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
	// Tracing is off (nil) unless the OTEL_* variables say otherwise; off,
	// nothing below is instrumented. It stops last, to flush every span.
	tp, logger, stopTracing, err := startTracing(ctx, environ, logger)
	if err != nil {
		return err
	}
	defer stopTracing()

	pool, err := openPostgres(ctx, string(cfg.DatabaseURL), int32(cfg.DatabaseMaxConns),
		func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracing.Postgres(tp) })
	if err != nil {
		return err
	}
	if cfg.MigrateOnStart {
		err = migrateUp(ctx, migrationTarget(cfg.DatabaseURL, cfg.MigrateDatabaseURL), logger)
	}
	if err == nil {
		err = verifySchema(ctx, pool)
	}
	if err != nil {
		pool.Close()
		return err
	}
	claims, closeRedis, err := cfg.openStore()
	if err != nil {
		pool.Close()
		return err
	}
	if err := claims.Trace(tp); err != nil {
		closeRedis()
		pool.Close()
		return err
	}
	// Postgres closes before Redis: pool.Close waits for the handlers still
	// running when the drain's grace ran out, and those must still reach
	// Redis to confirm or release their claims.
	defer func() {
		pool.Close()
		closeRedis()
	}()

	registry := newRegistry()
	claimsUsable := claim.NewUsable(claims, logger)
	registry.MustRegister(claimsUsable.Gauge())
	_ = claimsUsable.Check(ctx) // logs why when claims do not work yet
	// Refusals (deliveries rejected before the claim, form posts turned
	// away, connections over a client's share) are logged sampled: anyone
	// can send them by the thousand.
	refusals := logsample.New(logger, logsample.Config{})
	defer background(ctx, refusals.Run)()
	// Both providers' bodies and the form's share one deadline, one
	// minimum rate and one memory budget.
	bodies := intake.New(intake.Config{
		Timeout:        cfg.BodyReadTimeout,
		MinRate:        cfg.BodyMinRate,
		Budget:         cfg.MaxInflightBodyBytes,
		MaxConnections: cfg.MaxConnections,
	})
	led := ledger.New(pool, cfg.PoisonAfter)
	led.Trace(tp)
	// The ledger's trim and the feed's doorbell are serve's goroutines:
	// they end when serve returns (or ctx ends), and serve waits for them
	// before the pool closes.
	defer background(ctx, func(ctx context.Context) {
		led.RunRetention(ctx, cfg.EventsRetention, retentionInterval, logger)
	})()
	bell := ledger.NewDoorbell(pool)
	defer background(ctx, func(ctx context.Context) { bell.Run(ctx, logger) })()
	// The relay runs on one replica at a time; its gauges on every one.
	relayCfg := cfg.relayConfig(pool, logger, registry)
	relayCfg.Tracer = tp
	rel := relay.New(relayCfg)
	// A destination starts when its first configured replica does: before
	// this one accepts anything, whoever leads the relay.
	if err := rel.Register(ctx); err != nil {
		return err
	}
	if len(cfg.SupportForwardTo) == 0 {
		logger.Info("forwarding support messages to the team is off (SUPPORT_FORWARD_TO is empty)")
	}
	defer background(ctx, func(ctx context.Context) { rel.Observe(ctx, relayObserveInterval) })()
	defer background(ctx, func(ctx context.Context) {
		runRelay(ctx, withExpiry(rel.Run, cfg.expiry(pool, logger, registry)), pool, leader.LeaseConfig{TTL: cfg.LeaderLeaseTTL}, logger)
	})()
	flow := claim.NewFlow(claims, claim.FlowConfig{
		HandlerTimeout: cfg.HandlerTimeout,
		PoisonAfter:    cfg.PoisonAfter,
		Logger:         logger,
		Registerer:     registry,
		Intake:         bodies,
		Ledger:         led,
		Refusals:       refusals,
		Tracer:         tp,
	})
	queue := support.NewQueue(pool)
	form := support.NewForm(queue, support.FormConfig{
		Origins:          cfg.SupportFormOrigins,
		RedirectURL:      cfg.SupportFormRedirectURL,
		Rate:             cfg.SupportFormRate,
		TrustedProxies:   cfg.trustedProxies,
		DatabaseMaxConns: cfg.DatabaseMaxConns,
		Intake:           bodies,
		Logger:           logger,
		Registerer:       registry,
		Refusals:         refusals,
	})
	probe := newPostgresProbe(pool)
	defer probe.close()

	var draining atomic.Bool
	metrics := promhttp.HandlerFor(registry, promhttp.HandlerOpts{})
	store := entitlements.NewStore(pool, registry)
	stripe := stripehook.New(stripehook.Config{
		Store:      store,
		Secret:     string(cfg.StripeWebhookSecret),
		API:        stripeAPI(cfg, logger, tp),
		Logger:     logger,
		Registerer: registry,
	})
	resend := resendhook.New(resendhook.Config{
		Queue:      queue,
		Webhook:    cfg.resendWebhook,
		APIKey:     string(cfg.ResendAPIKey),
		APIURL:     cfg.resendAPIURL,
		Inbound:    cfg.inbound,
		Logger:     logger,
		Registerer: registry,
		Tracer:     tp,

		AttachmentMaxBytes:   cfg.SupportAttachmentMaxBytes,
		InflightBytes:        cfg.MailInflightBytes,
		DownloadAllowPrivate: cfg.ResendDownloadAllowPrivate,
	})
	apiAccess := accessAPI(cfg, pool, logger)
	handler := newServer(logger, routes{
		postgres: probe,
		claims:   claimsUsable,
		draining: &draining,
		metrics:  publicMetrics(cfg, metrics, logger),
		stripe:   stripe.Handler(flow.Endpoint(cfg.provider("stripe"))),
		resend:   resend.Handler(flow.Endpoint(cfg.provider("resend"))),
		form:     form,
		access:   publicAccess(cfg, apiAccess),
	})
	jobsCtx, stopJobs := context.WithCancel(ctx)
	jobsDone := startJobs(jobsCtx, cfg, logger, registry, pool, scheduled{
		store: store, stripe: stripe, stripeEndpoint: flow.Endpoint(cfg.provider("stripe")),
		resend: resend, resendEndpoint: flow.Endpoint(cfg.provider("resend")), tracer: tp,
	})
	private := http.NewServeMux()
	addPrivateRoutes(private, metrics, probe, claimsUsable, &draining, apiAccess)
	refused := refusedConnections(registry)
	caps := []clientCap{
		{perClient: cfg.MaxConnectionsPerClient, trusted: cfg.trustedProxies, listener: "main", refused: refused.WithLabelValues("main"), refusals: refusals},
		{perClient: cfg.MaxConnectionsPerClient, trusted: cfg.trustedProxies, listener: "metrics", refused: refused.WithLabelValues("metrics"), refusals: refusals},
	}
	err = listenAndServe(ctx, stop, cfg, logger, handler, private, caps, &draining)
	stopJobs()
	jobsDone()
	return err
}

// scheduled is what the scheduled jobs run on.
type scheduled struct {
	store          *entitlements.Store
	stripe         *stripehook.Receiver
	stripeEndpoint *claim.Endpoint
	resend         *resendhook.Receiver
	resendEndpoint *claim.Endpoint
	tracer         trace.TracerProvider // nil: runs are not traced
}

// sweepOverlap is how far before its last pass's start a sweep lists
// again: an event or mail the provider lists a little late is still seen.
const sweepOverlap = 10 * time.Minute

// startJobs starts the scheduled verify and sweeps (VERIFY_INTERVAL,
// SWEEP_INTERVAL), each in a goroutine that ends once ctx does; the
// returned func waits for them.
func startJobs(ctx context.Context, cfg config, logger *slog.Logger, registry prometheus.Registerer, pool *pgxpool.Pool, s scheduled) (wait func()) {
	var wg sync.WaitGroup
	// The jobs' leases are rows taken over the pool, so any pooler will
	// do. A replica checks whether a job is due as often as a leader
	// renews, so a leader that stopped is replaced within 4/3 of the TTL.
	lease := leader.LeaseConfig{TTL: cfg.LeaderLeaseTTL}
	run := leader.Scheduler{Pool: pool, Lease: lease, Poll: lease.Renew(), Logger: logger}
	start := func(j leader.Job) { wg.Go(func() { run.Run(ctx, tracedJob(s.tracer, j)) }) }
	api := stripeAPI(cfg, logger, s.tracer)
	verifyInterval := cfg.VerifyInterval
	if api == nil {
		verifyInterval = 0
	}
	// The metrics are exported whether the jobs run or not, with the
	// intervals the alerts read (0: off).
	verifyMetrics := stripesync.NewVerifyMetrics(registry, verifyInterval)
	sweepMetrics := sweep.NewMetrics(registry, "stripe", "resend")
	switch {
	case cfg.VerifyInterval == 0:
		logger.Info("scheduled stripe verify is off (VERIFY_INTERVAL=0)")
	case api == nil:
		logger.Info("scheduled stripe verify is off: it needs STRIPE_API_KEY")
	default:
		start(stripesync.VerifyJob(stripesync.VerifyConfig{API: api, Store: s.store, Logger: logger},
			cfg.VerifyInterval, verifyMetrics))
	}
	if cfg.SweepInterval == 0 {
		logger.Info("sweeps are off (SWEEP_INTERVAL=0)")
		return wg.Wait
	}
	sweeps := sweep.Config{Interval: cfg.SweepInterval, Overlap: sweepOverlap, HorizonMargin: 5 * 24 * time.Hour,
		Metrics: sweepMetrics, Logger: logger}
	if api == nil {
		logger.Info("the Stripe sweep is off: it needs STRIPE_API_KEY")
	} else {
		start(sweep.Job(sweep.Source{Provider: "stripe", Horizon: stripesync.Window, Pass: stripesync.SweepPass(stripesync.ReplayConfig{
			API: api, Receiver: s.stripe, Endpoint: s.stripeEndpoint, Logger: logger,
		})}, sweeps))
	}
	// Resend keeps received mail for a while its docs do not state: no
	// horizon to warn about; WebhookSweepStale covers a sweep that stops.
	start(sweep.Job(sweep.Source{Provider: "resend", Pass: s.resend.SweepPass(s.resendEndpoint, cfg.SweepMaxPages)}, sweeps))
	return wg.Wait
}

// relayObserveInterval is how often every replica sets the relay's
// gauges (the oldest pending delivery, the horizon's lag).
const relayObserveInterval = 5 * time.Second

// retentionInterval is how often serve trims the ledger and the feed: a
// pass finds little to do, and rows outlive EVENTS_RETENTION by at most
// this.
const retentionInterval = 10 * time.Minute

// stripeAPI is the Stripe API client, its calls traced under tp (nil: not
// traced), or nil without STRIPE_API_KEY: the service then works offline
// from payloads.
func stripeAPI(cfg config, logger *slog.Logger, tp trace.TracerProvider) *client.API {
	if cfg.StripeAPIKey == "" {
		return nil
	}
	return stripehook.NewAPI(string(cfg.StripeAPIKey), cfg.stripeAPIURL, logger, tp)
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
// METRICS_ADDR moves it to a listener of its own. Public, it is said at
// startup: anyone may scrape it (a scrape costs no Redis call within
// claim.UsableFresh of the last probe).
func publicMetrics(cfg config, metrics http.Handler, logger *slog.Logger) http.Handler {
	if cfg.MetricsAddr != "" {
		return nil
	}
	logger.Info("/metrics is served on the public listener (METRICS_ADDR is empty): set METRICS_ADDR to serve it, /healthz and /readyz on a listener of their own")
	return metrics
}

// listenAndServe serves until ctx ends, then drains: readiness fails first,
// so the load balancer stops sending; then the listener closes and
// in-flight deliveries finish under their deadline, releasing any claim
// they cannot complete.
// private is what METRICS_ADDR serves, when set; caps are each listener's
// per-client share, main and metrics.
func listenAndServe(ctx context.Context, stop func(), cfg config, logger *slog.Logger, handler, private http.Handler, caps []clientCap, draining *atomic.Bool) error {
	errorLog := slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	// A delivery may run for the whole handler deadline before it answers.
	srv := limitedServer(handler, errorLog, 30*time.Second,
		cfg.HandlerTimeout+2*cfg.RedisTimeout+10*time.Second, 120*time.Second, cfg.MaxConnections)
	servers := []*http.Server{srv}
	addrs := []string{cfg.ListenAddr}
	if cfg.MetricsAddr != "" {
		servers = append(servers, limitedServer(private, errorLog, metricsReadTimeout, metricsWriteTimeout, metricsIdleTimeout, cfg.MaxConnections))
		addrs = append(addrs, cfg.MetricsAddr)
	}
	served := make(chan error, len(servers))
	for i, s := range servers {
		// Each listener holds MAX_CONNECTIONS at most: the metrics one is
		// as reachable as the other where the network is not trusted.
		ln, err := listen(addrs[i], cfg.MaxConnections, caps[i])
		if err != nil {
			for _, started := range servers[:i] {
				_ = started.Close()
			}
			return err
		}
		logger.Info("serving", "addr", ln.Addr().String(), "metrics_only", i > 0, "max_connections", cfg.MaxConnections,
			"max_connections_per_client", cfg.MaxConnectionsPerClient)
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
	// A fresh context: ctx is already done.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.shutdownGrace())
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
	return migrateUp(ctx, migrationTarget(cfg.DatabaseURL, cfg.MigrateDatabaseURL), logger)
}

// background runs f in a goroutine until stop, which cancels f's context
// and waits for it to return.
func background(ctx context.Context, f func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	return func() { cancel(); <-done }
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// opts adjust the pool's configuration before it connects (serve's
// tracer).
func openPostgres(ctx context.Context, url string, maxConns int32, opts ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.New("DATABASE_URL is invalid: " + wantDatabaseURL) // pgx's error would echo the URL
	}
	pcfg.MaxConns = maxConns
	// The service runs about fifteen distinct statements, but pgx sizes each
	// connection's statement and description caches for 512 (two maps
	// allocated up front): 0.9 MiB of live heap over 16 connections, which
	// the GC doubles into the heap goal (heap profile under make bench).
	pcfg.ConnConfig.StatementCacheCapacity = 64
	pcfg.ConnConfig.DescriptionCacheCapacity = 64
	// The feed's before and after print timestamps in the session's time
	// zone; in UTC they read the same whatever the server is set to, and
	// match what the service builds for a subscription (docs/APP.md).
	// PgBouncer passes TimeZone on.
	pcfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	nameSessions(pcfg)
	for _, o := range opts {
		o(pcfg)
	}
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

// nameSessions sets the sessions' application_name, unless the URL sets
// one, to "munchable-webhooks <version>": pg_stat_activity (and a
// migration's message about who blocks it) then says which release holds
// a session, and the ledger's received_by which release recorded an event.
func nameSessions(pcfg *pgxpool.Config) {
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = "munchable-webhooks " + version
	}
}

// migrationURL is where migrations run: MIGRATE_DATABASE_URL when set,
// else DATABASE_URL. name is the variable, for messages.
type migrationURL struct{ name, url string }

func migrationTarget(databaseURL, migrateURL secret) migrationURL {
	if migrateURL != "" {
		return migrationURL{"MIGRATE_DATABASE_URL", string(migrateURL)}
	}
	return migrationURL{"DATABASE_URL", string(databaseURL)}
}

// migrateUp applies the pending migrations over a pool of two connections
// of its own, closed when they are done (the service's pool is sized for
// deliveries, and may sit behind a transaction pooler). It first makes sure
// the connections keep their sessions: goose's lock is a session advisory
// lock, which a transaction pooler drops between statements, so two
// replicas starting together would both take it.
func migrateUp(ctx context.Context, target migrationURL, logger *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(target.url)
	if err != nil {
		return fmt.Errorf("%s is invalid: %s", target.name, wantDatabaseURL) // pgx's error would echo the URL
	}
	pcfg.MaxConns = 2
	nameSessions(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("postgres (%s): %w", target.name, err)
	}
	defer pool.Close()
	if err := requireSessions(ctx, pool); err != nil {
		return fmt.Errorf("migrations over %s: %w", target.name, err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	applied, err := migrations.Apply(ctx, db, logger)
	if err != nil {
		return err
	}
	logger.Info("migrations applied", "count", len(applied), "applied", applied, "over", target.name)
	return nil
}

// verifySchema refuses a schema this build cannot run on: older than its
// migrations (MIGRATE_ON_START=false, and migrate not run yet), or one a
// later release's contract step removed something from that this build
// uses (a rollback too far back). Checked after migrating too, for the
// second case.
func verifySchema(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close() // the pool stays open
	if err := migrations.Verify(ctx, db); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// errTransactionPooler refuses migrations through a pooler that hands a
// client's statements to whichever server connection is free.
var errTransactionPooler = errors.New("the connection goes through a transaction (or statement) pooler, " +
	"which drops the migration lock (a session advisory lock) between statements: " +
	"set MIGRATE_DATABASE_URL to a direct connection to Postgres (or one through a session pooler)")

// requireSessions checks that each client connection keeps one server
// session: two connections ask for their backend's pid, the first asks
// again. A direct or session-pooled connection gets the same pid twice and
// never its neighbour's; a transaction pooler hands the second connection
// the backend the first just freed (PgBouncer reuses the last one freed),
// or the first a new one. The queries use the simple protocol, so the
// check itself runs through any pooler in any pgx query mode.
func requireSessions(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer b.Release()
	pid := func(c *pgxpool.Conn) (int32, error) {
		var p int32
		err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	for range 3 {
		a1, err := pid(a)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		b1, err := pid(b)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		a2, err := pid(a)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		if a1 == b1 || a1 != a2 {
			return errTransactionPooler
		}
	}
	return nil
}
