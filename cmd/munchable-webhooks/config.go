package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/redis/go-redis/v9"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
)

// config is the service's whole configuration, read from the environment
// (README.md lists every variable). validate also parses, once, the values
// that packages take in a typed form, into the unexported fields.
type config struct {
	ListenAddr  string `env:"LISTEN_ADDR" envDefault:":8080"`
	MetricsAddr string `env:"METRICS_ADDR"`
	DatabaseURL secret `env:"DATABASE_URL"`
	ClaimConfig

	StripeWebhookSecret secret `env:"STRIPE_WEBHOOK_SECRET"`
	StripeAPIKey        secret `env:"STRIPE_API_KEY"`
	StripeAPIURL        string `env:"STRIPE_API_URL" envDefault:"https://api.stripe.com"`
	ResendWebhookSecret secret `env:"RESEND_WEBHOOK_SECRET"`
	ResendAPIKey        secret `env:"RESEND_API_KEY"`
	ResendAPIURL        string `env:"RESEND_API_URL" envDefault:"https://api.resend.com"`

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

	// EventsRetention is how long the ledger and the feed keep their rows;
	// 0 keeps them.
	EventsRetention time.Duration `env:"EVENTS_RETENTION" envDefault:"720h"`

	DatabaseMaxConns int           `env:"DATABASE_MAX_CONNS" envDefault:"16"`
	ShutdownDelay    time.Duration `env:"SHUTDOWN_DELAY" envDefault:"0s"`
	LogLevel         string        `env:"LOG_LEVEL" envDefault:"info"`

	// Parsed by validate.
	resendWebhook  *svix.Webhook
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
		if _, err := redis.ParseURL(string(c.RedisURL)); err != nil {
			add("REDIS_URL is invalid: want redis://host:port[/db] or rediss://host:port[/db]")
		}
	}
	positive := []struct {
		name string
		d    time.Duration
	}{
		{"REDIS_TIMEOUT", c.RedisTimeout},
		{"HANDLER_TIMEOUT", c.HandlerTimeout},
		{"CLAIM_PROCESSING_TTL", c.ClaimProcessingTTL},
		{"STRIPE_DEDUPE_TTL", c.StripeDedupeTTL},
		{"RESEND_DEDUPE_TTL", c.ResendDedupeTTL},
	}
	for _, v := range positive {
		if v.d <= 0 {
			add("%s must be positive", v.name)
		}
	}
	if c.HandlerTimeout > 0 && c.ClaimProcessingTTL < 2*c.HandlerTimeout {
		add("CLAIM_PROCESSING_TTL (%s) must be at least twice HANDLER_TIMEOUT (%s): a claim must outlive any handler", c.ClaimProcessingTTL, c.HandlerTimeout)
	}
	if c.ClaimProcessingTTL > 0 && c.ClaimProcessingTTL%time.Millisecond != 0 {
		add("CLAIM_PROCESSING_TTL must be a whole number of milliseconds")
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
		add("POISON_AFTER must be at least 0")
	}
}

// openStore connects to Redis and returns the claim store on it (a store
// without Redis when REDIS_URL is empty) and a func that closes the
// connection.
func (c ClaimConfig) openStore() (*claim.Store, func(), error) {
	rdb, err := openRedis(string(c.RedisURL), c.RedisTimeout)
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
	DatabaseURL secret `env:"DATABASE_URL"`
	LogLevel    string `env:"LOG_LEVEL" envDefault:"info"`
}

func (c *migrateConfig) validate() []error {
	var p []error
	if strings.TrimSpace(string(c.DatabaseURL)) == "" {
		p = append(p, errors.New("DATABASE_URL is required"))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		p = append(p, fmt.Errorf("LOG_LEVEL is %q: want debug, info, warn or error", c.LogLevel))
	}
	return p
}

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
		problems = parseProblems[T](err)
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
// which name only the struct field.
func parseProblems[T any](err error) []error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return []error{err}
	}
	out := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			f, _ := reflect.TypeFor[T]().FieldByName(pe.Name)
			out = append(out, fmt.Errorf("%s is invalid: %w", f.Tag.Get("env"), pe.Err))
			continue
		}
		out = append(out, e)
	}
	return out
}

func (c *config) validate() []error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	c.checkRequired(add)
	c.parseEndpoints(add)
	c.parseSupport(add)
	c.ClaimConfig.check(add)
	c.checkDurations(add)
	c.checkLimits(add)
	return p
}

type addProblem func(format string, args ...any)

func (c *config) checkRequired(add addProblem) {
	required := []struct{ name, value string }{
		{"DATABASE_URL", string(c.DatabaseURL)},
		{"STRIPE_WEBHOOK_SECRET", string(c.StripeWebhookSecret)},
		{"RESEND_WEBHOOK_SECRET", string(c.ResendWebhookSecret)},
		{"RESEND_API_KEY", string(c.ResendAPIKey)},
		{"SUPPORT_INBOUND_ADDRESSES", strings.Join(c.SupportInboundAddresses, "")},
	}
	for _, r := range required {
		if strings.TrimSpace(r.value) == "" {
			add("%s is required", r.name)
		}
	}
	if c.ListenAddr == "" {
		add("LISTEN_ADDR must not be empty")
	}
	if c.MetricsAddr != "" && c.MetricsAddr == c.ListenAddr {
		add("METRICS_ADDR must differ from LISTEN_ADDR: it exists to keep /metrics off the public listener")
	}
	l, err := parseLevel(c.LogLevel)
	if err != nil {
		add("LOG_LEVEL is %q: want debug, info, warn or error", c.LogLevel)
	}
	c.logLevel = l
}

// parseEndpoints parses the URLs and the secret that need more than a type.
func (c *config) parseEndpoints(add addProblem) {
	if c.ResendWebhookSecret != "" {
		wh, err := svix.NewWebhook(string(c.ResendWebhookSecret))
		if err != nil {
			add("RESEND_WEBHOOK_SECRET is invalid: want the whsec_... signing secret from the Resend webhook")
		}
		c.resendWebhook = wh
	}
	var ok bool
	if c.resendAPIURL, ok = parseHTTPURL(c.ResendAPIURL); !ok {
		add("RESEND_API_URL is invalid: want an http(s) URL")
	}
	if c.stripeAPIURL, ok = parseHTTPURL(c.StripeAPIURL); !ok {
		add("STRIPE_API_URL is invalid: want an http(s) URL")
	}
	if r := c.SupportFormRedirectURL; r != "" {
		if _, ok := parseHTTPURL(r); !ok && !strings.HasPrefix(r, "/") {
			add("SUPPORT_FORM_REDIRECT_URL is invalid: want an http(s) URL or a path")
		}
	}
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
		add("BODY_READ_TIMEOUT must be positive")
	}
	if c.ShutdownDelay < 0 {
		add("SHUTDOWN_DELAY must not be negative")
	}
	if c.EventsRetention < 0 {
		add("EVENTS_RETENTION must not be negative (0 keeps every row)")
	}
}

func (c *config) checkLimits(add addProblem) {
	atLeast := []struct {
		name     string
		got, min int64
	}{
		{"SUPPORT_FORM_RATE", int64(c.SupportFormRate), 1},
		{"DATABASE_MAX_CONNS", int64(c.DatabaseMaxConns), 1},
		{"SUPPORT_ATTACHMENT_MAX_BYTES", c.SupportAttachmentMaxBytes, 0},
		{"MAX_INFLIGHT_BODY_BYTES", c.MaxInflightBodyBytes, 1 << 20},
	}
	for _, v := range atLeast {
		if v.got < v.min {
			add("%s must be at least %d", v.name, v.min)
		}
	}
}

// warnings are settings that work but that an operator should hear about.
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
	return w
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
