package claim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// The claim store on the Redis setups users run: a 3-node cluster (given by
// its cluster URL, or by one node, which is how the service follows a plain
// URL that names a cluster node), and a Sentinel through a failover. Each
// client is configured as the service configures it: no retries, one
// redirect.

func clusterClient(t *testing.T, addrs ...string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1, MaxRedirects: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestClaimsOnCluster(t *testing.T) {
	t.Parallel()
	cluster := dbtest.StartRedisCluster(t)
	opts, err := redis.ParseClusterURL(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]*redis.ClusterClient{
		"cluster URL": clusterClient(t, opts.Addrs...),
		"one node":    clusterClient(t, cluster.Nodes[2].Addr()),
	}
	for name, rdb := range clients {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := NewStore(rdb, StoreConfig{Prefix: "test-" + strings.ReplaceAll(name, " ", "-"), Timeout: 2 * time.Second, ProcessingTTL: time.Minute})
			// 20 ids whose keys spread over every primary.
			nodes := map[string]int{}
			ids := make([]string, 20)
			for i := range ids {
				ids[i] = fmt.Sprintf("evt_cluster_%02d", i)
				slot, err := rdb.ClusterKeySlot(ctx, s.Key("stripe", ids[i])).Result()
				if err != nil {
					t.Fatal(err)
				}
				nodes[nodeOfSlot(t, rdb, slot)]++
			}
			if len(nodes) != 3 {
				t.Fatalf("keys of the 20 ids on %d nodes (%v), want all 3", len(nodes), nodes)
			}
			for _, id := range ids {
				first, err := tryClaim(s, ctx, "stripe", id, "fp")
				if err != nil || !first.claimed() {
					t.Fatalf("first claim of %s = %+v, %v; want claimed", id, first, err)
				}
				again, err := tryClaim(s, ctx, "stripe", id, "fp")
				if err != nil || again.Found.State != Processing {
					t.Fatalf("second claim of %s = %+v, %v; want in progress", id, again, err)
				}
				if err := s.confirm(ctx, "stripe", id, "fp", time.Hour); err != nil {
					t.Fatal(err)
				}
				dup, err := tryClaim(s, ctx, "stripe", id, "fp")
				if err != nil || dup.Found.State != Done {
					t.Fatalf("claim of %s after confirm = %+v, %v; want done", id, dup, err)
				}
			}
			// Release: the claim key and its failure counter may sit on two
			// nodes; the pipeline reaches both.
			for i := range 6 {
				id := fmt.Sprintf("evt_cluster_rel_%d", i)
				a, err := tryClaim(s, ctx, "resend", id, "fp")
				if err != nil || !a.claimed() {
					t.Fatalf("claim %s = %+v, %v", id, a, err)
				}
				released, failures, err := s.release(ctx, "resend", id, a.Token, time.Hour)
				if err != nil || !released || failures != 1 {
					t.Fatalf("release %s = %v, %d, %v; want released, 1 failure", id, released, failures, err)
				}
				if _, err := s.Inspect(ctx, "resend", id); err == nil {
					t.Fatalf("inspect %s after release: found, want absent", id)
				}
			}
			// Stuck walks every primary.
			stuck, err := s.Stuck(ctx, 0, time.Now().Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if len(stuck) != 0 {
				t.Fatalf("stuck = %d claims, want 0 (all done or released)", len(stuck))
			}
			for _, id := range ids[:9] {
				if _, err := s.ForceRelease(ctx, "stripe", id, true); err != nil {
					t.Fatal(err)
				}
				if a, err := tryClaim(s, ctx, "stripe", id, "fp"); err != nil || !a.claimed() {
					t.Fatalf("reclaim %s = %+v, %v", id, a, err)
				}
			}
			stuck, err = s.Stuck(ctx, 0, time.Now().Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if len(stuck) != 9 {
				t.Fatalf("stuck = %d claims, want the 9 processing ones on every node", len(stuck))
			}
			if err := s.Probe(ctx, "host"); err != nil {
				t.Fatalf("probe on the cluster: %v", err)
			}
		})
	}
}

// nodeOfSlot names the shard (by its first node's id) that serves slot.
func nodeOfSlot(t *testing.T, rdb *redis.ClusterClient, slot int64) string {
	t.Helper()
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
	t.Fatalf("no node serves slot %d", slot)
	return ""
}

// onServer reports whether rdb's connection is to the server at addr
// (CLIENT INFO's laddr is the server's end).
func onServer(ctx context.Context, rdb *redis.Client, addr string) bool {
	info, err := rdb.Do(ctx, "CLIENT", "INFO").Text()
	return err == nil && strings.Contains(info, "laddr="+addr+" ")
}

// TestProbeFindsUnusableRedis: a probe fails wherever a claim would, while
// PING may pass.
func TestProbeFindsUnusableRedis(t *testing.T) {
	t.Parallel()
	cluster := dbtest.StartRedisCluster(t)
	sentinel := dbtest.StartRedisSentinel(t)
	locked := dbtest.StartRedisWithPassword(t, "right-password")

	single := func(o *redis.Options) *Store {
		o.MaxRetries = -1
		c := redis.NewClient(o)
		t.Cleanup(func() { c.Close() })
		return NewStore(c, StoreConfig{Prefix: "webhook", Timeout: 2 * time.Second, ProcessingTTL: time.Minute})
	}
	cases := []struct {
		name  string
		store *Store
		want  string // in the error
	}{
		{"replica", single(&redis.Options{Addr: sentinel.Replica.Addr()}), "READONLY"},
		{"sentinel port", single(&redis.Options{Addr: sentinel.SentinelAddr()}), "unknown command"},
		{"wrong password", single(&redis.Options{Addr: locked.Addr(), Password: "wrong"}), "WRONGPASS"},
		{"no password", single(&redis.Options{Addr: locked.Addr()}), "NOAUTH"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.store.Probe(t.Context(), "host")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("probe = %v, want an error with %q", err, c.want)
			}
		})
	}
	t.Run("one cluster node without a cluster client", func(t *testing.T) {
		// The probe key lives on one of the three nodes: the other two
		// answer MOVED.
		var moved int
		for _, n := range cluster.Nodes {
			err := single(&redis.Options{Addr: n.Addr()}).Probe(t.Context(), "host")
			if err != nil && strings.Contains(err.Error(), "MOVED") {
				moved++
			} else if err != nil {
				t.Errorf("probe on %s = %v, want nil or MOVED", n.Addr(), err)
			}
		}
		if moved != 2 {
			t.Fatalf("%d of 3 nodes answered MOVED, want 2", moved)
		}
	})
	t.Run("right password", func(t *testing.T) {
		if err := single(&redis.Options{Addr: locked.Addr(), Password: "right-password"}).Probe(t.Context(), "host"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestClaimsThroughSentinelFailover: claims made before a failover are
// still there after it (they were replicated), and once the switch has
// settled every claim works on the new primary.
func TestClaimsThroughSentinelFailover(t *testing.T) {
	t.Parallel()
	sentinel := dbtest.StartRedisSentinel(t)
	opts, err := redis.ParseFailoverURL(sentinel.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	// One connection, so "settled" below can say which server it is on.
	opts.PoolSize = 1
	rdb := redis.NewFailoverClient(opts)
	t.Cleanup(func() { rdb.Close() })
	s := NewStore(rdb, StoreConfig{Prefix: "test-sentinel", Timeout: 2 * time.Second, ProcessingTTL: time.Minute})
	ctx := t.Context()

	for i := range 10 {
		id := fmt.Sprintf("evt_before_%d", i)
		if a, err := tryClaim(s, ctx, "stripe", id, "fp"); err != nil || !a.claimed() {
			t.Fatalf("claim %s = %+v, %v", id, a, err)
		}
		if err := s.confirm(ctx, "stripe", id, "fp", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// Replication is asynchronous: wait for the replica to have them, as
	// a failover by the book (SENTINEL FAILOVER waits for the replica to
	// catch up) does.
	if n, err := rdb.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want the replica caught up", n, err)
	}

	newPrimary, err := sentinel.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The client learns of the switch from the sentinel (+switch-master),
	// then drops its connections to the old primary; until then a claim
	// may fail (the delivery runs degraded, as designed). Settled means
	// the client's connection is to the new primary and a probe works.
	settle := time.Now()
	for !onServer(ctx, rdb, newPrimary) || s.Probe(ctx, "host") != nil {
		if time.Since(settle) > 30*time.Second {
			t.Fatalf("claims still fail 30s after the failover to %s: %v", newPrimary, s.Probe(ctx, "host"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("FIGURE claims worked again %v after the failover to %s", time.Since(settle).Round(time.Millisecond), newPrimary)

	for i := range 10 {
		id := fmt.Sprintf("evt_before_%d", i)
		a, err := tryClaim(s, ctx, "stripe", id, "fp")
		if err != nil || a.Found.State != Done {
			t.Fatalf("claim %s after the failover = %+v, %v; want done", id, a, err)
		}
	}
	for i := range 10 {
		id := fmt.Sprintf("evt_after_%d", i)
		if a, err := tryClaim(s, ctx, "stripe", id, "fp"); err != nil || !a.claimed() {
			t.Fatalf("claim %s after the failover = %+v, %v; want claimed", id, a, err)
		}
		if a, err := tryClaim(s, ctx, "stripe", id, "fp"); err != nil || a.Found.State != Processing {
			t.Fatalf("second claim %s = %+v, %v; want in progress", id, a, err)
		}
	}
	if got, _ := sentinel.PrimaryAddr(context.Background()); got != newPrimary {
		t.Fatalf("primary moved again to %s", got)
	}
}
