package main

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"bytes"
)

// validEnv is a complete, valid environment with recognisable secrets.
func validEnv() map[string]string {
	return map[string]string{
		"DATABASE_URL":              "postgres://app:db-password-42@127.0.0.1:5432/app",
		"STRIPE_WEBHOOK_SECRET":     "whsec_stripe_secret_value",
		"RESEND_WEBHOOK_SECRET":     "whsec_c2VjcmV0LXJlc2VuZC1rZXktMTIzNDU2Nzg=",
		"RESEND_API_KEY":            "re_api_key_value",
		"SUPPORT_INBOUND_ADDRESSES": "support@munchable.app,@inbound.munchable.app",
	}
}

func environ(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(environ(validEnv()))
	if err != nil {
		t.Fatalf("valid environment refused: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"LISTEN_ADDR", cfg.ListenAddr, ":8080"},
		{"REDIS_TIMEOUT", cfg.RedisTimeout, 250 * time.Millisecond},
		{"RESEND_API_URL", cfg.ResendAPIURL, "https://api.resend.com"},
		{"HANDLER_TIMEOUT", cfg.HandlerTimeout, 30 * time.Second},
		{"CLAIM_PROCESSING_TTL", cfg.ClaimProcessingTTL, 120 * time.Second},
		{"STRIPE_DEDUPE_TTL", cfg.StripeDedupeTTL, 72 * time.Hour},
		{"RESEND_DEDUPE_TTL", cfg.ResendDedupeTTL, 30 * time.Hour},
		{"STRIPE_CLAIM_FAILURE_MODE", cfg.StripeClaimFailureMode, "open"},
		{"RESEND_CLAIM_FAILURE_MODE", cfg.ResendClaimFailureMode, "open"},
		{"SUPPORT_FORM_RATE", cfg.SupportFormRate, 10},
		{"LOG_LEVEL", cfg.LogLevel, "info"},
		{"REDIS_KEY_PREFIX", cfg.RedisKeyPrefix, "webhook"},
		{"MAX_CONNECTIONS", cfg.MaxConnections, 1024},
		{"SUPPORT_INBOUND_ADDRESSES", strings.Join(cfg.SupportInboundAddresses, ";"), "support@munchable.app;@inbound.munchable.app"},
		{"RELAY_RETRY_SCHEDULE", fmt.Sprint(cfg.RelayRetrySchedule), "[5s 5m0s 30m0s 2h0m0s 5h0m0s 10h0m0s 10h0m0s]"},
		{"SUPPORT_FORWARD_TO", len(cfg.SupportForwardTo), 0},
		{"SUPPORT_FORWARD_RATE", cfg.SupportForwardRate, 2.0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if w := cfg.warnings(); len(w) != 1 || !strings.Contains(w[0], "REDIS_URL") {
		t.Errorf("warnings = %q, want one about the empty REDIS_URL", w)
	}
}

func TestConfigProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		set  map[string]string
		drop []string
		want []string // lines the error must contain
	}{
		{"everything required missing", nil,
			[]string{"DATABASE_URL", "STRIPE_WEBHOOK_SECRET", "RESEND_WEBHOOK_SECRET", "RESEND_API_KEY", "SUPPORT_INBOUND_ADDRESSES"},
			[]string{"DATABASE_URL is required", "STRIPE_WEBHOOK_SECRET is required", "RESEND_WEBHOOK_SECRET is required", "RESEND_API_KEY is required", "SUPPORT_INBOUND_ADDRESSES is required"}},
		{"processing TTL under twice the deadline", map[string]string{"HANDLER_TIMEOUT": "60s", "CLAIM_PROCESSING_TTL": "119s"}, nil,
			[]string{"CLAIM_PROCESSING_TTL (1m59s) must be at least twice HANDLER_TIMEOUT (1m0s)"}},
		{"unparseable duration", map[string]string{"REDIS_TIMEOUT": "soon"}, nil, []string{"REDIS_TIMEOUT is invalid"}},
		{"unparseable number", map[string]string{"SUPPORT_FORM_RATE": "lots"}, nil, []string{"SUPPORT_FORM_RATE is invalid"}},
		{"failure modes", map[string]string{"STRIPE_CLAIM_FAILURE_MODE": "maybe", "RESEND_CLAIM_FAILURE_MODE": "shut"}, nil,
			[]string{`STRIPE_CLAIM_FAILURE_MODE is "maybe"`, `RESEND_CLAIM_FAILURE_MODE is "shut"`}},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, nil, []string{`LOG_LEVEL is "loud"`}},
		{"redis url", map[string]string{"REDIS_URL": "http://nope"}, nil, []string{"REDIS_URL is invalid"}},
		{"redis sentinel url without a name", map[string]string{"REDIS_URL": "redis://s1:26379?master_name="}, nil, []string{"REDIS_URL is invalid: want redis[s]://"}},
		{"redis url with an unknown option", map[string]string{"REDIS_URL": "redis://h1:6379?addr=h2:6379&colour=blue"}, nil, []string{"master_name=NAME"}},
		{"svix secret", map[string]string{"RESEND_WEBHOOK_SECRET": "whsec_***not base64***"}, nil, []string{"RESEND_WEBHOOK_SECRET is invalid"}},
		{"inbound address", map[string]string{"SUPPORT_INBOUND_ADDRESSES": "support,@"}, nil,
			[]string{`SUPPORT_INBOUND_ADDRESSES has "support"`, `SUPPORT_INBOUND_ADDRESSES has "@"`}},
		{"non-positive durations", map[string]string{"HANDLER_TIMEOUT": "0s", "STRIPE_DEDUPE_TTL": "-1h"}, nil,
			[]string{"HANDLER_TIMEOUT must be positive", "STRIPE_DEDUPE_TTL must be positive"}},
		{"trusted proxies", map[string]string{"TRUSTED_PROXIES": "10.0.0.0/8,lan"}, nil, []string{`TRUSTED_PROXIES has "lan"`}},
		{"connections and body budget", map[string]string{"MAX_CONNECTIONS": "0", "MAX_INFLIGHT_BODY_BYTES": "1048576"}, nil,
			[]string{"MAX_CONNECTIONS must be at least 1", "MAX_INFLIGHT_BODY_BYTES must be at least 2097152"}},
		{"per-client connections and body rate", map[string]string{"MAX_CONNECTIONS_PER_CLIENT": "-1", "BODY_MIN_RATE": "-5"}, nil,
			[]string{"MAX_CONNECTIONS_PER_CLIENT must be at least 0", "BODY_MIN_RATE must be at least 0"}},
		{"stripe secret is an API key", map[string]string{"STRIPE_WEBHOOK_SECRET": "sk_test_123"}, nil, []string{"STRIPE_WEBHOOK_SECRET is invalid: want the whsec_"}},
		{"listen addresses", map[string]string{"LISTEN_ADDR": "8080", "METRICS_ADDR": "metrics"}, nil,
			[]string{`LISTEN_ADDR is "8080": want host:port`, `METRICS_ADDR is "metrics": want host:port`}},
		{"metrics on the listener", map[string]string{"LISTEN_ADDR": ":8080", "METRICS_ADDR": ":8080"}, nil, []string{"METRICS_ADDR must differ from LISTEN_ADDR"}},
		{"limits", map[string]string{"SUPPORT_FORM_RATE": "0", "MAX_INFLIGHT_BODY_BYTES": "10", "POISON_AFTER": "-1"}, nil,
			[]string{"SUPPORT_FORM_RATE must be at least 1", "MAX_INFLIGHT_BODY_BYTES must be at least 2097152", "POISON_AFTER must be at least 0"}},
		{"intake durations", map[string]string{"BODY_READ_TIMEOUT": "0s", "SHUTDOWN_DELAY": "-1s", "CLAIM_PROCESSING_TTL": "120000001us"}, nil,
			[]string{"BODY_READ_TIMEOUT must be positive", "SHUTDOWN_DELAY must not be negative", "CLAIM_PROCESSING_TTL must be a whole number of milliseconds"}},
		{"schedules", map[string]string{"VERIFY_INTERVAL": "5m", "SWEEP_INTERVAL": "1s", "LEADER_LEASE_TTL": "30s"}, nil,
			[]string{"VERIFY_INTERVAL is 5m0s: want 0 (off) or at least 1h", "SWEEP_INTERVAL is 1s: want 0 (off) or a duration from 10s to 24h0m0s",
				"LEADER_LEASE_TTL is 30s: want a duration from 1s to 20s"}},
		{"forward without a sender", map[string]string{"SUPPORT_FORWARD_TO": "team@munchable.app"}, nil,
			[]string{"SUPPORT_FORWARD_FROM is required with SUPPORT_FORWARD_TO"}},
		{"forward to itself", map[string]string{"SUPPORT_FORWARD_TO": "team@munchable.app,Bad <x@y>", "SUPPORT_FORWARD_FROM": "Team <TEAM@munchable.app>", "SUPPORT_FORWARD_RATE": "0"}, nil,
			[]string{`SUPPORT_FORWARD_TO has "Bad <x@y>"`, "SUPPORT_FORWARD_FROM must not be one of SUPPORT_FORWARD_TO", "SUPPORT_FORWARD_RATE is 0"}},
		{"relay schedule", map[string]string{"RELAY_RETRY_SCHEDULE": "5s,-1m"}, nil, []string{"RELAY_RETRY_SCHEDULE has -1m0s"}},
		{"urls", map[string]string{"RESEND_API_URL": "api.resend.com", "STRIPE_API_URL": "ftp://x", "SUPPORT_FORM_REDIRECT_URL": "thanks", "SUPPORT_FORM_ORIGINS": "munchable.app"}, nil,
			[]string{"RESEND_API_URL is invalid", "STRIPE_API_URL is invalid", "SUPPORT_FORM_REDIRECT_URL is invalid", `SUPPORT_FORM_ORIGINS has "munchable.app"`}},
		{"app webhook over http", map[string]string{"APP_WEBHOOK_URL": "http://127.0.0.1:8090/hooks?token=app-token-7", "APP_WEBHOOK_SECRET": appWebhookSecret}, nil,
			[]string{"APP_WEBHOOK_URL is http: want https"}},
		{"app webhook without a secret", map[string]string{"APP_WEBHOOK_URL": "https://app.example/hooks"}, nil,
			[]string{"APP_WEBHOOK_SECRET is required with APP_WEBHOOK_URL"}},
		{"app webhook secret too short", map[string]string{"APP_WEBHOOK_URL": "https://app.example/hooks", "APP_WEBHOOK_SECRET": "whsec_c2hvcnQ="}, nil,
			[]string{"APP_WEBHOOK_SECRET is invalid: want whsec_"}},
		{"app webhook secret without whsec_", map[string]string{"APP_WEBHOOK_URL": "https://app.example/hooks", "APP_WEBHOOK_SECRET": "YXBwLXdlYmhvb2stY29uZmlnLXNlY3JldCE="}, nil,
			[]string{"APP_WEBHOOK_SECRET is invalid: want whsec_"}},
		{"app webhook url and kinds", map[string]string{"APP_WEBHOOK_URL": "app.example/hooks?token=app-token-7", "APP_WEBHOOK_SECRET": appWebhookSecret, "APP_WEBHOOK_KINDS": "subscription,invoice"}, nil,
			[]string{"APP_WEBHOOK_URL is invalid: want an https URL", `APP_WEBHOOK_KINDS has "invoice"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := validEnv()
			for _, k := range tt.drop {
				delete(env, k)
			}
			for k, v := range tt.set {
				env[k] = v
			}
			_, err := loadConfig(environ(env))
			if err == nil {
				t.Fatal("loadConfig accepted a bad environment")
			}
			lines := strings.Split(err.Error(), "\n")
			for _, want := range tt.want {
				found := false
				for _, l := range lines {
					if strings.Contains(l, want) {
						found = true
					}
				}
				if !found {
					t.Errorf("no line contains %q in:\n%s", want, err)
				}
			}
			if len(lines) != len(tt.want) {
				t.Errorf("got %d problem lines, want %d:\n%s", len(lines), len(tt.want), err)
			}
			// Each line says what to set instead.
			for _, l := range lines {
				if !strings.Contains(l, "want ") {
					t.Errorf("%q does not say what is wanted", l)
				}
			}
			for _, s := range []string{"db-password-42", "whsec_stripe_secret_value", "re_api_key_value", "sk_test_123", "YXBwLXdlYmhvb2stY29uZmlnLXNlY3JldCE", "app-token-7"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error reveals a secret: %s", err)
				}
			}
		})
	}
}

// TestRedisURLForms: the service starts with REDIS_URL in each of
// go-redis's three forms (internal/claim reads them) and refuses others
// without echoing them.
func TestRedisURLForms(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"redis://127.0.0.1:6379/0",
		"rediss://user:pass@redis.example.com:6380",
		"redis://h1:7000?addr=h2:7001&addr=h3:7002",
		"rediss://:pass@h1:7000?addr=h2:7001",
		"redis://s1:26379?master_name=mymaster&addr=s2:26379&password=primary",
	} {
		env := validEnv()
		env["REDIS_URL"] = url
		if _, err := loadConfig(environ(env)); err != nil {
			t.Errorf("loadConfig with REDIS_URL=%s: %v", url, err)
		}
	}
	env := validEnv()
	env["REDIS_URL"] = "redis://s1:26379?master_name=&password=hunter2"
	_, err := loadConfig(environ(env))
	if err == nil || !strings.Contains(err.Error(), "REDIS_URL is invalid") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("loadConfig with an empty master_name: %v, want REDIS_URL refused without the URL", err)
	}
}

// TRUSTED_PROXIES left at deploy/configmap.yaml's placeholder works, but
// puts every client behind the real load balancer into one rate limit.
func TestTrustedProxiesPlaceholderWarns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		proxies string
		warn    bool
	}{
		{"192.0.2.0/24", true},
		{"10.0.0.0/8,198.51.100.7/32", true},
		{"203.0.113.0/24", true},
		{"2001:db8::/48", true},
		{"10.0.0.0/8,172.16.0.0/12", false},
		{"192.0.0.0/16", false}, // wider than the range: real addresses too
		{"", false},
	}
	for _, tt := range tests {
		env := validEnv()
		env["REDIS_URL"] = "redis://127.0.0.1:6379/0"
		env["TRUSTED_PROXIES"] = tt.proxies
		cfg, err := loadConfig(environ(env))
		if err != nil {
			t.Fatalf("TRUSTED_PROXIES=%q: %v", tt.proxies, err)
		}
		w := cfg.warnings()
		if got := len(w) == 1 && strings.Contains(w[0], "TRUSTED_PROXIES") && strings.Contains(w[0], "set TRUSTED_PROXIES to"); got != tt.warn {
			t.Errorf("TRUSTED_PROXIES=%q: warnings %q, want a warning saying what to set: %v", tt.proxies, w, tt.warn)
		}
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(environ(validEnv()))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "cfg", cfg, "stripe", cfg.StripeWebhookSecret)
	printed := fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg.DatabaseURL) + logs.String()
	for _, s := range []string{"db-password-42", "whsec_stripe_secret_value", "c2VjcmV0LXJlc2VuZC1rZXktMTIzNDU2Nzg", "re_api_key_value"} {
		if strings.Contains(printed, s) {
			t.Errorf("secret %q printed in: %s", s, printed)
		}
	}
}

// appWebhookSecret is a valid APP_WEBHOOK_SECRET: whsec_ and 24 bytes.
const appWebhookSecret = "whsec_YXBwLXdlYmhvb2stY29uZmlnLXNlY3JldCE="

// TestAppWebhookConfig: off by default; on with a URL and a secret, built
// into the relay's destination with the kinds asked for; never printed.
func TestAppWebhookConfig(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(environ(validEnv()))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.appWebhook != nil {
		t.Error("app webhook on without APP_WEBHOOK_URL")
	}
	if got, want := strings.Join(cfg.AppWebhookKinds, ","), "subscription,customer_features,checkout_session,support_message"; got != want {
		t.Errorf("APP_WEBHOOK_KINDS = %q, want %q", got, want)
	}
	env := validEnv()
	env["APP_WEBHOOK_URL"] = "http://127.0.0.1:8090/hooks"
	env["APP_WEBHOOK_SECRET"] = appWebhookSecret
	env["APP_WEBHOOK_ALLOW_HTTP"] = "true"
	env["APP_WEBHOOK_KINDS"] = "subscription, customer_features"
	cfg, err = loadConfig(environ(env))
	if err != nil {
		t.Fatalf("valid app webhook refused: %v", err)
	}
	if cfg.appWebhook == nil {
		t.Fatal("app webhook off with APP_WEBHOOK_URL and APP_WEBHOOK_SECRET set")
	}
	if got, want := strings.Join(cfg.appWebhook.Kinds(), ","), "subscription,customer_features"; got != want {
		t.Errorf("kinds = %q, want %q", got, want)
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("config", "cfg", cfg, "app", cfg.appWebhook)
	printed := fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg) + logs.String()
	if strings.Contains(printed, "YXBwLXdlYmhvb2stY29uZmlnLXNlY3JldCE") {
		t.Errorf("APP_WEBHOOK_SECRET printed in: %s", printed)
	}

	delete(env, "APP_WEBHOOK_URL")
	cfg, err = loadConfig(environ(env))
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.warnings(); !strings.Contains(strings.Join(w, "\n"), "APP_WEBHOOK_SECRET is set but APP_WEBHOOK_URL is empty") {
		t.Errorf("warnings = %q, want one about the secret without a URL", w)
	}
}

// TestPublishedSecretsRefused: each secret published in this repository
// (make dev, docker-compose.yml) is refused by serve, naming its variable,
// unless DEV_MODE=true.
func TestPublishedSecretsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
	}{
		{"STRIPE_WEBHOOK_SECRET", "whsec_dev_only_stripe"},
		{"RESEND_WEBHOOK_SECRET", "whsec_ZGV2LW9ubHktcmVzZW5kLXNlY3JldA=="},
		{"RESEND_WEBHOOK_SECRET", "ZGV2LW9ubHktcmVzZW5kLXNlY3JldA=="}, // svix takes it bare too
		{"RESEND_API_KEY", "re_dev_only"},
		{"STRIPE_API_KEY", "sk_test_dev_only"},
		{"DATABASE_URL", "postgres://munchable:dev_only_postgres_password@db:5432/munchable"},
		{"MIGRATE_DATABASE_URL", "postgres://munchable:dev_only_postgres_password@db:5432/munchable"},
	}
	for _, tc := range tests {
		env := validEnv()
		env[tc.name] = tc.value
		_, err := loadConfig(environ(env))
		if err == nil || !strings.Contains(err.Error(), tc.name+" is a secret published in this repository") {
			t.Errorf("%s=%s: loadConfig error %v, want one naming %s as published", tc.name, tc.value, err, tc.name)
		}
		env["DEV_MODE"] = "true"
		if _, err := loadConfig(environ(env)); err != nil {
			t.Errorf("%s=%s with DEV_MODE=true: %v, want it accepted", tc.name, tc.value, err)
		}
	}
}
