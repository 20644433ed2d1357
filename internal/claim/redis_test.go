package claim

import (
	"strings"
	"testing"
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
