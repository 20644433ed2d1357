package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// openTest is OpenRedis as the service opens it, closed in t.Cleanup.
func openTest(t *testing.T, url string, timeout time.Duration) redis.UniversalClient {
	t.Helper()
	rdb, err := OpenRedis(url, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// idsInSlots are n event ids whose stripe claim keys under s hash into
// [start, end].
func idsInSlots(s *Store, tag string, n, start, end int) []string {
	var ids []string
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprintf("evt_%s_%d", tag, i)
		if slot := keySlot(s.Key("stripe", id)); start <= slot && slot <= end {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestKeySlotIsRedis: the slot the probe computes for a key is the one
// the cluster gives it (CLUSTER KEYSLOT), hash tags included.
func TestKeySlotIsRedis(t *testing.T) {
	t.Parallel()
	cluster := dbtest.StartRedisCluster(t)
	rdb := openTest(t, cluster.URL(), 2*time.Second)
	keys := []string{"", "a", "webhook:stripe:evt_1", "webhook:probe:host:{17}", "{user1000}.following",
		"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "webhook:probe:h{ost:{3}"}
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("webhook:resend:msg_%d:failures", i))
	}
	for _, k := range keys {
		want, err := rdb.ClusterKeySlot(t.Context(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, want %d (CLUSTER KEYSLOT)", k, got, want)
		}
	}
}

// TestProbeEveryShard: on a cluster the probe claims a key in each
// primary's slots, and a primary that stops makes it fail naming that
// primary's slots only (the cluster is told to keep serving the others).
func TestProbeEveryShard(t *testing.T) {
	t.Parallel()
	cluster := dbtest.StartRedisCluster(t)
	rdb := openTest(t, cluster.Nodes[0].URL(), 2*time.Second) // one node's URL: followed as a cluster
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		t.Fatalf("OpenRedis on a cluster node gave a %T, want a cluster client", rdb)
	}
	s := NewStore(rdb, StoreConfig{Prefix: "test-shards", Timeout: 2 * time.Second, ProcessingTTL: time.Minute})
	ctx := t.Context()
	if err := s.Probe(ctx, "host"); err != nil {
		t.Fatalf("probe on a healthy cluster: %v", err)
	}
	for _, n := range cluster.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		keys, _, err := c.Scan(ctx, 0, "test-shards:probe:host:*", 1000).Result()
		c.Close()
		if err != nil || len(keys) != 1 {
			t.Fatalf("probe keys on %s = %v, %v; want one", n.Addr(), keys, err)
		}
	}
	for _, n := range cluster.Nodes[1:] {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		err := c.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	cluster.Nodes[0].Kill()
	// Whether the cluster still lists the dead primary (its slots then
	// fail to connect) or has marked it failed, its slots fail and only
	// they.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Probe(ctx, "host")
		var shards *ShardsError
		if errors.As(err, &shards) && shards.Slots() == "0-5460" && shards.Of >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe with a primary killed = %v; want slots 0-5460 alone failing", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClaimsFollowClusterFailover: a primary is killed under a steady
// trickle of claims on its slots; once its replica is promoted, claims
// there work again within 10 s (go-redis alone reloads its slot map once
// a minute), and the probe names the shard while they do not.
func TestClaimsFollowClusterFailover(t *testing.T) {
	t.Parallel()
	cluster := dbtest.StartRedisClusterReplicated(t)
	rdb := openTest(t, cluster.URL(), 500*time.Millisecond)
	s := NewStore(rdb, StoreConfig{Prefix: "test-failover", Timeout: 500 * time.Millisecond, ProcessingTTL: time.Minute})
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := s.Probe(ctx, "host"); err != nil {
		t.Fatalf("probe before the failover: %v", err)
	}

	type result struct {
		at time.Time
		ok bool
	}
	results := make(chan result, 4096)
	ids := idsInSlots(s, "failover", 3000, 0, 5460) // Nodes[0]'s slots
	go func() {
		defer close(results)
		for _, id := range ids {
			start := time.Now()
			a, err := tryClaim(s, ctx, "stripe", id, "fp")
			results <- result{start, err == nil && a.claimed()}
			if ctx.Err() != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// A claim or two works before the kill.
	if r := <-results; !r.ok {
		t.Fatal("claim before the failover failed")
	}
	killed := time.Now()
	cluster.Nodes[0].Kill()
	err := s.Probe(ctx, "host")
	var shards *ShardsError
	if !errors.As(err, &shards) || !slices.ContainsFunc(shards.Failed, func(sh Shard) bool { return sh.Slots == "0-5460" }) {
		t.Fatalf("probe with the primary dead = %v, want it to name slots 0-5460", err)
	}
	promoted, err := cluster.PromotedAt(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Protected again: the first claim of a run of 20 that all worked,
	// started after the promotion.
	var recovered time.Time
	run := 0
	for r := range results {
		switch {
		case r.at.Before(promoted):
		case !r.ok:
			run = 0
		case run == 0:
			recovered, run = r.at, 1
		default:
			run++
		}
		if run == 20 {
			break
		}
	}
	cancel()
	if run < 20 {
		t.Fatalf("claims on the failed primary's slots never worked again after its replica's promotion (%v after the kill)", promoted.Sub(killed))
	}
	after := recovered.Sub(promoted)
	t.Logf("FIGURE cluster failover: replica promoted %v after the kill; claims on its slots worked again %v after the promotion",
		promoted.Sub(killed).Round(10*time.Millisecond), after.Round(10*time.Millisecond))
	if after > 10*time.Second {
		t.Fatalf("claims worked again %v after the promotion, want within 10s", after)
	}
	// The probe reads the cluster's own map, which may list the dead
	// primary a little longer.
	deadline := time.Now().Add(10 * time.Second)
	for err := s.Probe(t.Context(), "host"); err != nil; err = s.Probe(t.Context(), "host") {
		if time.Now().After(deadline) {
			t.Fatalf("probe 10s after claims worked again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
