package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The servers below are the setups users run the service on, as throwaway
// servers the way StartRedis and StartPostgres start theirs: a Redis
// Cluster, a Sentinel watching a primary and its replica, a password-
// protected Redis, and PgBouncer in front of Postgres. docs/WHERE-IT-RUNS.md
// says what was tested on each.

// RedisCluster is a Redis Cluster of three primaries with the 16384 slots
// split evenly between them, and, from StartRedisClusterReplicated, a
// replica of each.
type RedisCluster struct {
	Nodes    []*RedisServer // the primaries, as started
	Replicas []*RedisServer // Replicas[i] replicates Nodes[i], as started; a failover swaps roles
}

// URL is the cluster's URL in go-redis's cluster form
// (redis://h1:p1?addr=h2:p2&addr=h3:p3, redis.ParseClusterURL).
func (c *RedisCluster) URL() string {
	u := c.Nodes[0].URL() + "?"
	for i, n := range c.Nodes[1:] {
		if i > 0 {
			u += "&"
		}
		u += "addr=" + n.Addr()
	}
	return u
}

// Addrs are the primaries' host:port.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// StartRedisCluster starts three redis-server nodes in cluster mode on free
// ports, assigns each a third of the slots (CLUSTER ADDSLOTSRANGE), joins
// them (CLUSTER MEET) and waits until every node says cluster_state:ok. The
// nodes stop in t.Cleanup.
func StartRedisCluster(t testing.TB) *RedisCluster {
	t.Helper()
	return startRedisCluster(t, false)
}

// StartRedisClusterReplicated is StartRedisCluster with a replica of each
// primary (CLUSTER REPLICATE), and waits until each replica's link is up.
// Its node timeout is 2 s, so a killed primary's replica takes over within
// a few seconds; a replica fails over however stale its data
// (cluster-replica-validity-factor 0), so a loaded machine cannot stall
// the failover.
func StartRedisClusterReplicated(t testing.TB) *RedisCluster {
	t.Helper()
	return startRedisCluster(t, true)
}

func startRedisCluster(t testing.TB, replicated bool) *RedisCluster {
	t.Helper()
	c := &RedisCluster{}
	node := func() *RedisServer {
		dir := t.TempDir()
		return startRedisArgs(t, dir,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			"--cluster-replica-validity-factor", "0",
		)
	}
	for range 3 {
		c.Nodes = append(c.Nodes, node())
		if replicated {
			c.Replicas = append(c.Replicas, node())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := c.form(ctx); err != nil {
		t.Fatalf("form redis cluster: %v", err)
	}
	return c
}

func (c *RedisCluster) form(ctx context.Context) error {
	const slots = 16384
	per := slots / len(c.Nodes)
	all := append(append([]*RedisServer{}, c.Nodes...), c.Replicas...)
	clients := make([]*redis.Client, len(all))
	for i, n := range all {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr()})
		defer clients[i].Close()
	}
	for i := range c.Nodes {
		first, last := i*per, (i+1)*per-1
		if i == len(c.Nodes)-1 {
			last = slots - 1
		}
		if err := clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", first, last).Err(); err != nil {
			return fmt.Errorf("node %s: add slots: %w", c.Nodes[i].Addr(), err)
		}
	}
	for _, n := range all[1:] {
		host, port, _ := net.SplitHostPort(n.Addr())
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("meet %s: %w", n.Addr(), err)
		}
	}
	known := fmt.Sprintf("cluster_known_nodes:%d", len(all))
	err := waitFor(ctx, func() error {
		for i, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, known) {
				return fmt.Errorf("node %s not ready:\n%s", all[i].Addr(), info)
			}
		}
		return nil
	})
	if err != nil || len(c.Replicas) == 0 {
		return err
	}
	for i := range c.Replicas {
		id, err := clients[i].ClusterMyID(ctx).Result()
		if err != nil {
			return err
		}
		replica := clients[len(c.Nodes)+i]
		// A node that has not yet heard of the primary through gossip
		// answers "Unknown node": ask again.
		if err := waitFor(ctx, func() error { return replica.ClusterReplicate(ctx, id).Err() }); err != nil {
			return fmt.Errorf("replicate %s on %s: %w", c.Nodes[i].Addr(), c.Replicas[i].Addr(), err)
		}
	}
	return waitFor(ctx, func() error {
		for i := range c.Replicas {
			info, err := clients[len(c.Nodes)+i].Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replica %s not linked:\n%s", c.Replicas[i].Addr(), info)
			}
		}
		for _, cl := range clients {
			if info, err := cl.ClusterInfo(ctx).Result(); err != nil || !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("cluster not ok: %v %s", err, info)
			}
		}
		return nil
	})
}

// PromotedAt waits until replica i answers ROLE as a primary (its primary
// failed and it was elected) and returns when it first saw that, polling
// every 20 ms.
func (c *RedisCluster) PromotedAt(ctx context.Context, i int) (time.Time, error) {
	cl := redis.NewClient(&redis.Options{Addr: c.Replicas[i].Addr(), MaxRetries: -1})
	defer cl.Close()
	for {
		role, err := cl.Do(ctx, "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("replica %s not promoted: %w (ROLE %v, %v)", c.Replicas[i].Addr(), ctx.Err(), role, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// StartRedisWithPassword starts a redis-server that requires password
// (AUTH), stopped in t.Cleanup.
func StartRedisWithPassword(t testing.TB, password string) *RedisServer {
	t.Helper()
	return startRedisArgs(t, t.TempDir(), "--requirepass", password)
}

// startRedisArgs is StartRedis with extra redis-server arguments.
func startRedisArgs(t testing.TB, dir string, extra ...string) *RedisServer {
	t.Helper()
	return startRedis(t, &RedisServer{dir: dir, extra: extra})
}

// startRedis starts s, set up but for its binary and port, on a free port
// and stops it in t.Cleanup.
func startRedis(t testing.TB, s *RedisServer) *RedisServer {
	t.Helper()
	bin, err := redisBin()
	if err != nil {
		missingServer(t, err.Error())
	}
	s.bin = bin
	err = onFreePort(func(port int) error {
		s.port = port
		return s.launch()
	})
	if err != nil {
		t.Fatal(err)
	}
	s.tb = t
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop redis-server: %v", err)
		}
	})
	return s
}

// SentinelMaster is the name the sentinel monitors its primary by.
const SentinelMaster = "mymaster"

// RedisSentinel is a primary, its replica and one sentinel watching them
// (quorum 1: a test's SENTINEL FAILOVER needs no vote).
type RedisSentinel struct {
	Primary, Replica *RedisServer // as started; a failover swaps their roles
	sentinelPort     int
	proc             *process
}

// SentinelAddr is the sentinel's host:port.
func (s *RedisSentinel) SentinelAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.sentinelPort))
}

// URL is the Sentinel form of REDIS_URL (redis.ParseFailoverURL).
func (s *RedisSentinel) URL() string {
	return "redis://" + s.SentinelAddr() + "?master_name=" + SentinelMaster
}

// StartRedisSentinel starts a primary, a replica of it and a sentinel
// (redis-server --sentinel) on free ports, and waits until the sentinel
// knows the replica as a good failover target. All stop in t.Cleanup.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	s := &RedisSentinel{}
	s.Primary = startRedisArgs(t, t.TempDir())
	primaryPort := s.Primary.port
	s.Replica = startRedisArgs(t, t.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(primaryPort))
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missingServer(t, fmt.Sprintf("%v: redis-server: %v", ErrNoBinary, err))
	}
	dir := t.TempDir()
	logPath := filepath.Join(dir, "sentinel.log")
	err = onFreePort(func(port int) error {
		s.sentinelPort = port
		conf := filepath.Join(dir, "sentinel.conf") // the sentinel rewrites it
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 1\n"+
			"sentinel down-after-milliseconds %s 2000\n"+
			"sentinel failover-timeout %s 10000\n",
			port, dir, SentinelMaster, primaryPort, SentinelMaster, SentinelMaster)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return err
		}
		cmd := exec.Command(bin, conf, "--sentinel")
		cmd.Dir = dir
		if s.proc, err = startProcess(cmd, logPath, nil); err != nil {
			return fmt.Errorf("start sentinel: %w", err)
		}
		return s.proc.waitReady(func() error { return pingOwnRedis(s.SentinelAddr(), "", nil, s.proc) }, logPath)
	})
	if err != nil {
		t.Fatalf("sentinel: %v", err)
	}
	t.Cleanup(func() {
		if err := s.proc.stop(os.Interrupt, stopTimeout); err != nil {
			t.Errorf("stop sentinel: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := s.waitReplicaKnown(ctx); err != nil {
		t.Fatalf("sentinel: %v\n%s", err, logTail(logPath))
	}
	return s
}

// waitReplicaKnown waits until the sentinel lists a replica whose link to
// the primary is up: before that, SENTINEL FAILOVER answers NOGOODSLAVE.
func (s *RedisSentinel) waitReplicaKnown(ctx context.Context) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr()})
	defer sc.Close()
	return waitFor(ctx, func() error {
		replicas, err := sc.Replicas(ctx, SentinelMaster).Result()
		if err != nil {
			return err
		}
		for _, r := range replicas {
			if r["master-link-status"] == "ok" && !strings.Contains(r["flags"], "down") && !strings.Contains(r["flags"], "disconnected") {
				return nil
			}
		}
		return fmt.Errorf("no good replica yet: %v", replicas)
	})
}

// PrimaryAddr asks the sentinel which server is the primary now.
func (s *RedisSentinel) PrimaryAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr()})
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// Failover has the sentinel promote the replica (SENTINEL FAILOVER) and
// waits until it names a new primary, that primary accepts writes, and the
// old one has become its replica with a live link, so that a second
// failover could follow.
func (s *RedisSentinel) Failover(ctx context.Context) (newPrimary string, err error) {
	old, err := s.PrimaryAddr(ctx)
	if err != nil {
		return "", err
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddr()})
	defer sc.Close()
	if err := sc.Failover(ctx, SentinelMaster).Err(); err != nil {
		return "", fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	err = waitFor(ctx, func() error {
		addr, err := s.PrimaryAddr(ctx)
		if err != nil {
			return err
		}
		if addr == old {
			return errors.New("sentinel still names the old primary")
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		role, err := c.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s is %v, not yet master", addr, role)
		}
		newPrimary = addr
		return nil
	})
	if err != nil {
		return "", err
	}
	return newPrimary, s.waitReplicaKnown(ctx)
}

// PgBouncer is a pgbouncer in front of a PostgresServer.
type PgBouncer struct {
	port int
	proc *process
}

// URL is the database url's database through pgbouncer, as user postgres.
func (b *PgBouncer) URL(database string) string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(b.port) + "/" + database + "?sslmode=disable"
}

// StartPgBouncer starts pgbouncer (Debian's /usr/sbin/pgbouncer, or the one
// on PATH) in front of pg with the given pool_mode ("transaction" or
// "session") and a pool of poolSize server connections per database,
// trusting user postgres as pg does. Like Postgres it refuses to run as
// root, so under root it runs as the postgres user. It stops in t.Cleanup.
func StartPgBouncer(t testing.TB, pg *PostgresServer, poolMode string, poolSize int) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/pgbouncer"); statErr != nil {
			missingServer(t, fmt.Sprintf("%v: pgbouncer: %v", ErrNoBinary, err))
		}
		bin = "/usr/sbin/pgbouncer"
	}
	cred, err := serverCredential()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "dbtest-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	b := &PgBouncer{}
	t.Cleanup(func() {
		if b.proc == nil {
			return
		}
		if err := b.proc.stop(os.Interrupt, stopTimeout); err != nil {
			t.Errorf("stop pgbouncer: %v", err)
		}
	})
	// As for Postgres and Redis: another test's server can take the free
	// port first, and then pgbouncer exits (a readiness check that asks for
	// pg's data directory tells such a server from pg behind pgbouncer).
	err = onFreePort(func(port int) error {
		b.port = port
		ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
max_db_connections = %d
server_check_delay = 0
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, pg.port, b.port, filepath.Join(dir, "users.txt"), poolMode, poolSize, poolSize,
			filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
		files := map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n"}
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				return err
			}
		}
		cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
		cmd.Dir = dir
		// Its own log file is written by pgbouncer; stdout and stderr
		// catch what it says before it opens it.
		var err error
		if b.proc, err = startProcess(cmd, filepath.Join(dir, "stderr.log"), cred); err != nil {
			return fmt.Errorf("start pgbouncer: %w", err)
		}
		ready := func() error { return pingPostgres(b.URL("postgres"), pg.dataDir()) }
		if err := b.proc.waitReady(ready, filepath.Join(dir, "stderr.log")); err != nil {
			return fmt.Errorf("pgbouncer: %w\n%s", err, logTail(filepath.Join(dir, "pgbouncer.log")))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitFor polls check until it succeeds or ctx ends, and returns the last
// error with ctx's.
func waitFor(ctx context.Context, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
