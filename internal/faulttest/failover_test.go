package faulttest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// TestServiceThroughClusterFailover: a Redis Cluster primary is killed
// (SIGKILL) under a steady trickle of deliveries whose claims hash to its
// slots. Meanwhile /readyz names its slots and webhook_claim_store_usable
// reads 0; within 10 s of its replica's promotion the deliveries are
// claimed again ("first", not "degraded"), and readiness and the gauge say
// so.
func TestServiceThroughClusterFailover(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	cluster := dbtest.StartRedisClusterReplicated(t)
	svc := r.serviceOn(map[string]string{"REDIS_URL": cluster.URL()})
	wantClaimsWork(t, svc)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	evs := eventsInSlots(t, ctx, cluster, "webhook:stripe:", "cfail", 400, 0, 5460) // Nodes[0]'s

	type result struct {
		at          time.Time
		idempotency string
	}
	results := make(chan result, len(evs))
	go func() {
		defer close(results)
		for _, ev := range evs {
			if ctx.Err() != nil {
				return
			}
			start := time.Now()
			a := r.stripe(svc, ev)
			results <- result{start, a.Idempotency}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if first := <-results; first.idempotency != "first" {
		t.Fatalf("delivery before the kill: %q, want first", first.idempotency)
	}
	killed := time.Now()
	cluster.Nodes[0].Kill()
	// Readiness names the dead primary's slots (the others may fail too
	// while the cluster is down: it refuses every key until the replica
	// takes over).
	rep := getReadyz(t, svc)
	if !strings.Contains(rep.Redis, "unusable on slots") || !strings.Contains(rep.Redis, "0-5460") {
		t.Fatalf("/readyz with a primary dead: %+v, want redis unusable on slots 0-5460", rep)
	}
	if g := usableGauge(t, svc); g != 0 {
		t.Fatalf("webhook_claim_store_usable with a primary dead = %v, want 0", g)
	}
	promoted, err := cluster.PromotedAt(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var recovered time.Time
	var degraded, run int
	for res := range results {
		if res.idempotency != "first" {
			degraded++
		}
		switch {
		case res.at.Before(promoted):
		case res.idempotency != "first":
			run = 0
		case run == 0:
			recovered, run = res.at, 1
		default:
			run++
		}
		if run == 10 {
			break
		}
	}
	cancel()
	if run < 10 {
		t.Fatalf("deliveries on the dead primary's slots never claimed again after the promotion (%v after the kill)", promoted.Sub(killed))
	}
	after := recovered.Sub(promoted)
	figure(t, "cluster primary killed: replica promoted %v after the kill; claims on its slots protected again %v after the promotion; %d deliveries ran degraded",
		promoted.Sub(killed).Round(10*time.Millisecond), after.Round(10*time.Millisecond), degraded)
	if after > 10*time.Second {
		t.Fatalf("claims protected again %v after the promotion, want within 10s", after)
	}
	deadline := time.Now().Add(10 * time.Second)
	for getReadyz(t, svc).Redis != "ok" || usableGauge(t, svc) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz %+v and the gauge 10s after claims worked again, want ok and 1", getReadyz(t, svc))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eventsInSlots are n Stripe events whose claim keys (keyPrefix + id) hash
// into [start, end], as the cluster computes it (CLUSTER KEYSLOT).
func eventsInSlots(t *testing.T, ctx context.Context, cluster *dbtest.RedisCluster, keyPrefix, tag string, n int, start, end int64) []faulttest.StripeEvent {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: cluster.Nodes[1].Addr()})
	defer rdb.Close()
	var out []faulttest.StripeEvent
	for i := 0; len(out) < n; i++ {
		ev := subEvent(i, "active")
		ev.ID = fmt.Sprintf("evt_%s_%04d", tag, i)
		ev.SubscriptionID = fmt.Sprintf("sub_%s_%04d", tag, i)
		slot, err := rdb.ClusterKeySlot(ctx, keyPrefix+ev.ID).Result()
		if err != nil {
			t.Fatal(err)
		}
		if start <= slot && slot <= end {
			out = append(out, ev)
		}
	}
	return out
}

// TestServiceUnderDocumentedACL: the service binary logged in to Redis as
// the user of docs/WHERE-IT-RUNS.md's ACL, exactly as written there: its
// probe works (readiness ok, the gauge 1), Stripe events and a mail are
// claimed and then answered as duplicates, never degraded.
func TestServiceUnderDocumentedACL(t *testing.T) {
	t.Parallel()
	r := newTopoRig(t)
	const password = "acl-test-password"
	server := dbtest.StartRedis(t)
	dbtest.ApplyACL(t, dbtest.DocumentedACL(t, password), server.Addr())
	svc := r.serviceOn(map[string]string{
		"REDIS_URL": "redis://" + dbtest.ACLUser + ":" + password + "@" + server.Addr(),
	})
	wantClaimsWork(t, svc)
	evs := events("acl", 10)
	r.deliverAll([]*faulttest.Service{svc}, evs, "first")
	r.deliverAll([]*faulttest.Service{svc}, evs, "duplicate")
	m := newEmail("acl-mail")
	r.api.Add(m)
	for _, want := range []string{"first", "duplicate"} {
		if a := r.resend(svc, m); !a.OK() || a.Idempotency != want {
			t.Fatalf("mail under the ACL: %v, want 2xx %s", a, want)
		}
	}
	wantClaimsWork(t, svc)
}
