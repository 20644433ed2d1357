package claim

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestClaimsUnderDocumentedACL: the client OpenRedis builds, logged in as
// the user of the documented ACL, runs every command the service and the
// claims tool send, on one node, a cluster given by one node (found out by
// INFO) and a Sentinel-managed primary; a key outside the ACL is refused,
// so the ACL is in force.
func TestClaimsUnderDocumentedACL(t *testing.T) {
	t.Parallel()
	const password = "acl-test-password"
	acl := dbtest.DocumentedACL(t, password)
	single := dbtest.StartRedis(t)
	cluster := dbtest.StartRedisCluster(t)
	sentinel := dbtest.StartRedisSentinel(t)
	dbtest.ApplyACL(t, acl, single.Addr())
	dbtest.ApplyACL(t, acl, cluster.Addrs()...)
	dbtest.ApplyACL(t, acl, sentinel.Primary.Addr(), sentinel.Replica.Addr())
	user := url.UserPassword(dbtest.ACLUser, password).String()
	withUser := func(u string) string { return strings.Replace(u, "redis://", "redis://"+user+"@", 1) }
	sentinelURL := sentinel.URL() + "&username=" + dbtest.ACLUser + "&password=" + password
	for _, c := range []struct{ name, url string }{
		{"one node", withUser(single.URL())},
		{"cluster by one node", withUser(cluster.Nodes[0].URL())},
		{"sentinel", sentinelURL},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := openTest(t, c.url, 2*time.Second)
			if c.name == "cluster by one node" {
				if _, ok := rdb.(*redis.ClusterClient); !ok {
					t.Fatalf("OpenRedis gave a %T, want a cluster client (INFO allowed)", rdb)
				}
			}
			// The prefix is the ACL's: the default, as the docs give it.
			s := NewStore(rdb, StoreConfig{Prefix: "webhook", Timeout: 2 * time.Second, ProcessingTTL: time.Minute})
			exerciseEveryCommand(t, s, strings.ReplaceAll(c.name, " ", "_"))
			if err := rdb.Set(t.Context(), "other:key", "x", time.Minute).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Fatalf("SET other:key under the ACL = %v, want NOPERM", err)
			}
		})
	}
}

// exerciseEveryCommand runs each Store method, so each command the service
// and the claims tool send reaches Redis, and fails on any error.
func exerciseEveryCommand(t *testing.T, s *Store, tag string) {
	t.Helper()
	ctx := t.Context()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("ping", s.Ping(ctx))
	must("probe", s.Probe(ctx, "host"))
	id := "evt_acl_" + tag
	a, err := tryClaim(s, ctx, "stripe", id, "fp")
	must("claim", err)
	if !a.claimed() {
		t.Fatalf("claim %s: %+v, want claimed", id, a)
	}
	_, _, err = s.release(ctx, "stripe", id, a.Token, time.Hour)
	must("release", err)
	a, err = tryClaim(s, ctx, "stripe", id, "fp")
	must("claim again", err)
	must("confirm", s.confirm(ctx, "stripe", id, "fp", time.Hour))
	if dup, err := tryClaim(s, ctx, "stripe", id, "fp"); err != nil || dup.Found.State != Done {
		t.Fatalf("claim after confirm = %+v, %v; want done", dup, err)
	}
	_, err = s.Inspect(ctx, "stripe", id)
	must("inspect (claims show)", err)
	_, err = s.ForceRelease(ctx, "stripe", id, true)
	must("force release (claims release -force)", err)
	must("mark done (claims done)", s.MarkDone(ctx, "resend", id, time.Hour))
	if _, err := tryClaim(s, ctx, "resend", id+"_stuck", "fp"); err != nil {
		t.Fatal(err)
	}
	stuck, err := s.Stuck(ctx, 0, time.Now().Add(time.Hour))
	must("stuck (claims stuck)", err)
	if len(stuck) == 0 {
		t.Fatal("claims stuck found nothing, want the processing claim")
	}
	if _, err := s.Inspect(ctx, "stripe", "evt_absent_"+tag); !errors.Is(err, ErrAbsent) {
		t.Fatalf("inspect of an absent key = %v, want ErrAbsent", err)
	}
}
