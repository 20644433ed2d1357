// Package claim turns at-least-once webhook delivery into effects applied
// once: a delivery claims its event id in Redis, runs its handler, then
// confirms (the id is done) or releases (the id is free for the retry).
//
// A claim key is in one of three states: absent (no key), Processing (a
// delivery holds it, for the processing TTL) or Done (the effect is
// committed, for the provider's dedupe TTL). docs/DESIGN.md says why.
package claim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoRedis is returned by every Store method when no Redis is configured.
var ErrNoRedis = errors.New("no redis configured")

// State is what a claim key holds. An absent key has no State.
type State string

const (
	Processing State = "processing"
	Done       State = "done"
)

// Entry is one claim key as read from Redis. Its value is
//
//	processing|{owner token}|{claimed at, unix ms}|{body fingerprint}
//	done|{confirmed at, unix ms}|{body fingerprint}
//
// and State is empty when Raw is neither (a foreign or corrupted key).
type Entry struct {
	Key      string
	Provider string
	EventID  string

	State       State
	Owner       string // Processing only
	At          time.Time
	Fingerprint string
	Raw         string
	// TTL is the time left before the key expires; negative when it has no
	// expiry (nothing this service writes).
	TTL time.Duration
	// Failures counts the releases of this event's claims after a caught
	// failure, within the dedupe TTL (read by the operator tools only).
	Failures int64
}

// Store keeps claims in Redis under {prefix}:{provider}:{event id}. Every
// call is bounded by the configured timeout, so a hung Redis degrades a
// delivery quickly instead of eating its handler's budget.
//
// rdb is any of go-redis's clients: one node, a Sentinel-managed primary
// (redis.NewFailoverClient) or a Redis Cluster (redis.NewClusterClient).
// Every command touches one key, so each lands on the key's own node; the
// two pipelines (release, Inspect) touch a key and its failure counter,
// which a cluster client sends to each key's node in the same round trip.
type Store struct {
	rdb           redis.UniversalClient // nil: claims disabled
	prefix        string
	timeout       time.Duration
	processingTTL time.Duration

	probeKeysMu sync.Mutex
	probeKeys   map[[2]int]string // a cluster's probe keys, by slot range
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Prefix is the first segment of every key ("webhook" in production).
	Prefix string
	// Timeout bounds each Redis call.
	Timeout time.Duration
	// ProcessingTTL is how long a claim lives when nobody confirms or releases
	// it: the only recovery after a crash, so it must outlast any handler.
	ProcessingTTL time.Duration
}

// NewStore returns a Store on rdb. A nil rdb makes every call fail with
// ErrNoRedis, which the flow treats as "Redis unavailable".
func NewStore(rdb redis.UniversalClient, cfg StoreConfig) *Store {
	if c, ok := rdb.(*redis.Client); ok && c == nil {
		rdb = nil // a nil *redis.Client is no client, not a broken one
	}
	return &Store{rdb: rdb, prefix: cfg.Prefix, timeout: cfg.Timeout, processingTTL: cfg.ProcessingTTL}
}

// Key is the Redis key of one provider's event.
func (s *Store) Key(provider, eventID string) string {
	return s.prefix + ":" + provider + ":" + eventID
}

// failuresKey counts an event's failed attempts, beside its claim key.
func failuresKey(key string) string { return key + ":failures" }

// claimLua takes the claim or reports what holds the key, in one round
// trip: SET NX, else the existing value and its remaining TTL.
const claimLua = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}
`

var claimScript = redis.NewScript(claimLua)

// releaseScript deletes the key only while it still holds the caller's own
// processing claim: a claim that expired and was taken by another delivery,
// or one already confirmed, is left alone.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// claim tries to move the key from absent to Processing. fingerprint
// identifies the delivery's body, so a reused id with another body shows.
// It returns the owner token when it took the claim; otherwise the entry
// that holds the key (State Processing or Done, or empty when unreadable).
func (s *Store) claim(ctx context.Context, provider, eventID, fingerprint string) (token string, found Entry, err error) {
	if s.rdb == nil {
		return "", Entry{}, ErrNoRedis
	}
	token, err = newToken()
	if err != nil {
		return "", Entry{}, err
	}
	e := Entry{State: Processing, Owner: token, At: time.Now(), Fingerprint: fingerprint}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	res, err := claimScript.Run(ctx, s.rdb, []string{key}, e.value(), s.processingTTL.Milliseconds()).Slice()
	if err != nil {
		return "", Entry{}, fmt.Errorf("claim %s: %w", key, err)
	}
	if len(res) == 1 {
		return token, Entry{}, nil
	}
	if len(res) != 3 {
		return "", Entry{}, fmt.Errorf("claim %s: unexpected reply %v", key, res)
	}
	raw, _ := res[1].(string)
	pttl, _ := res[2].(int64)
	return "", newEntry(key, provider, eventID, raw, time.Duration(max(pttl, 0))*time.Millisecond), nil
}

// confirm marks the event Done for ttl. It is a plain SET, not NX, so it
// lands whatever the key holds: the effect is committed, and a done marker
// is the truth even if our processing claim expired meanwhile.
func (s *Store) confirm(ctx context.Context, provider, eventID, fingerprint string, ttl time.Duration) error {
	if s.rdb == nil {
		return ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	e := Entry{State: Done, At: time.Now(), Fingerprint: fingerprint}
	if err := s.rdb.Set(ctx, key, e.value(), ttl).Err(); err != nil {
		return fmt.Errorf("confirm %s: %w", key, err)
	}
	return nil
}

// release deletes the caller's own processing claim after a caught failure
// and counts the failure beside it for failuresTTL, so that an event failing
// every attempt shows. It reports whether it deleted the claim and the
// event's failures so far. Both travel in one pipelined round trip of
// single-key commands, and only on the failure path. The two keys may hash
// to different cluster slots: a cluster client splits the pipeline by node
// and sends the parts at once (tested on a 3-node cluster).
func (s *Store) release(ctx context.Context, provider, eventID, token string, failuresTTL time.Duration) (released bool, failures int64, err error) {
	if s.rdb == nil {
		return false, 0, ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	pipe := s.rdb.Pipeline()
	// Eval, not Run: a pipeline cannot fall back from EVALSHA on NOSCRIPT.
	del := releaseScript.Eval(ctx, pipe, []string{key}, ownerPrefix(token))
	incr := pipe.Incr(ctx, failuresKey(key))
	pipe.PExpire(ctx, failuresKey(key), failuresTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return false, 0, fmt.Errorf("release %s: %w", key, err)
	}
	n, err := del.Int()
	if err != nil {
		return false, 0, fmt.Errorf("release %s: %w", key, err)
	}
	return n == 1, incr.Val(), nil
}

// giveBack deletes the caller's own processing claim, as release does,
// without counting a failure: the attempt was turned away (ErrBusy), it
// did not fail.
func (s *Store) giveBack(ctx context.Context, provider, eventID, token string) error {
	if s.rdb == nil {
		return ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	if err := releaseScript.Run(ctx, s.rdb, []string{key}, ownerPrefix(token)).Err(); err != nil {
		return fmt.Errorf("give back %s: %w", key, err)
	}
	return nil
}

// Ping reports whether Redis answers within the timeout. It says nothing
// about whether a claim would work there: Probe does.
func (s *Store) Ping(ctx context.Context) error {
	if s.rdb == nil {
		return ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.rdb.Ping(ctx).Err()
}

func newToken() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("claim token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// value is the entry as written to Redis.
func (e Entry) value() string {
	ms := strconv.FormatInt(e.At.UnixMilli(), 10)
	if e.State == Processing {
		return string(Processing) + "|" + e.Owner + "|" + ms + "|" + e.Fingerprint
	}
	return string(Done) + "|" + ms + "|" + e.Fingerprint
}

func ownerPrefix(token string) string {
	return string(Processing) + "|" + token + "|"
}

// newEntry reads a key's raw value back. Redis is shared state, so the value
// is untrusted input: one that does not parse leaves State empty.
func newEntry(key, provider, eventID, raw string, ttl time.Duration) Entry {
	e := Entry{Key: key, Provider: provider, EventID: eventID, Raw: raw, TTL: ttl}
	if err := e.parse(raw); err != nil {
		e.State, e.Owner, e.Fingerprint = "", "", ""
	}
	return e
}

func (e *Entry) parse(s string) error {
	parts := strings.Split(s, "|")
	var ms string
	switch {
	case len(parts) == 4 && parts[0] == string(Processing) && parts[1] != "":
		e.State, e.Owner, ms, e.Fingerprint = Processing, parts[1], parts[2], parts[3]
	case len(parts) == 3 && parts[0] == string(Done):
		e.State, ms, e.Fingerprint = Done, parts[1], parts[2]
	default:
		return fmt.Errorf("claim value %.40q: unknown format", s)
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("claim value %.40q: bad time", s)
	}
	e.At = time.UnixMilli(n)
	return nil
}
