// Package dbtest is test support: isolated Postgres databases and Redis key
// spaces, and throwaway servers for fault tests.
//
// NewDatabase, NewPool, Redis and RedisURL use the servers named by
// TEST_DATABASE_URL and TEST_REDIS_URL, which Run, called from the
// package's TestMain, starts for the test binary when they are unset. A
// test that cannot have its server fails, naming the command to run; none
// skips.
//
// StartRedis and StartPostgres start private servers that a test may kill and
// restart; they need only the server binaries.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/migrations"
)

// Names of the environment variables that point the tests at shared servers.
const (
	// DatabaseURLEnv names a Postgres URL to a server where tests may
	// CREATE DATABASE, e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
	DatabaseURLEnv = "TEST_DATABASE_URL"
	// RedisURLEnv names a redis:// URL.
	RedisURLEnv = "TEST_REDIS_URL"
	// QueryModeEnv names one of pgx's query exec modes (cache_statement,
	// cache_describe, describe_exec, exec, simple_protocol), which
	// NewDatabase's URLs ask for as default_query_exec_mode: the store
	// tests then run as the service does behind a transaction pooler. Unset
	// means pgx's default (cache_statement).
	QueryModeEnv = "TEST_PGX_QUERY_MODE"
)

// setupTimeout bounds each helper's work against a server, so a hung server
// fails the test with a message instead of running into go test's timeout.
const setupTimeout = 30 * time.Second

// NewDatabase creates a fresh database named test_<random hex> on the
// TEST_DATABASE_URL server, applies the service's migrations to it and
// returns its URL, with TEST_PGX_QUERY_MODE's default_query_exec_mode when
// that is set. The database is dropped in t.Cleanup, even if connections
// to it are still open.
func NewDatabase(t testing.TB) string {
	t.Helper()
	adminURL := envURL(t, DatabaseURLEnv)
	name := "test_" + randomHex()

	dbURL, err := withDatabase(adminURL, name)
	if err != nil {
		t.Fatalf("%s: %v", DatabaseURLEnv, err)
	}
	if dbURL, err = withQueryMode(dbURL, os.Getenv(QueryModeEnv)); err != nil {
		t.Fatalf("%s: %v", QueryModeEnv, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := adminExec(ctx, adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	// Registered before the migrations run so a failed migration still
	// leaves nothing behind.
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		drop := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
		if err := adminExec(ctx, adminURL, drop); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})

	if err := migrate(ctx, dbURL); err != nil {
		t.Fatalf("migrate test database %s: %v", name, err)
	}
	return dbURL
}

// NewPool returns a pool on a fresh, migrated database (see NewDatabase).
// The pool is closed in t.Cleanup before the database is dropped.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	// Cleanups run last-in first-out, so this runs before the drop.
	t.Cleanup(pool.Close)
	return pool
}

// Redis returns a client for TEST_REDIS_URL and a key prefix of the form
// test-<random hex> that no other test shares. In t.Cleanup every key under
// the prefix is deleted and the client closed.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	opts, err := redis.ParseURL(envURL(t, RedisURLEnv))
	if err != nil {
		t.Fatalf("%s: %v", RedisURLEnv, err)
	}
	client := redis.NewClient(opts)
	// Fail here, naming the variable, rather than in the test's first command.
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		t.Fatalf("%s: ping: %v", RedisURLEnv, err)
	}

	prefix := "test-" + randomHex()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := deleteKeys(ctx, client, prefix); err != nil {
			t.Errorf("delete test keys under %s: %v", prefix, err)
		}
		if err := client.Close(); err != nil {
			t.Errorf("close redis client: %v", err)
		}
	})
	return client, prefix
}

// RedisURL returns TEST_REDIS_URL, for tests that start the whole service and
// so cannot be handed a client. Such tests must choose their own key prefix
// or clean up after themselves.
func RedisURL(t testing.TB) string {
	t.Helper()
	return envURL(t, RedisURLEnv)
}

// randomHex returns 16 random hex digits: enough that parallel tests and
// parallel test binaries never pick the same name.
func randomHex() string {
	b := make([]byte, 8)
	rand.Read(b) // never returns an error
	return hex.EncodeToString(b)
}

// withDatabase returns rawURL with its database name replaced by name.
func withDatabase(rawURL, name string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", fmt.Errorf("want a postgres:// URL, got scheme %q", u.Scheme)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// withQueryMode returns rawURL asking pgx for mode as its
// default_query_exec_mode; an empty mode leaves the URL as it is.
func withQueryMode(rawURL, mode string) (string, error) {
	if mode == "" {
		return rawURL, nil
	}
	switch mode {
	case "cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol":
	default:
		return "", fmt.Errorf("query mode %q: want cache_statement, cache_describe, describe_exec, exec or simple_protocol", mode)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// adminExec runs one statement on its own connection to adminURL. CREATE
// and DROP DATABASE cannot run inside a transaction or against the database
// they name, so they get a short-lived connection of their own.
func adminExec(ctx context.Context, adminURL, stmt string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", DatabaseURLEnv, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}

// migrate applies the service's migrations to the database at dbURL.
func migrate(ctx context.Context, dbURL string) error {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("parse URL: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	// Per-migration log lines would only bury the test's own output; a
	// failure comes back as the error.
	logger := slog.New(slog.DiscardHandler)
	_, err = migrations.Apply(ctx, db, logger)
	return err
}

// deleteKeys deletes every key under prefix. It walks the key space with
// SCAN, which never blocks the server the way KEYS does on a shared instance.
func deleteKeys(ctx context.Context, client *redis.Client, prefix string) error {
	// The prefix is "test-" and hex digits, none of which are glob
	// metacharacters, so it needs no escaping in the pattern.
	iter := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := client.Unlink(ctx, batch...).Err(); err != nil {
				return fmt.Errorf("unlink: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	if len(batch) > 0 {
		if err := client.Unlink(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("unlink: %w", err)
		}
	}
	return nil
}
