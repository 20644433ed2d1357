package faulttest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// The service binary on the setups users run it on (docs/WHERE-IT-RUNS.md):
// a Redis Cluster named by one node or by its cluster URL, Redis behind
// Sentinel through a failover, Postgres behind PgBouncer in transaction
// mode in each pgx query mode, and Redis set up wrong.

// topoRig is a Postgres and a fake Resend API; each test brings its Redis.
type topoRig struct {
	*rig
}

func newTopoRig(t *testing.T) *topoRig {
	t.Helper()
	if testing.Short() {
		t.Skip("fault suite: runs the service binary against throwaway servers; not in -short")
	}
	return newTopoRigOn(t, dbtest.StartPostgres(t))
}

// newTopoRigOn is newTopoRig on a Postgres the test started.
func newTopoRigOn(t *testing.T, pg *dbtest.PostgresServer) *topoRig {
	t.Helper()
	r := &rig{t: t, pg: pg}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, r.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	r.db = pool
	t.Cleanup(pool.Close)
	r.api = faulttest.NewResendAPI()
	t.Cleanup(r.api.Close)
	r.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(r.client.CloseIdleConnections)
	return &topoRig{r}
}

// in is the rig for subtest t: the same servers, failures reported to t.
func (r *topoRig) in(t *testing.T) *topoRig {
	c := *r.rig
	c.t = t
	return &topoRig{&c}
}

// serviceOn starts the binary with env on top of the rig's (REDIS_URL and
// DATABASE_URL as the test says).
func (r *topoRig) serviceOn(env map[string]string) *faulttest.Service {
	r.t.Helper()
	return r.service(env)
}

// readyz is the service's readiness answer.
type readyz struct {
	Status int
	Ready  bool   `json:"ready"`
	Redis  string `json:"redis"`
}

func getReadyz(t *testing.T, svc *faulttest.Service) readyz {
	t.Helper()
	resp, err := http.Get(svc.URL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var rep readyz
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("/readyz %q: %v", b, err)
	}
	rep.Status = resp.StatusCode
	return rep
}

func usableGauge(t *testing.T, svc *faulttest.Service) float64 {
	t.Helper()
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m.Sum("webhook_claim_store_usable")
}

// wantClaimsWork checks readiness and the gauge say claims work.
func wantClaimsWork(t *testing.T, svc *faulttest.Service) {
	t.Helper()
	if rep := getReadyz(t, svc); rep.Status != http.StatusOK || rep.Redis != "ok" {
		t.Fatalf("/readyz = %+v, want 200 with redis ok", rep)
	}
	if g := usableGauge(t, svc); g != 1 {
		t.Fatalf("webhook_claim_store_usable = %v, want 1", g)
	}
}

// wantClaimsUnusable checks the service fails open with claims unusable:
// readiness 200 saying so, the gauge 0, and one error line naming reason
// (startup, readiness and the scrape all probed: at most one a minute).
func wantClaimsUnusable(t *testing.T, svc *faulttest.Service, reason string) {
	t.Helper()
	rep := getReadyz(t, svc)
	if rep.Status != http.StatusOK || !rep.Ready || !strings.HasPrefix(rep.Redis, "unusable") {
		t.Fatalf("/readyz = %+v, want 200, ready, redis unusable", rep)
	}
	if g := usableGauge(t, svc); g != 0 {
		t.Fatalf("webhook_claim_store_usable = %v, want 0", g)
	}
	log, _ := os.ReadFile(svc.LogPath())
	var lines int
	for line := range strings.SplitSeq(string(log), "\n") {
		if strings.Contains(line, "claim store unusable") && strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, reason) {
			lines++
		}
	}
	if lines != 1 {
		t.Fatalf("%d error lines naming %q, want 1 (at most one a minute):\n%s", lines, reason, log)
	}
}

// deliverAll delivers each event once, concurrently, and checks each
// answer is 2xx with the idempotency verdict want.
func (r *topoRig) deliverAll(svcs []*faulttest.Service, events []faulttest.StripeEvent, want string) {
	r.t.Helper()
	answers := make([]faulttest.Answer, len(events))
	var wg sync.WaitGroup
	for i, ev := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = r.stripe(svcs[i%len(svcs)], ev)
		}()
	}
	wg.Wait()
	for i, a := range answers {
		if !a.OK() || a.Idempotency != want {
			r.t.Errorf("event %s: %v, want 2xx %s", events[i].ID, a, want)
		}
	}
	if r.t.Failed() {
		r.t.FailNow()
	}
}

func events(prefix string, n int) []faulttest.StripeEvent {
	out := make([]faulttest.StripeEvent, n)
	for i := range out {
		ev := subEvent(i, "active")
		ev.ID = fmt.Sprintf("evt_%s_%03d", prefix, i)
		ev.SubscriptionID = fmt.Sprintf("sub_%s_%03d", prefix, i)
		out[i] = ev
	}
	return out
}

// TestServiceOnRedisCluster: REDIS_URL naming one node of a cluster, or the
// cluster URL; 20 events whose keys spread over the three primaries (the
// test checks they do) are first, then duplicates,
// never degraded.
func TestServiceOnRedisCluster(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	cluster := dbtest.StartRedisCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	for _, c := range []struct{ name, url string }{
		{"one node", cluster.Nodes[1].URL()},
		{"cluster URL", cluster.URL()},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := r.in(t)
			svc := r.serviceOn(map[string]string{"REDIS_URL": c.url, "REDIS_KEY_PREFIX": "webhook-" + strings.ReplaceAll(c.name, " ", "-")})
			wantClaimsWork(t, svc)
			prefix := "webhook-" + strings.ReplaceAll(c.name, " ", "-")
			evs := events("cluster_"+strings.ReplaceAll(c.name, " ", "_"), 20)
			shards := map[string]int{}
			for _, ev := range evs {
				shards[shardOf(t, rdb, prefix+":stripe:"+ev.ID)]++
			}
			if len(shards) != 3 {
				t.Fatalf("the 20 claim keys fall on %d primaries (%v), want all 3", len(shards), shards)
			}
			r.deliverAll([]*faulttest.Service{svc}, evs, "first")
			r.deliverAll([]*faulttest.Service{svc}, evs, "duplicate")
			for _, ev := range evs {
				if v, err := rdb.Get(t.Context(), prefix+":stripe:"+ev.ID).Result(); err != nil || !strings.HasPrefix(v, "done|") {
					t.Fatalf("claim key of %s on the cluster = %q, %v; want done", ev.ID, v, err)
				}
			}
		})
	}
}

// shardOf names the primary (by node id) that holds key.
func shardOf(t *testing.T, rdb *redis.ClusterClient, key string) string {
	t.Helper()
	slot, err := rdb.ClusterKeySlot(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	shards, err := rdb.ClusterShards(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				return sh.Nodes[0].ID
			}
		}
	}
	t.Fatalf("no primary holds slot %d", slot)
	return ""
}

// TestServiceThroughSentinelFailover: deliveries before a SENTINEL
// FAILOVER stay done after it, and once the switch settles every delivery
// is claimed on the new primary, never degraded.
func TestServiceThroughSentinelFailover(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	sentinel := dbtest.StartRedisSentinel(t)
	svc := r.serviceOn(map[string]string{"REDIS_URL": sentinel.URL()})
	wantClaimsWork(t, svc)
	before := events("sentinel_before", 10)
	r.deliverAll([]*faulttest.Service{svc}, before, "first")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Replication is asynchronous; a failover by the book waits for the
	// replica, and so does SENTINEL FAILOVER's promotion. Wait for it here
	// too, so "done" keys are on the new primary.
	waitReplicated(t, ctx, sentinel)
	newPrimary, err := sentinel.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The switch has settled when the service's client has heard the
	// sentinel's +switch-master (go-redis logs it, then closes its
	// connections to the old primary: a claim in flight on one of them
	// fails and that delivery runs degraded) and a claim works.
	settled := time.Now()
	for !followed(svc, newPrimary) || getReadyz(t, svc).Redis != "ok" {
		if time.Since(settled) > 30*time.Second {
			t.Fatalf("service has not followed the failover to %s after 30s", newPrimary)
		}
		time.Sleep(100 * time.Millisecond)
	}
	figure(t, "service followed the failover to %s within %v", newPrimary, time.Since(settled).Round(10*time.Millisecond))
	wantClaimsWork(t, svc)
	r.deliverAll([]*faulttest.Service{svc}, before, "duplicate")
	after := events("sentinel_after", 10)
	r.deliverAll([]*faulttest.Service{svc}, after, "first")
	r.deliverAll([]*faulttest.Service{svc}, after, "duplicate")
}

// followed reports whether the service's log says its client moved to
// the primary at addr.
func followed(svc *faulttest.Service, addr string) bool {
	log, _ := os.ReadFile(svc.LogPath())
	for line := range strings.SplitSeq(string(log), "\n") {
		if strings.Contains(line, "sentinel: new master") && strings.Contains(line, addr) {
			return true
		}
	}
	return false
}

func waitReplicated(t *testing.T, ctx context.Context, s *dbtest.RedisSentinel) {
	t.Helper()
	addr, err := s.PrimaryAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := newRedisClient(addr)
	defer c.Close()
	if n, err := c.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want the replica caught up", n, err)
	}
}

// TestServiceThroughPgBouncer: two service processes share PgBouncer in
// transaction mode (a pool of 4 server connections for their 2x16), with
// migrations over MIGRATE_DATABASE_URL, in each pgx query mode that works
// through a transaction pooler. A burst of 40 Stripe events and 10 mails
// spread over both: all 2xx, and the rows are what a direct connection
// stores. Without MIGRATE_DATABASE_URL the service refuses to migrate and
// says what to set.
func TestServiceThroughPgBouncer(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	redisServer := dbtest.StartRedis(t)
	bouncer := dbtest.StartPgBouncer(t, r.pg, "transaction", 4)

	t.Run("refused without MIGRATE_DATABASE_URL", func(t *testing.T) {
		full := faulttest.BaseEnv()
		full["DATABASE_URL"] = bouncer.URL("postgres") + "&default_query_exec_mode=exec"
		full["RESEND_API_URL"] = r.api.URL()
		wantStartupFailure(t, full, "MIGRATE_DATABASE_URL")
	})

	for _, mode := range []string{"cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			db := "pgb_" + mode
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := r.db.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			direct := strings.Replace(r.pg.URL(), "/postgres?", "/"+db+"?", 1)
			r := &topoRig{&rig{t: t, pg: r.pg, api: r.api, client: r.client}}
			env := map[string]string{
				"DATABASE_URL":         bouncer.URL(db) + "&default_query_exec_mode=" + mode,
				"MIGRATE_DATABASE_URL": direct,
				"REDIS_URL":            redisServer.URL(),
				"REDIS_KEY_PREFIX":     "webhook-" + mode,
				// The scheduled jobs' leases are taken and renewed
				// through the pooler too.
				"SWEEP_INTERVAL": "10s",
			}
			var svcs []*faulttest.Service
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range 2 { // started together: their migrations race for the lock
				wg.Add(1)
				go func() {
					defer wg.Done()
					svc := r.serviceOn(env)
					mu.Lock()
					svcs = append(svcs, svc)
					mu.Unlock()
				}()
			}
			wg.Wait()
			if len(svcs) != 2 {
				t.FailNow()
			}
			evs := events("pgb_"+mode, 40)
			for i := range evs {
				evs[i].Metadata = map[string]string{"order": fmt.Sprint(i), "note": `quote " and \ backslash`}
			}
			mails := make([]faulttest.Email, 10)
			for i := range mails {
				mails[i] = newEmail(fmt.Sprintf("pgb-%s-%d", mode, i))
				r.api.Add(mails[i])
			}
			var answers []faulttest.Answer
			var amu sync.Mutex
			var bw sync.WaitGroup
			for i, ev := range evs {
				bw.Add(1)
				go func() {
					defer bw.Done()
					a := r.stripe(svcs[i%2], ev)
					amu.Lock()
					answers = append(answers, a)
					amu.Unlock()
				}()
			}
			for i, m := range mails {
				bw.Add(1)
				go func() {
					defer bw.Done()
					a := r.resend(svcs[i%2], m)
					amu.Lock()
					answers = append(answers, a)
					amu.Unlock()
				}()
			}
			bw.Wait()
			for _, a := range answers {
				if !a.OK() || a.Idempotency != "first" {
					t.Errorf("delivery through pgbouncer (%s): %v, want 2xx first", mode, a)
				}
			}
			check, err := pgxpool.New(ctx, direct)
			if err != nil {
				t.Fatal(err)
			}
			defer check.Close()
			var subs, meta, msgs int
			if err := check.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE metadata->>'note' = $2) FROM entitlements WHERE stripe_subscription_id LIKE $1 AND status = 'active'`,
				"sub_pgb_"+mode+"_%", `quote " and \ backslash`).Scan(&subs, &meta); err != nil {
				t.Fatal(err)
			}
			// This mode's mails: the fake lists every mode's, and the sweep
			// queues what it lists.
			if err := check.QueryRow(ctx, `SELECT count(*) FROM support_messages WHERE source = 'email' AND message_id LIKE '<pgb-' || $1 || '-%'`, mode).Scan(&msgs); err != nil {
				t.Fatal(err)
			}
			if subs != 40 || meta != 40 || msgs != 10 {
				t.Fatalf("rows through pgbouncer (%s): %d active entitlements, %d with the metadata, %d mails; want 40, 40, 10", mode, subs, meta, msgs)
			}
			var token int64
			eventually(t, time.Minute, "a Resend sweep recorded under its lease through pgbouncer", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := check.QueryRow(ctx, `SELECT token FROM scheduled_jobs WHERE name = 'sweep_resend'`).Scan(&token)
				return err == nil && token > 0
			})
			for i, svc := range svcs {
				b, err := os.ReadFile(svc.LogPath())
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(string(b), "\n") {
					if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, "lost its lease") {
						t.Errorf("process %d logged through pgbouncer (%s): %s", i, mode, line)
					}
				}
			}
			figure(t, "pgbouncer transaction mode, %s: 2 processes, %d deliveries, all 2xx; 40 entitlements and 10 mails stored; sweep recorded under lease token %d", mode, len(answers), token)
		})
	}
}

// TestServiceThroughPgBouncerSessionMode: in session mode a client keeps
// its server connection, so pgx's default query mode and the migration
// lock both work through it: the service migrates over DATABASE_URL alone
// (the session check passes) and stores what it is sent.
func TestServiceThroughPgBouncerSessionMode(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	redisServer := dbtest.StartRedis(t)
	// Each process holds DATABASE_MAX_CONNS + 1 server connections, plus
	// two while it migrates.
	bouncer := dbtest.StartPgBouncer(t, r.pg, "session", 20)
	svc := r.serviceOn(map[string]string{
		"DATABASE_URL":       bouncer.URL("postgres"),
		"DATABASE_MAX_CONNS": "4",
		"REDIS_URL":          redisServer.URL(),
	})
	evs := events("pgb_session", 20)
	r.deliverAll([]*faulttest.Service{svc}, evs, "first")
	if n := r.count(`SELECT count(*) FROM entitlements WHERE stripe_subscription_id LIKE 'sub_pgb_session_%'`); n != 20 {
		t.Fatalf("%d entitlements through pgbouncer in session mode, want 20", n)
	}
}

// TestServiceSeesUnusableRedis: REDIS_URL naming a replica, a sentinel's
// port or a server with another password reads as unusable in /readyz
// (which stays 200: the service fails open) and in the gauge, and the log
// says why, at error.
func TestServiceSeesUnusableRedis(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	sentinel := dbtest.StartRedisSentinel(t)
	locked := dbtest.StartRedisWithPassword(t, "right-password")
	for _, c := range []struct{ name, url, reason string }{
		{"replica", sentinel.Replica.URL(), "READONLY"},
		{"sentinel port", "redis://" + sentinel.SentinelAddr(), "unknown command"},
		{"wrong password", "redis://:wrong@" + locked.Addr(), "WRONGPASS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := r.in(t)
			wantClaimsUnusable(t, r.serviceOn(map[string]string{"REDIS_URL": c.url}), c.reason)
		})
	}
}

func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr})
}

// wantStartupFailure runs the service with env and wants it to refuse to
// start: to exit non-zero within 30 s, its log naming want.
func wantStartupFailure(t *testing.T, env map[string]string, want string) {
	t.Helper()
	svc, err := faulttest.NewService(serviceBin, env, filepath.Join(t.TempDir(), "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Kill)
	if err := svc.Launch(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state, err := svc.Wait(ctx)
	if err != nil {
		t.Fatalf("service still running, want it to refuse to start naming %q: %v", want, err)
	}
	log, _ := os.ReadFile(svc.LogPath())
	if state.ExitCode() == 0 || !strings.Contains(string(log), want) {
		t.Fatalf("exit %d, log:\n%s\nwant a failure naming %q", state.ExitCode(), log, want)
	}
}
