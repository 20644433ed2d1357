package claim

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

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
		if err := CheckRedisURL(tt.url); err != nil {
			t.Errorf("CheckRedisURL(%q) = %v", tt.url, err)
		}
	}
	o, _ := parseRedisURL("redis://s1:26379?master_name=mymaster&addr=s2:26379&password=primary")
	if o.failover.MasterName != "mymaster" || len(o.failover.SentinelAddrs) != 2 || o.failover.Password != "primary" {
		t.Errorf("sentinel URL read as %+v", o.failover)
	}
	for _, bad := range []string{"redis://s1:26379?master_name=&password=secret-pw", "http://h:1", "redis://h:notaport"} {
		err := CheckRedisURL(bad)
		if err == nil || strings.Contains(err.Error(), "secret-pw") {
			t.Errorf("CheckRedisURL(%q) = %v, want refused without the URL", bad, err)
		}
	}
}

// replyErr is an error reply from Redis, as go-redis types them (its
// redis.Error interface).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestReloadOnlyWithoutReply: a cluster client reloads its slot map when a
// command gets no reply from Redis (what a dead primary gives), or the
// cluster says it is down; not on Redis's own answers.
func TestReloadOnlyWithoutReply(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{context.Canceled, false},
		{replyErr("NOSCRIPT No matching script"), false},
		{replyErr("NOPERM this user has no permissions"), false},
		{replyErr("MOVED 3999 127.0.0.1:6381"), false}, // go-redis reloads on it itself
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{refused, true},
		{fmt.Errorf("claim: %w", refused), true},
		{io.EOF, true},
		{context.DeadlineExceeded, true},
	}
	for _, tt := range tests {
		if got := noReply(tt.err); got != tt.want {
			t.Errorf("noReply(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestOpenRedisClusterRefresh: the cluster client OpenRedis builds reloads
// its slot map every SlotMapRefresh, not go-redis's minute.
func TestOpenRedisClusterRefresh(t *testing.T) {
	t.Parallel()
	rdb, err := OpenRedis("redis://127.0.0.1:1?addr=127.0.0.1:2", 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	c, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("OpenRedis on a cluster URL = %T, want *redis.ClusterClient", rdb)
	}
	if got := c.Options().ClusterStateReloadInterval; got != SlotMapRefresh {
		t.Errorf("ClusterStateReloadInterval = %v, want %v", got, SlotMapRefresh)
	}
	if o := c.Options(); o.MaxRedirects != 1 || o.MaxRetries != -1 || o.ReadTimeout != 100*time.Millisecond {
		t.Errorf("cluster options MaxRedirects %d, MaxRetries %d, ReadTimeout %v; want 1, -1, 100ms", o.MaxRedirects, o.MaxRetries, o.ReadTimeout)
	}
}
