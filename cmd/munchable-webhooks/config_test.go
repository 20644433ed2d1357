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
		{"stripe secret is an API key", map[string]string{"STRIPE_WEBHOOK_SECRET": "sk_test_123"}, nil, []string{"STRIPE_WEBHOOK_SECRET is invalid: want the whsec_"}},
		{"listen addresses", map[string]string{"LISTEN_ADDR": "8080", "METRICS_ADDR": "metrics"}, nil,
			[]string{`LISTEN_ADDR is "8080": want host:port`, `METRICS_ADDR is "metrics": want host:port`}},
		{"metrics on the listener", map[string]string{"LISTEN_ADDR": ":8080", "METRICS_ADDR": ":8080"}, nil, []string{"METRICS_ADDR must differ from LISTEN_ADDR"}},
		{"limits", map[string]string{"SUPPORT_FORM_RATE": "0", "MAX_INFLIGHT_BODY_BYTES": "10", "POISON_AFTER": "-1"}, nil,
			[]string{"SUPPORT_FORM_RATE must be at least 1", "MAX_INFLIGHT_BODY_BYTES must be at least 2097152", "POISON_AFTER must be at least 0"}},
		{"intake durations", map[string]string{"BODY_READ_TIMEOUT": "0s", "SHUTDOWN_DELAY": "-1s", "CLAIM_PROCESSING_TTL": "120000001us"}, nil,
			[]string{"BODY_READ_TIMEOUT must be positive", "SHUTDOWN_DELAY must not be negative", "CLAIM_PROCESSING_TTL must be a whole number of milliseconds"}},
		{"schedules", map[string]string{"VERIFY_INTERVAL": "5m", "SWEEP_INTERVAL": "1s"}, nil,
			[]string{"VERIFY_INTERVAL is 5m0s: want 0 (off) or at least 1h", "SWEEP_INTERVAL is 1s: want 0 (off) or a duration from 10s to 24h0m0s"}},
		{"urls", map[string]string{"RESEND_API_URL": "api.resend.com", "STRIPE_API_URL": "ftp://x", "SUPPORT_FORM_REDIRECT_URL": "thanks", "SUPPORT_FORM_ORIGINS": "munchable.app"}, nil,
			[]string{"RESEND_API_URL is invalid", "STRIPE_API_URL is invalid", "SUPPORT_FORM_REDIRECT_URL is invalid", `SUPPORT_FORM_ORIGINS has "munchable.app"`}},
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
			for _, s := range []string{"db-password-42", "whsec_stripe_secret_value", "re_api_key_value", "sk_test_123"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error reveals a secret: %s", err)
				}
			}
		})
	}
}

// TestRedisURLForms: REDIS_URL takes go-redis's three forms, and each is
// read as the form it is.
func TestRedisURLForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url  string
		want string // single, cluster or failover
	}{
		{"redis://127.0.0.1:6379/0", "single"},
		{"rediss://user:pass@redis.example.com:6380", "single"},
		{"redis://h1:7000?addr=h2:7001&addr=h3:7002", "cluster"},
		{"rediss://:pass@h1:7000?addr=h2:7001", "cluster"},
		{"redis://s1:26379?master_name=mymaster&addr=s2:26379&password=primary", "failover"},
	}
	for _, tt := range tests {
		target, err := parseRedisURL(tt.url)
		if err != nil {
			t.Errorf("parseRedisURL(%q): %v", tt.url, err)
			continue
		}
		var got []string
		if target.single != nil {
			got = append(got, "single")
		}
		if target.cluster != nil {
			got = append(got, "cluster")
		}
		if target.failover != nil {
			got = append(got, "failover")
		}
		if strings.Join(got, ",") != tt.want {
			t.Errorf("parseRedisURL(%q) = %s, want %s", tt.url, got, tt.want)
		}
		env := validEnv()
		env["REDIS_URL"] = tt.url
		if _, err := loadConfig(environ(env)); err != nil {
			t.Errorf("loadConfig with REDIS_URL=%s: %v", tt.url, err)
		}
	}
	o, _ := parseRedisURL("redis://s1:26379?master_name=mymaster&addr=s2:26379&password=primary")
	if o.failover.MasterName != "mymaster" || len(o.failover.SentinelAddrs) != 2 || o.failover.Password != "primary" {
		t.Errorf("sentinel URL read as %+v", o.failover)
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
