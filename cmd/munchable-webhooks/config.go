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
)

// config is the service's whole configuration, read from the environment
// (CONTRACT.md lists every variable).
type config struct {
	ListenAddr     string        `env:"LISTEN_ADDR" envDefault:":8080"`
	DatabaseURL    secret        `env:"DATABASE_URL"`
	RedisURL       secret        `env:"REDIS_URL"`
	RedisTimeout   time.Duration `env:"REDIS_TIMEOUT" envDefault:"250ms"`
	RedisKeyPrefix string        `env:"REDIS_KEY_PREFIX" envDefault:"webhook"`

	StripeWebhookSecret secret `env:"STRIPE_WEBHOOK_SECRET"`
	ResendWebhookSecret secret `env:"RESEND_WEBHOOK_SECRET"`
	ResendAPIKey        secret `env:"RESEND_API_KEY"`
	ResendAPIURL        string `env:"RESEND_API_URL" envDefault:"https://api.resend.com"`

	SupportInboundAddresses []string `env:"SUPPORT_INBOUND_ADDRESSES"`
	SupportFormRate         int      `env:"SUPPORT_FORM_RATE" envDefault:"10"`
	TrustedProxies          []string `env:"TRUSTED_PROXIES" envDefault:"10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,127.0.0.0/8,::1/128,fc00::/7"`

	HandlerTimeout         time.Duration `env:"HANDLER_TIMEOUT" envDefault:"30s"`
	ClaimProcessingTTL     time.Duration `env:"CLAIM_PROCESSING_TTL" envDefault:"120s"`
	StripeDedupeTTL        time.Duration `env:"STRIPE_DEDUPE_TTL" envDefault:"72h"`
	ResendDedupeTTL        time.Duration `env:"RESEND_DEDUPE_TTL" envDefault:"30h"`
	StripeClaimFailureMode string        `env:"STRIPE_CLAIM_FAILURE_MODE" envDefault:"open"`
	ResendClaimFailureMode string        `env:"RESEND_CLAIM_FAILURE_MODE" envDefault:"open"`

	DatabaseMaxConns int           `env:"DATABASE_MAX_CONNS" envDefault:"16"`
	ShutdownDelay    time.Duration `env:"SHUTDOWN_DELAY" envDefault:"0s"`
	LogLevel         string        `env:"LOG_LEVEL" envDefault:"info"`
}

// migrateConfig is what the migrate command needs: a migration job should
// not have to carry the webhook secrets.
type migrateConfig struct {
	DatabaseURL secret `env:"DATABASE_URL"`
	LogLevel    string `env:"LOG_LEVEL" envDefault:"info"`
}

func (c migrateConfig) validate() []error {
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

func parseEnv[T interface{ validate() []error }](environ []string) (T, error) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
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
	for _, p := range cfg.validate() {
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

func (c config) validate() []error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	required := map[string]string{
		"DATABASE_URL":              string(c.DatabaseURL),
		"STRIPE_WEBHOOK_SECRET":     string(c.StripeWebhookSecret),
		"RESEND_WEBHOOK_SECRET":     string(c.ResendWebhookSecret),
		"RESEND_API_KEY":            string(c.ResendAPIKey),
		"SUPPORT_INBOUND_ADDRESSES": strings.Join(c.SupportInboundAddresses, ""),
	}
	for _, name := range []string{"DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "RESEND_WEBHOOK_SECRET", "RESEND_API_KEY", "SUPPORT_INBOUND_ADDRESSES"} {
		if strings.TrimSpace(required[name]) == "" {
			add("%s is required", name)
		}
	}
	if c.ListenAddr == "" {
		add("LISTEN_ADDR must not be empty")
	}
	if c.RedisURL != "" {
		if _, err := redis.ParseURL(string(c.RedisURL)); err != nil {
			add("REDIS_URL is invalid: want redis://host:port[/db] or rediss://...")
		}
	}
	if c.ResendWebhookSecret != "" {
		if _, err := svix.NewWebhook(string(c.ResendWebhookSecret)); err != nil {
			add("RESEND_WEBHOOK_SECRET is invalid: want the whsec_... signing secret from the Resend webhook")
		}
	}
	if u, err := url.Parse(c.ResendAPIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add("RESEND_API_URL is invalid: want an http(s) URL")
	}
	for _, a := range c.SupportInboundAddresses {
		if !validInbound(strings.TrimSpace(a)) {
			add("SUPPORT_INBOUND_ADDRESSES has %q: want user@domain or @domain", a)
		}
	}
	for _, cidr := range c.TrustedProxies {
		if _, err := netip.ParsePrefix(strings.TrimSpace(cidr)); err != nil {
			add("TRUSTED_PROXIES has %q: want a CIDR such as 10.0.0.0/8", cidr)
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
	if c.SupportFormRate < 1 {
		add("SUPPORT_FORM_RATE must be at least 1")
	}
	if c.ShutdownDelay < 0 {
		add("SHUTDOWN_DELAY must not be negative")
	}
	if c.DatabaseMaxConns < 1 {
		add("DATABASE_MAX_CONNS must be at least 1")
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		add("LOG_LEVEL is %q: want debug, info, warn or error", c.LogLevel)
	}
	return p
}

// trustedProxies parses TRUSTED_PROXIES (validated already).
func (c config) trustedProxies() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(c.TrustedProxies))
	for _, cidr := range c.TrustedProxies {
		if p, err := netip.ParsePrefix(strings.TrimSpace(cidr)); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// warnings are settings that work but that an operator should hear about.
func (c config) warnings() []string {
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

func validInbound(a string) bool {
	local, domain, ok := strings.Cut(a, "@")
	return ok && domain != "" && !strings.ContainsAny(domain, "@ ") && !strings.ContainsAny(local, " ")
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}
