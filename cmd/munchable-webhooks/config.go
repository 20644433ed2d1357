package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
)

// config is the service's whole configuration, read from the environment
// (README.md lists every variable). validate also parses, once, the values
// that packages take in a typed form, into the unexported fields.
type config struct {
	ListenAddr  string `env:"LISTEN_ADDR" envDefault:":8080"`
	MetricsAddr string `env:"METRICS_ADDR"`
	DatabaseURL secret `env:"DATABASE_URL"`
	// MigrateDatabaseURL, when set, is where migrations run: a direct
	// connection, when DATABASE_URL goes through a transaction pooler.
	MigrateDatabaseURL secret `env:"MIGRATE_DATABASE_URL"`
	// MigrateOnStart false leaves migrations to `migrate` (a Job before
	// the rollout): serve then only checks that it can run on the schema.
	MigrateOnStart bool `env:"MIGRATE_ON_START" envDefault:"true"`
	ClaimConfig
	RelayConfig
	AccessConfig

	StripeWebhookSecret secret `env:"STRIPE_WEBHOOK_SECRET"`
	StripeAPIKey        secret `env:"STRIPE_API_KEY"`
	StripeAPIURL        string `env:"STRIPE_API_URL" envDefault:"https://api.stripe.com"`
	ResendWebhookSecret secret `env:"RESEND_WEBHOOK_SECRET"`
	ResendAPIKey        secret `env:"RESEND_API_KEY"`
	ResendAPIURL        string `env:"RESEND_API_URL" envDefault:"https://api.resend.com"`
	// ResendDownloadAllowPrivate lets attachment downloads use http and
	// reach loopback and private addresses: tests and private mirrors only.
	ResendDownloadAllowPrivate bool `env:"RESEND_DOWNLOAD_ALLOW_PRIVATE" envDefault:"false"`

	SupportInboundAddresses   []string `env:"SUPPORT_INBOUND_ADDRESSES"`
	SupportAttachmentMaxBytes int64    `env:"SUPPORT_ATTACHMENT_MAX_BYTES" envDefault:"10485760"`
	SupportFormRate           int      `env:"SUPPORT_FORM_RATE" envDefault:"10"`
	SupportFormOrigins        []string `env:"SUPPORT_FORM_ORIGINS"`
	SupportFormRedirectURL    string   `env:"SUPPORT_FORM_REDIRECT_URL"`
	// TrustedProxies has no envDefault: caarlos0/env applies a default to
	// an empty value too, and TRUSTED_PROXIES="" must mean "trust none".
	// parseEnv fills in defaultTrustedProxies when the variable is unset.
	TrustedProxies []string `env:"TRUSTED_PROXIES"`

	BodyReadTimeout      time.Duration `env:"BODY_READ_TIMEOUT" envDefault:"10s"`
	MaxInflightBodyBytes int64         `env:"MAX_INFLIGHT_BODY_BYTES" envDefault:"33554432"`
	// MaxConnections bounds the connections each listener holds at once.
	MaxConnections int `env:"MAX_CONNECTIONS" envDefault:"1024"`
	// MaxConnectionsPerClient bounds those of one client address outside
	// TRUSTED_PROXIES (0: no cap); BodyMinRate is the slowest a body may
	// arrive once bodyMinRateGrace has passed (0: no minimum).
	MaxConnectionsPerClient int   `env:"MAX_CONNECTIONS_PER_CLIENT" envDefault:"64"`
	BodyMinRate             int64 `env:"BODY_MIN_RATE" envDefault:"1024"`

	// EventsRetention is how long the ledger and the feed keep their rows;
	// 0 keeps them.
	EventsRetention time.Duration `env:"EVENTS_RETENTION" envDefault:"720h"`

	DatabaseMaxConns int           `env:"DATABASE_MAX_CONNS" envDefault:"16"`
	ShutdownDelay    time.Duration `env:"SHUTDOWN_DELAY" envDefault:"0s"`
	LogLevel         string        `env:"LOG_LEVEL" envDefault:"info"`

	// VerifyInterval and SweepInterval schedule stripe verify and the
	// sweeps (0: off), one replica at a time.
	VerifyInterval time.Duration `env:"VERIFY_INTERVAL" envDefault:"24h"`
	SweepInterval  time.Duration `env:"SWEEP_INTERVAL" envDefault:"5m"`
	// LeaderLeaseTTL is how long a scheduled job's lease (internal/leader)
	// outlives its last renewal: a leader that stops renewing loses the
	// lead within it, and another replica takes over within a third more.
	LeaderLeaseTTL time.Duration `env:"LEADER_LEASE_TTL" envDefault:"15s"`

	// AppWebhookURL, when set, receives every change of AppWebhookKinds
	// as a Standard Webhook signed with AppWebhookSecret (docs/APP.md).
	AppWebhookURL       string   `env:"APP_WEBHOOK_URL"`
	AppWebhookSecret    secret   `env:"APP_WEBHOOK_SECRET"`
	AppWebhookKinds     []string `env:"APP_WEBHOOK_KINDS" envDefault:"subscription,customer_features,checkout_session,support_message"`
	AppWebhookAllowHTTP bool     `env:"APP_WEBHOOK_ALLOW_HTTP" envDefault:"false"`

	// SweepMaxPages bounds the pages one Resend sweep pass reads.
	SweepMaxPages int `env:"SWEEP_MAX_PAGES" envDefault:"50"`
	// MailInflightBytes bounds the bytes all inbound mail in flight holds
	// at once (answers, attachment lists, downloads in memory and on disk).
	MailInflightBytes int64 `env:"MAIL_INFLIGHT_BYTES" envDefault:"67108864"`

	// DevMode lets serve start with the secrets published in this
	// repository (make dev, compose); anyone can sign with those.
	DevMode bool `env:"DEV_MODE" envDefault:"false"`

	// Parsed by validate.
	resendWebhook *svix.Webhook
	// appWebhook is the relay's app_webhook destination; nil when
	// APP_WEBHOOK_URL is empty.
	appWebhook     *relay.AppWebhook
	resendAPIURL   *url.URL
	stripeAPIURL   *url.URL
	inbound        resendhook.Inbound
	trustedProxies []netip.Prefix
	logLevel       slog.Level
}

// ClaimConfig is where and how deliveries are claimed. The service, the
// claims tool and stripe replay read these same variables, so they are
// declared, defaulted and checked once. Exported only because caarlos0/env
// cannot set the fields of an unexported embedded struct.
type ClaimConfig struct {
	RedisURL               secret        `env:"REDIS_URL"`
	RedisTimeout           time.Duration `env:"REDIS_TIMEOUT" envDefault:"250ms"`
	RedisKeyPrefix         string        `env:"REDIS_KEY_PREFIX" envDefault:"webhook"`
	HandlerTimeout         time.Duration `env:"HANDLER_TIMEOUT" envDefault:"30s"`
	ClaimProcessingTTL     time.Duration `env:"CLAIM_PROCESSING_TTL" envDefault:"120s"`
	StripeDedupeTTL        time.Duration `env:"STRIPE_DEDUPE_TTL" envDefault:"72h"`
	ResendDedupeTTL        time.Duration `env:"RESEND_DEDUPE_TTL" envDefault:"30h"`
	StripeClaimFailureMode string        `env:"STRIPE_CLAIM_FAILURE_MODE" envDefault:"open"`
	ResendClaimFailureMode string        `env:"RESEND_CLAIM_FAILURE_MODE" envDefault:"open"`
	PoisonAfter            int           `env:"POISON_AFTER" envDefault:"5"`
}

// check reports the claim settings' problems. REDIS_URL may be empty here
// (the service then runs without claims); a command that needs Redis says
// so itself.
func (c ClaimConfig) check(add addProblem) {
	if c.RedisURL != "" {
		if err := claim.CheckRedisURL(string(c.RedisURL)); err != nil {
			add("%v", err)
		}
	}
	positive := []struct {
		name    string
		d       time.Duration
		example string // the default
	}{
		{"REDIS_TIMEOUT", c.RedisTimeout, "250ms"},
		{"HANDLER_TIMEOUT", c.HandlerTimeout, "30s"},
		{"CLAIM_PROCESSING_TTL", c.ClaimProcessingTTL, "120s"},
		{"STRIPE_DEDUPE_TTL", c.StripeDedupeTTL, "72h"},
		{"RESEND_DEDUPE_TTL", c.ResendDedupeTTL, "30h"},
	}
	for _, v := range positive {
		if v.d <= 0 {
			add("%s must be positive: want a duration such as %s", v.name, v.example)
		}
	}
	if c.HandlerTimeout > 0 && c.ClaimProcessingTTL < 2*c.HandlerTimeout {
		add("CLAIM_PROCESSING_TTL (%s) must be at least twice HANDLER_TIMEOUT (%s): a claim must outlive any handler; want CLAIM_PROCESSING_TTL=%s or more, or a shorter HANDLER_TIMEOUT", c.ClaimProcessingTTL, c.HandlerTimeout, 2*c.HandlerTimeout)
	}
	if c.ClaimProcessingTTL > 0 && c.ClaimProcessingTTL%time.Millisecond != 0 {
		add("CLAIM_PROCESSING_TTL must be a whole number of milliseconds: want a duration such as 120s or 1500ms")
	}
	for _, m := range []struct{ name, mode string }{
		{"STRIPE_CLAIM_FAILURE_MODE", c.StripeClaimFailureMode},
		{"RESEND_CLAIM_FAILURE_MODE", c.ResendClaimFailureMode},
	} {
		if m.mode != "open" && m.mode != "closed" {
			add("%s is %q: want open or closed", m.name, m.mode)
		}
	}
	if c.PoisonAfter < 0 {
		add("POISON_AFTER must be at least 0: want a count of failed attempts such as 5, or 0 for off")
	}
}

// openStore connects to Redis and returns the claim store on it (a store
// without Redis when REDIS_URL is empty) and a func that closes the
// connection.
func (c ClaimConfig) openStore() (*claim.Store, func(), error) {
	rdb, err := claim.OpenRedis(string(c.RedisURL), c.RedisTimeout)
	if err != nil {
		return nil, nil, err
	}
	store := claim.NewStore(rdb, claim.StoreConfig{
		Prefix:        c.RedisKeyPrefix,
		Timeout:       c.RedisTimeout,
		ProcessingTTL: c.ClaimProcessingTTL,
	})
	return store, func() {
		if rdb != nil {
			_ = rdb.Close()
		}
	}, nil
}

// provider is a provider's claim settings.
func (c ClaimConfig) provider(name string) claim.Provider {
	ttl, mode := c.StripeDedupeTTL, c.StripeClaimFailureMode
	if name == "resend" {
		ttl, mode = c.ResendDedupeTTL, c.ResendClaimFailureMode
	}
	return claim.Provider{Name: name, DedupeTTL: ttl, FailClosed: mode == "closed"}
}

// defaultTrustedProxies are the private ranges and loopback, where a load
// balancer in front of the service usually stands.
const defaultTrustedProxies = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,127.0.0.0/8,::1/128,fc00::/7"

// migrateConfig is what the migrate command needs: a migration job should
// not have to carry the webhook secrets.
type migrateConfig struct {
	DatabaseURL        secret `env:"DATABASE_URL"`
	MigrateDatabaseURL secret `env:"MIGRATE_DATABASE_URL"`
	LogLevel           string `env:"LOG_LEVEL" envDefault:"info"`
}

func (c *migrateConfig) validate() []error {
	var p []error
	// Required even with MIGRATE_DATABASE_URL, as for serve: one
	// environment serves both.
	if strings.TrimSpace(string(c.DatabaseURL)) == "" {
		p = append(p, errors.New("DATABASE_URL is required: "+wantDatabaseURL))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		p = append(p, fmt.Errorf("LOG_LEVEL is %q: want debug, info, warn or error", c.LogLevel))
	}
	return p
}

// wantDatabaseURL is the form DATABASE_URL takes, for the messages that
// refuse it.
const wantDatabaseURL = "want postgres://user:password@host:port/dbname?sslmode=... (pgx also reads libpq's host=... dbname=... form)"

// secret holds a credential. It prints and logs as [redacted]; the value is
// read with an explicit string(s) where it is used.
type secret string

func (secret) String() string       { return "[redacted]" }
func (secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }
func (s secret) GoString() string   { return s.String() }

// MarshalText keeps the secret out of JSON and text encodings, which do not
// consult LogValue for a nested field.
func (secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Horizons of the providers' retries: a done key that expires sooner lets a
// late retry apply the event again (harmlessly, but needlessly).
const (
	stripeRetryHorizon = 72 * time.Hour
	resendRetryHorizon = 27*time.Hour + 35*time.Minute
)

// loadConfig parses and validates the environment, reporting every problem
// at once, one line each, each naming its variable.
func loadConfig(environ []string) (config, error) {
	return parseEnv[config](environ)
}

func loadMigrateConfig(environ []string) (migrateConfig, error) {
	return parseEnv[migrateConfig](environ)
}

// validator is a configuration struct whose validate also fills in what
// it parses.
type validator[T any] interface {
	*T
	validate() []error
}

func parseEnv[T any, P validator[T]](environ []string) (T, error) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	if _, set := vars["TRUSTED_PROXIES"]; !set {
		vars["TRUSTED_PROXIES"] = defaultTrustedProxies
	}
	cfg, err := env.ParseAsWithOptions[T](env.Options{Environment: vars})
	var problems []error
	unparsed := map[string]bool{}
	if err != nil {
		problems = parseProblems[T](err, vars)
		for _, p := range problems {
			name, _, _ := strings.Cut(p.Error(), " ")
			unparsed[name] = true
		}
	}
	// A value that did not parse is not reported a second time as out of
	// range (each problem starts with its variable's name).
	for _, p := range P(&cfg).validate() {
		if name, _, _ := strings.Cut(p.Error(), " "); !unparsed[name] {
			problems = append(problems, p)
		}
	}
	return cfg, errors.Join(problems...)
}

// parseProblems names the variable behind each of caarlos0/env's errors,
// which name only the struct field, and the form it wants. Only the value
// of a variable that is not a secret is quoted.
func parseProblems[T any](err error, vars map[string]string) []error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return []error{err}
	}
	out := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			f, _ := reflect.TypeFor[T]().FieldByName(pe.Name)
			name := f.Tag.Get("env")
			got := ""
			if f.Type != reflect.TypeFor[secret]() {
				got = fmt.Sprintf(" (%q)", vars[name])
			}
			out = append(out, fmt.Errorf("%s is invalid%s: %s", name, got, wantForm(f.Type)))
			continue
		}
		out = append(out, e)
	}
	return out
}

// wantForm says what a variable of type t looks like.
func wantForm(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "want a duration such as 250ms, 30s, 5m or 72h"
	case t.Kind() == reflect.Bool:
		return "want true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "want a whole number such as 10"
	case t.Kind() == reflect.Slice:
		return "want a comma-separated list"
	}
	return "want a " + t.String()
}

func (c *config) validate() []error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	c.checkRequired(add)
	c.parseEndpoints(add)
	c.parseSupport(add)
	c.parseAppWebhook(add)
	c.ClaimConfig.check(add)
	c.RelayConfig.check(add)
	c.AccessConfig.check(add)
	c.checkDurations(add)
	c.checkLimits(add)
	c.checkPublished(add)
	return p
}

// checkPublished refuses, outside DEV_MODE, the dev-only credentials
// written in this repository (Makefile's dev target, docker-compose.yml,
// README.md): anyone who reads them can sign a delivery. Each variable
// holding one is named. A webhook secret is compared without its whsec_
// prefix, which svix takes either way; a URL is searched for the password.
func (c *config) checkPublished(add addProblem) {
	if c.DevMode {
		return
	}
	const devPassword = "dev_only_postgres_password"
	published := []struct {
		name    string
		matches bool
	}{
		{"STRIPE_WEBHOOK_SECRET", strings.TrimPrefix(strings.TrimSpace(string(c.StripeWebhookSecret)), "whsec_") == "dev_only_stripe"},
		{"RESEND_WEBHOOK_SECRET", strings.TrimPrefix(strings.TrimSpace(string(c.ResendWebhookSecret)), "whsec_") == "ZGV2LW9ubHktcmVzZW5kLXNlY3JldA=="},
		{"RESEND_API_KEY", strings.TrimSpace(string(c.ResendAPIKey)) == "re_dev_only"},
		{"STRIPE_API_KEY", strings.TrimSpace(string(c.StripeAPIKey)) == "sk_test_dev_only"},
		{"DATABASE_URL", strings.Contains(string(c.DatabaseURL), devPassword)},
		{"MIGRATE_DATABASE_URL", strings.Contains(string(c.MigrateDatabaseURL), devPassword)},
	}
	for _, p := range published {
		if p.matches {
			add("%s is a secret published in this repository (make dev, docker-compose.yml): anyone can sign or call with it; want your own secret, or DEV_MODE=true on a development machine", p.name)
		}
	}
}

type addProblem func(format string, args ...any)

func (c *config) checkRequired(add addProblem) {
	required := []struct{ name, value, want string }{
		{"DATABASE_URL", string(c.DatabaseURL), wantDatabaseURL},
		{"STRIPE_WEBHOOK_SECRET", string(c.StripeWebhookSecret), wantStripeSecret},
		{"RESEND_WEBHOOK_SECRET", string(c.ResendWebhookSecret), wantResendSecret},
		{"RESEND_API_KEY", string(c.ResendAPIKey), "want a Resend API key, re_..., that can read received emails"},
		{"SUPPORT_INBOUND_ADDRESSES", strings.Join(c.SupportInboundAddresses, ""), "want comma-separated addresses or domains, such as support@munchable.app,@inbound.munchable.app"},
	}
	for _, r := range required {
		if strings.TrimSpace(r.value) == "" {
			add("%s is required: %s", r.name, r.want)
		}
	}
	checkAddr := func(name, addr string) {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			add("%s is %q: want host:port or :port, such as :8080 or 127.0.0.1:8080", name, addr)
		}
	}
	checkAddr("LISTEN_ADDR", c.ListenAddr)
	if c.MetricsAddr != "" { // optional
		checkAddr("METRICS_ADDR", c.MetricsAddr)
	}
	if c.MetricsAddr != "" && c.MetricsAddr == c.ListenAddr {
		add("METRICS_ADDR must differ from LISTEN_ADDR: it exists to keep /metrics off the public listener; want another port, such as :9090")
	}
	l, err := parseLevel(c.LogLevel)
	if err != nil {
		add("LOG_LEVEL is %q: want debug, info, warn or error", c.LogLevel)
	}
	c.logLevel = l
}

// The forms of the two signing secrets, for the messages that refuse them.
const (
	wantStripeSecret = "want the whsec_... signing secret of the Stripe endpoint (Dashboard > Developers > Webhooks, or `stripe listen --print-secret`)"
	wantResendSecret = "want the whsec_... signing secret of the Resend webhook (Dashboard > Webhooks)"
)

// parseEndpoints parses the URLs and the secrets that need more than a type.
func (c *config) parseEndpoints(add addProblem) {
	// Stripe signs with the secret's bytes as they are, so any string would
	// verify; but only a whsec_ value is a signing secret (an sk_ or rk_
	// key here is a mix-up, and would refuse every real delivery).
	if s := string(c.StripeWebhookSecret); s != "" && !strings.HasPrefix(s, "whsec_") {
		add("STRIPE_WEBHOOK_SECRET is invalid: %s", wantStripeSecret)
	}
	if c.ResendWebhookSecret != "" {
		wh, err := svix.NewWebhook(string(c.ResendWebhookSecret))
		if err != nil {
			add("RESEND_WEBHOOK_SECRET is invalid: %s", wantResendSecret)
		}
		c.resendWebhook = wh
	}
	var ok bool
	if c.resendAPIURL, ok = parseHTTPURL(c.ResendAPIURL); !ok {
		add("RESEND_API_URL is invalid: want an http(s) URL such as https://api.resend.com")
	}
	if c.stripeAPIURL, ok = parseHTTPURL(c.StripeAPIURL); !ok {
		add("STRIPE_API_URL is invalid: want an http(s) URL such as https://api.stripe.com")
	}
	if r := c.SupportFormRedirectURL; r != "" {
		if _, ok := parseHTTPURL(r); !ok && !strings.HasPrefix(r, "/") {
			add("SUPPORT_FORM_REDIRECT_URL is invalid: want an http(s) URL such as https://munchable.app/support/thanks, or a path such as /thanks")
		}
	}
}

// wantAppWebhookSecret is APP_WEBHOOK_SECRET's form, for the messages
// that refuse it.
const wantAppWebhookSecret = "want whsec_ and 24 to 64 random bytes in base64, such as whsec_$(openssl rand -base64 32)"

// parseAppWebhook checks the app's webhook and builds its destination.
// The URL is never quoted back: its query may hold the app's own token.
func (c *config) parseAppWebhook(add addProblem) {
	c.appWebhook = nil
	bad := false
	problem := func(format string, args ...any) { bad = true; add(format, args...) }
	kinds := make([]string, 0, len(c.AppWebhookKinds))
	for _, k := range c.AppWebhookKinds {
		k = strings.TrimSpace(k)
		if !relay.IsAppWebhookKind(k) {
			problem("APP_WEBHOOK_KINDS has %q: want a comma-separated list of subscription, customer_features, checkout_session, support_message, access", k)
		}
		kinds = append(kinds, k)
	}
	if c.AppWebhookURL == "" {
		return
	}
	u, ok := parseHTTPURL(c.AppWebhookURL)
	switch {
	case !ok:
		problem("APP_WEBHOOK_URL is invalid: want an https URL such as https://app.example.com/hooks/munchable")
	case u.Scheme == "http" && !c.AppWebhookAllowHTTP:
		problem("APP_WEBHOOK_URL is http: want https (the payloads name customers and their access), or APP_WEBHOOK_ALLOW_HTTP=true for a local app or a test")
	}
	secret := string(c.AppWebhookSecret)
	if secret == "" {
		problem("APP_WEBHOOK_SECRET is required with APP_WEBHOOK_URL: %s", wantAppWebhookSecret)
	} else if key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_")); !strings.HasPrefix(secret, "whsec_") || err != nil || len(key) < 24 || len(key) > 64 {
		// The Standard Webhooks spec's bounds: at least 24 bytes, at most 64.
		problem("APP_WEBHOOK_SECRET is invalid: %s", wantAppWebhookSecret)
	}
	if bad {
		return
	}
	wh, err := relay.NewAppWebhook(relay.AppWebhookConfig{
		URL: c.AppWebhookURL, Secret: secret, Kinds: kinds, AllowHTTP: c.AppWebhookAllowHTTP,
	})
	if err != nil { // checked above; kept so that a new check there is not missed
		add("APP_WEBHOOK_URL is refused (%v): want an https URL and a whsec_ secret", err)
		return
	}
	c.appWebhook = wh
}

func parseHTTPURL(s string) (*url.URL, bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, false
	}
	return u, true
}

// parseSupport parses the inbound addresses, the form's origins and the
// trusted proxies.
func (c *config) parseSupport(add addProblem) {
	in, bad := resendhook.ParseInbound(c.SupportInboundAddresses)
	for _, a := range bad {
		add("SUPPORT_INBOUND_ADDRESSES has %q: want user@domain or @domain", a)
	}
	c.inbound = in
	for _, o := range c.SupportFormOrigins {
		if u, ok := parseHTTPURL(strings.TrimSpace(o)); !ok || u.Path != "" || u.RawQuery != "" {
			add("SUPPORT_FORM_ORIGINS has %q: want an origin such as https://munchable.app", o)
		}
	}
	c.trustedProxies = nil
	for _, cidr := range c.TrustedProxies {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(cidr))
		if err != nil {
			add("TRUSTED_PROXIES has %q: want a CIDR such as 10.0.0.0/8", cidr)
			continue
		}
		c.trustedProxies = append(c.trustedProxies, pfx.Masked())
	}
}

func (c *config) checkDurations(add addProblem) {
	if c.BodyReadTimeout <= 0 {
		add("BODY_READ_TIMEOUT must be positive: want a duration such as 10s")
	}
	if c.ShutdownDelay < 0 {
		add("SHUTDOWN_DELAY must not be negative: want 0s or a duration such as 5s")
	}
	if c.EventsRetention < 0 {
		add("EVENTS_RETENTION must not be negative: want 0 (keep every row) or a duration such as 720h")
	}
	if c.VerifyInterval != 0 && c.VerifyInterval < time.Hour {
		add("VERIFY_INTERVAL is %s: want 0 (off) or at least 1h, such as 24h (a verify lists the whole account)", c.VerifyInterval)
	}
	if c.SweepInterval != 0 && (c.SweepInterval < 10*time.Second || c.SweepInterval > maxSweepInterval) {
		add("SWEEP_INTERVAL is %s: want 0 (off) or a duration from 10s to %s, such as 5m", c.SweepInterval, maxSweepInterval)
	}
	// At most 20s: a frozen leader is then replaced within 30s (the TTL,
	// and a third of it for the others' next check).
	if c.LeaderLeaseTTL < time.Second || c.LeaderLeaseTTL > 20*time.Second {
		add("LEADER_LEASE_TTL is %s: want a duration from 1s to 20s, such as 15s", c.LeaderLeaseTTL)
	}
}

// maxSweepInterval keeps a sweep's window, the interval and its overlap,
// well inside Stripe's 30 days of events.
const maxSweepInterval = 24 * time.Hour

func (c *config) checkLimits(add addProblem) {
	atLeast := []struct {
		name     string
		got, min int64
		want     string
	}{
		{"SUPPORT_FORM_RATE", int64(c.SupportFormRate), 1, "posts a minute per client address, such as 10"},
		{"DATABASE_MAX_CONNS", int64(c.DatabaseMaxConns), 1, "connections per process, such as 16"},
		{"SUPPORT_ATTACHMENT_MAX_BYTES", c.SupportAttachmentMaxBytes, 0, "a size in bytes, such as 10485760 (10 MiB)"},
		// Twice the webhooks' 1 MiB cap: a growing body may use only the
		// part of the budget outside the first-chunk reserve, which is at
		// most half of it, and a 1 MiB delivery must fit there.
		{"MAX_INFLIGHT_BODY_BYTES", c.MaxInflightBodyBytes, 2 << 20, "a size in bytes, such as 33554432 (32 MiB)"},
		{"MAX_CONNECTIONS", int64(c.MaxConnections), 1, "connections per listener, such as 1024"},
		{"MAX_CONNECTIONS_PER_CLIENT", int64(c.MaxConnectionsPerClient), 0, "0 (no cap) or connections one client address may hold per listener, such as 64"},
		{"BODY_MIN_RATE", c.BodyMinRate, 0, "0 (no minimum) or bytes a second, such as 1024"},
		{"SWEEP_MAX_PAGES", int64(c.SweepMaxPages), 1, "pages a sweep pass reads, such as 50"},
		// One mail at the caps must fit alone: its answer, a page of its
		// attachment list and one attachment of the largest size stored.
		{"MAIL_INFLIGHT_BYTES", c.MailInflightBytes, resendhook.MinMailInflightBytes(max(c.SupportAttachmentMaxBytes, 0)),
			"a size in bytes, such as 67108864 (64 MiB); the least is one mail at the caps with one attachment of SUPPORT_ATTACHMENT_MAX_BYTES"},
	}
	for _, v := range atLeast {
		if v.got < v.min {
			add("%s must be at least %d: want %s", v.name, v.min, v.want)
		}
	}
}

// warnings are settings that work but that an operator should hear about.
// shutdownGrace bounds serve's drain after SIGTERM: a delivery whose
// body was still arriving reads it (BODY_READ_TIMEOUT), runs its handler
// (HANDLER_TIMEOUT) and confirms or releases its claim (a Redis call each
// way), with 5 s to spare. deploy's grace period is sized from it.
func (c *config) shutdownGrace() time.Duration {
	return c.BodyReadTimeout + c.HandlerTimeout + 2*c.RedisTimeout + 5*time.Second
}

func (c *config) warnings() []string {
	var w []string
	if c.RedisURL == "" {
		w = append(w, "REDIS_URL is empty: claims are disabled and every delivery runs degraded")
	}
	if c.StripeDedupeTTL < stripeRetryHorizon {
		w = append(w, "STRIPE_DEDUPE_TTL is shorter than Stripe's 3-day retry horizon: late retries will be applied again")
	}
	if c.ResendDedupeTTL < resendRetryHorizon {
		w = append(w, "RESEND_DEDUPE_TTL is shorter than Svix's 27h35m retry horizon: late retries will be applied again")
	}
	if c.AppWebhookURL == "" && c.AppWebhookSecret != "" {
		w = append(w, "APP_WEBHOOK_SECRET is set but APP_WEBHOOK_URL is empty: the app's webhook is off")
	}
	for _, p := range c.trustedProxies {
		if doc, ok := documentationRange(p); ok {
			w = append(w, fmt.Sprintf("TRUSTED_PROXIES has %s, inside the documentation range %s (deploy/configmap.yaml's placeholder): "+
				"no load balancer stands there, so every client behind yours shares one support-form rate limit "+
				"and one address's MAX_CONNECTIONS_PER_CLIENT connections (the providers too: beyond it, 503); "+
				"set TRUSTED_PROXIES to your load balancer's addresses (such as 10.0.0.0/8), or to \"\" when clients connect directly", p, doc))
		}
	}
	return w
}

// documentationRange returns the address block reserved for examples
// (RFC 5737, RFC 3849) that p lies in, if any: a placeholder, never a real
// proxy.
func documentationRange(p netip.Prefix) (netip.Prefix, bool) {
	for _, s := range []string{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"} {
		doc := netip.MustParsePrefix(s)
		if doc.Bits() <= p.Bits() && doc.Contains(p.Addr()) {
			return doc, true
		}
	}
	return netip.Prefix{}, false
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
