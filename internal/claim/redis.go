package claim

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisURLForms is what REDIS_URL may be, for the messages that refuse it.
const RedisURLForms = "want redis[s]://[user:password@]host:port[/db] (one node, or any one node of a cluster)," +
	" redis[s]://host:port?addr=host2:port2&addr=host3:port3 (a cluster)" +
	" or redis[s]://[user:password@]sentinel:26379?master_name=NAME&addr=sentinel2:26379[&password=P] (Sentinel)"

// ErrRedisURL refuses a REDIS_URL that none of go-redis's forms reads. It
// never quotes the URL, which may hold a password.
var ErrRedisURL = errors.New("REDIS_URL is invalid: " + RedisURLForms)

// SlotMapRefresh is how stale a cluster client's slot map may get when no
// command has failed: go-redis reloads it lazily, on the first command
// after this long (its default is a minute). A failover is noticed sooner
// still: a MOVED reloads the map (go-redis), and so does a command that
// fails without a reply from Redis (reloadOnFailure), which is what a dead
// primary gives. A reload is one CLUSTER SLOTS; go-redis runs at most one
// at a time, five a second at most.
const SlotMapRefresh = 5 * time.Second

// redisTarget is REDIS_URL read in one of go-redis's three forms: exactly
// one field is set.
type redisTarget struct {
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// CheckRedisURL reports whether rawURL is one of the forms OpenRedis reads.
func CheckRedisURL(rawURL string) error {
	if _, err := parseRedisURL(rawURL); err != nil {
		return ErrRedisURL
	}
	return nil
}

// parseRedisURL reads REDIS_URL as go-redis reads each form: master_name
// makes it Sentinel (redis.ParseFailoverURL), addr a cluster
// (redis.ParseClusterURL), anything else one node (redis.ParseURL), which
// OpenRedis may still find to be a cluster node.
func parseRedisURL(raw string) (redisTarget, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return redisTarget{}, err
	}
	q := u.Query()
	switch {
	case q.Has("master_name"):
		if q.Get("master_name") == "" {
			return redisTarget{}, errors.New("empty master_name")
		}
		o, err := redis.ParseFailoverURL(raw)
		return redisTarget{failover: o}, err
	case q.Has("addr"):
		o, err := redis.ParseClusterURL(raw)
		return redisTarget{cluster: o}, err
	}
	o, err := redis.ParseURL(raw)
	return redisTarget{single: o}, err
}

// OpenRedis is the client the claims run on: nil for an empty URL (claims
// disabled), a Sentinel-managed primary's, a cluster's or one node's. A
// one-node URL is asked (INFO cluster, within the timeout) whether it
// names a cluster node, and if so is followed as a cluster: a plain client
// there would be answered MOVED for most keys. When the node does not
// answer, it is taken for a single node; the probe then shows whether
// claims work.
func OpenRedis(rawURL string, timeout time.Duration) (redis.UniversalClient, error) {
	if rawURL == "" {
		return nil, nil
	}
	target, err := parseRedisURL(rawURL)
	if err != nil {
		return nil, ErrRedisURL // the parser's error would echo the URL
	}
	uo := target.universal()
	tune(uo, timeout)
	switch {
	case target.failover != nil:
		return redis.NewFailoverClient(uo.Failover()), nil
	case target.cluster != nil:
		return newClusterClient(uo), nil
	}
	node := redis.NewClient(uo.Simple())
	if isClusterNode(node, timeout) {
		_ = node.Close()
		return newClusterClient(uo), nil
	}
	return node, nil
}

// universal is the target as go-redis's one options type: where it names
// a primary's sentinels, a cluster, or one node.
func (t redisTarget) universal() *redis.UniversalOptions {
	switch {
	case t.failover != nil:
		o := t.failover
		return &redis.UniversalOptions{
			MasterName: o.MasterName, Addrs: o.SentinelAddrs,
			SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword,
			Username: o.Username, Password: o.Password, DB: o.DB, TLSConfig: o.TLSConfig,
			ClientName: o.ClientName, Protocol: o.Protocol,
		}
	case t.cluster != nil:
		o := t.cluster
		return &redis.UniversalOptions{
			Addrs: o.Addrs, Username: o.Username, Password: o.Password,
			TLSConfig: o.TLSConfig, ClientName: o.ClientName, Protocol: o.Protocol,
		}
	}
	o := t.single
	return &redis.UniversalOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password,
		DB: o.DB, TLSConfig: o.TLSConfig, ClientName: o.ClientName, Protocol: o.Protocol,
	}
}

// isClusterNode asks a node whether it runs in cluster mode.
func isClusterNode(rdb *redis.Client, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := rdb.Info(ctx, "cluster").Result()
	return err == nil && strings.Contains(info, "cluster_enabled:1")
}

// tune gives every form the settings below. Every call is bounded by
// REDIS_TIMEOUT and never retried: a slow Redis must degrade a delivery
// quickly, not multiply its wait.
//
// go-redis also retries a failed dial (5 times, 100 ms apart, by default),
// which made each delivery wait ~250-400 ms while Redis was down. One
// attempt fails fast; the cost is that recovery is noticed within about a
// second instead of at once.
//
// A claim's commands and replies are a few hundred bytes, but go-redis
// gives every connection 32 KiB read and write buffers: with 64 deliveries
// in flight that was 4 MiB, most of the heap (heap profile under 64
// concurrent duplicates). 1 KiB holds any claim command or reply; a bigger
// reply just takes more reads.
//
// A cluster client's nodes never retry either (MaxRetries -1), but the
// cluster client's own loop runs MaxRedirects+1 times and spends its extra
// turns both on MOVED/ASK redirects and on repeating a command after a
// network error (go-redis osscluster.go, process): -1 would leave no turn
// for a redirect, so a resharded or failed-over slot would fail every
// claim. One turn follows one redirect, or repeats a command once, inside
// the same REDIS_TIMEOUT deadline. A repeated claim script finds its own
// processing claim and answers in progress (409), never a wrong 2xx. The
// other forms do not read MaxRedirects.
func tune(o *redis.UniversalOptions, timeout time.Duration) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout, timeout
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	o.MaxRedirects = 1
	o.DialerRetries = 1
	o.PoolSize = 64
	o.ReadBufferSize, o.WriteBufferSize = 1<<10, 1<<10
	o.MinIdleConns = 4
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// newClusterClient is a cluster client whose slot map follows a failover
// within seconds. redis.UniversalOptions has no field for the refresh, so
// the cluster's options are built from it and the one field set here.
func newClusterClient(uo *redis.UniversalOptions) *redis.ClusterClient {
	o := uo.Cluster()
	o.ClusterStateReloadInterval = SlotMapRefresh
	c := redis.NewClusterClient(o)
	c.AddHook(reloadOnFailure{c})
	return c
}

// reloadOnFailure reloads a cluster client's slot map when a command fails
// without a reply from Redis (refused, reset, timed out). go-redis reloads
// on a MOVED, but a primary that was killed answers nothing: its slots'
// commands fail against its address until the map is reloaded, and only
// the periodic reload did that. After its replica is promoted, the first
// claim that fails on the dead address reloads the map, and the next one
// reaches the new primary. While the primary is down and not yet replaced,
// each reload finds the same map: go-redis coalesces them (one at a time,
// 200 ms apart).
type reloadOnFailure struct{ c *redis.ClusterClient }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(err)
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.after(err)
		return err
	}
}

func (h reloadOnFailure) after(err error) {
	if noReply(err) {
		h.c.ReloadState(context.Background())
	}
}

// noReply reports whether err is a failure to reach Redis rather than
// Redis's own answer (redis.Nil, a script's error, NOSCRIPT, MOVED...). A
// CLUSTERDOWN counts too: the cluster's map is changing.
func noReply(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return strings.HasPrefix(reply.Error(), "CLUSTERDOWN")
	}
	return true
}
