package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestNewDatabase(t *testing.T) {
	adminURL := envURL(t, DatabaseURLEnv)

	names := make(chan string, 2)
	t.Run("parallel", func(t *testing.T) {
		for _, name := range []string{"a", "b"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				conn := connect(t, NewDatabase(t))
				var db string
				var migrated bool
				err := conn.QueryRow(t.Context(),
					"SELECT current_database(), to_regclass('public.entitlements') IS NOT NULL",
				).Scan(&db, &migrated)
				if err != nil {
					t.Fatal(err)
				}
				if !migrated {
					t.Errorf("database %s has no entitlements table", db)
				}
				names <- db
			})
		}
	})
	close(names)

	a, b := <-names, <-names
	if a == b {
		t.Fatalf("both tests got database %s", a)
	}
	// The subtests are over, so their cleanups have dropped both databases.
	var left int
	err := connect(t, adminURL).QueryRow(t.Context(),
		"SELECT count(*) FROM pg_database WHERE datname IN ($1, $2)", a, b,
	).Scan(&left)
	if err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of databases %s, %s left after cleanup, want 0", left, a, b)
	}
}

func TestNewPool(t *testing.T) {
	t.Parallel()
	pool := NewPool(t)
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM entitlements").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("entitlements has %d rows in a new database, want 0", n)
	}
}

func TestRedis(t *testing.T) {
	outer, outerPrefix := Redis(t)
	keep := outerPrefix + ":keep"
	if err := outer.Set(t.Context(), keep, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	var prefixes []string
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			client, prefix := Redis(t)
			// More keys than one SCAN batch, so cleanup has to page.
			pipe := client.Pipeline()
			for i := range 1200 {
				pipe.Set(t.Context(), fmt.Sprintf("%s:%d", prefix, i), i, 0)
			}
			if _, err := pipe.Exec(t.Context()); err != nil {
				t.Fatal(err)
			}
			prefixes = append(prefixes, prefix)
		})
	}

	if len(prefixes) != 2 || prefixes[0] == prefixes[1] {
		t.Fatalf("prefixes %q, want two different", prefixes)
	}
	for _, prefix := range prefixes {
		left := 0
		iter := outer.Scan(t.Context(), 0, prefix+"*", 1000).Iterator()
		for iter.Next(t.Context()) {
			left++
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("%d keys left under %s after cleanup, want 0", left, prefix)
		}
	}
	if n, err := outer.Exists(t.Context(), keep).Result(); err != nil || n != 1 {
		t.Errorf("key %s under another prefix: exists %d, %v; want 1, nil", keep, n, err)
	}
}

func TestRedisServerKillStart(t *testing.T) {
	t.Parallel()
	s := StartRedis(t)
	opts, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	ping := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		return client.Ping(ctx).Err()
	}

	if err := ping(); err != nil {
		t.Fatalf("PING before Kill: %v", err)
	}
	s.Kill()
	// A bare PING: go-redis would log its failed dials to stderr.
	if err := pingRedis(s.Addr(), ""); err == nil {
		t.Fatal("PING after Kill succeeded, want an error")
	}
	s.Start()
	// The client from before Kill, which has to replace its dead connection.
	if err := ping(); err != nil {
		t.Fatalf("PING after Start: %v", err)
	}
}

func TestPostgresServerKillStart(t *testing.T) {
	t.Parallel()
	s := StartPostgres(t)
	// The readiness check knows this server from another on the port.
	if err := pingPostgres(s.URL(), s.dataDir()); err != nil {
		t.Fatalf("the server's own data directory: %v", err)
	}
	if err := pingPostgres(s.URL(), t.TempDir()); err == nil {
		t.Fatal("another server's data directory passed the readiness check")
	}
	query := func(conn *pgx.Conn) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var one int
		return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	connectAndQuery := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return query(conn)
	}

	// Held across Kill: its backend must die with the server (see
	// TestKillTakesBackends).
	held := connect(t, s.URL())
	if err := query(held); err != nil {
		t.Fatalf("query before Kill: %v", err)
	}
	s.Kill()
	if err := query(held); err == nil {
		t.Fatal("query on a connection held across Kill succeeded, want an error")
	}
	if err := connectAndQuery(); err == nil {
		t.Fatal("connect after Kill succeeded, want an error")
	}
	s.Start()
	if err := connectAndQuery(); err != nil {
		t.Fatalf("query after Start: %v", err)
	}
}

// A Postgres whose port another process took first exits before it is
// ready, which is what LaunchPostgres retries on another port.
func TestPostgresOnATakenPort(t *testing.T) {
	t.Parallel()
	s := StartPostgres(t)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(s.port))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.launch(); !errors.Is(err, errExited) {
		t.Errorf("launch on a taken port = %v, want %v", err, errExited)
	}
	l.Close()
	s.Start()
}

// onFreePort tries another port only when the server exited before it was
// ready, and gives up after five.
func TestOnFreePort(t *testing.T) {
	t.Parallel()
	var ports []int
	err := onFreePort(func(port int) error {
		ports = append(ports, port)
		if len(ports) < 3 {
			return fmt.Errorf("port %d: %w", port, errExited)
		}
		return nil
	})
	if err != nil || len(ports) != 3 {
		t.Errorf("onFreePort = %v after ports %v; want success on the third", err, ports)
	}
	other := errors.New("initdb failed")
	calls := 0
	if err := onFreePort(func(int) error { calls++; return other }); !errors.Is(err, other) || calls != 1 {
		t.Errorf("onFreePort = %v after %d calls; want the error at once", err, calls)
	}
	calls = 0
	if err := onFreePort(func(int) error { calls++; return errExited }); !errors.Is(err, errExited) || calls != 5 {
		t.Errorf("onFreePort = %v after %d calls; want errExited after 5", err, calls)
	}
}

// connect opens a connection that is closed in t.Cleanup.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestPingOwnRedis: a server on the port answers the readiness check only
// when it is the process that was started for it; one that took the port
// first (a race on a free port) is told apart.
func TestPingOwnRedis(t *testing.T) {
	t.Parallel()
	s := StartRedis(t)
	if err := pingOwnRedis(s.Addr(), "", nil, s.proc); err != nil {
		t.Fatalf("the server's own process: %v", err)
	}
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	if err := pingOwnRedis(s.Addr(), "", nil, &process{cmd: other}); err == nil {
		t.Fatal("another process's port passed the readiness check")
	}
}

// TestDurablePostgres: the launcher's own settings are the fast ones, and
// the durable launcher's win over them, as the bench's -durable relies on.
func TestDurablePostgres(t *testing.T) {
	t.Parallel()
	settings := func(url string) string {
		var fsync, syncCommit, fpw string
		err := connect(t, url).QueryRow(t.Context(),
			"SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('full_page_writes')").
			Scan(&fsync, &syncCommit, &fpw)
		if err != nil {
			t.Fatal(err)
		}
		return fsync + " " + syncCommit + " " + fpw
	}
	if got, want := settings(StartPostgres(t).URL()), "off off off"; got != want {
		t.Errorf("StartPostgres: fsync, synchronous_commit, full_page_writes = %s, want %s", got, want)
	}
	dir := postgresDir(t)
	s, err := LaunchDurablePostgres(dir)
	if errors.Is(err, ErrNoBinary) {
		missingServer(t, err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	if got, want := settings(s.URL()), "on on on"; got != want {
		t.Errorf("LaunchDurablePostgres: fsync, synchronous_commit, full_page_writes = %s, want %s", got, want)
	}
}
