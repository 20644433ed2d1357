// Package claim turns at-least-once webhook delivery into effects applied
// once: a delivery claims its event id in Redis, runs its handler, then
// confirms (the id is done) or releases (the id is free for the retry).
package claim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoRedis is returned by every Store method when no Redis is configured.
var ErrNoRedis = errors.New("no redis configured")

// Status is what a claim attempt found.
type Status int

const (
	// Claimed: the key was absent and now holds this caller's processing claim.
	Claimed Status = iota + 1
	// InProgress: another attempt holds a processing claim (or crashed holding it).
	InProgress
	// Done: an earlier delivery confirmed the event.
	Done
)

func (s Status) String() string {
	switch s {
	case Claimed:
		return "claimed"
	case InProgress:
		return "in-progress"
	case Done:
		return "done"
	}
	return "unknown"
}

// Reply is the answer to a claim attempt.
type Reply struct {
	Status Status
	// Token identifies this caller's claim (Claimed only); Release needs it.
	Token string
	// TTL is the time left on the existing key (InProgress and Done).
	TTL time.Duration
	// Existing is the value found under the key (InProgress and Done).
	Existing Value
}

// Store keeps claims in Redis under {prefix}:{provider}:{event id}. Every
// call is bounded by the configured timeout, so a hung Redis degrades a
// delivery quickly instead of eating its handler's budget.
type Store struct {
	rdb           *redis.Client // nil: claims disabled
	prefix        string
	timeout       time.Duration
	processingTTL time.Duration
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
func NewStore(rdb *redis.Client, cfg StoreConfig) *Store {
	return &Store{rdb: rdb, prefix: cfg.Prefix, timeout: cfg.Timeout, processingTTL: cfg.ProcessingTTL}
}

// Key is the Redis key of one provider's event.
func (s *Store) Key(provider, eventID string) string {
	return s.prefix + ":" + provider + ":" + eventID
}

// claimScript takes the claim or reports what holds the key, in one round
// trip: SET NX, else the existing value and its remaining TTL.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}
`)

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

// Claim tries to move the key from absent to processing. fingerprint
// identifies the delivery's body, so a reused id with another body shows.
func (s *Store) Claim(ctx context.Context, provider, eventID, fingerprint string) (Reply, error) {
	if s.rdb == nil {
		return Reply{}, ErrNoRedis
	}
	token, err := newToken()
	if err != nil {
		return Reply{}, err
	}
	now := time.Now()
	v := Value{State: Processing, Owner: token, At: now, Fingerprint: fingerprint}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	res, err := claimScript.Run(ctx, s.rdb, []string{key}, v.String(), s.processingTTL.Milliseconds()).Slice()
	if err != nil {
		return Reply{}, fmt.Errorf("claim %s: %w", key, err)
	}
	if len(res) == 1 {
		return Reply{Status: Claimed, Token: token}, nil
	}
	return existingReply(res)
}

func existingReply(res []any) (Reply, error) {
	if len(res) != 3 {
		return Reply{}, fmt.Errorf("claim script: unexpected reply %v", res)
	}
	raw, _ := res[1].(string)
	pttl, _ := res[2].(int64)
	existing, err := ParseValue(raw)
	if err != nil {
		// An unreadable value is someone else's key or a corrupted one.
		// Treating it as in progress makes the provider retry until it
		// expires, which is slower but never drops the event.
		return Reply{Status: InProgress, TTL: time.Duration(max(pttl, 0)) * time.Millisecond}, nil
	}
	r := Reply{Status: InProgress, Existing: existing, TTL: time.Duration(max(pttl, 0)) * time.Millisecond}
	if existing.State == Confirmed {
		r.Status = Done
	}
	return r, nil
}

// Confirm marks the event done for ttl. It is a plain SET, not NX, so it
// lands whatever the key holds: the effect is committed, and a done marker
// is the truth even if our processing claim expired meanwhile.
func (s *Store) Confirm(ctx context.Context, provider, eventID, fingerprint string, ttl time.Duration) error {
	if s.rdb == nil {
		return ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	v := Value{State: Confirmed, At: time.Now(), Fingerprint: fingerprint}
	if err := s.rdb.Set(ctx, key, v.String(), ttl).Err(); err != nil {
		return fmt.Errorf("confirm %s: %w", key, err)
	}
	return nil
}

// Release deletes the caller's own processing claim and reports whether it
// did; any other value under the key is left as it is.
func (s *Store) Release(ctx context.Context, provider, eventID, token string) (bool, error) {
	if s.rdb == nil {
		return false, ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	n, err := releaseScript.Run(ctx, s.rdb, []string{key}, ownerPrefix(token)).Int()
	if err != nil {
		return false, fmt.Errorf("release %s: %w", key, err)
	}
	return n == 1, nil
}

// Ping reports whether Redis answers within the timeout.
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

// State is the kind of value stored under a claim key.
type State string

const (
	Processing State = "processing"
	Confirmed  State = "done"
)

// Value is what a claim key holds:
//
//	processing|{owner token}|{claimed at, unix ms}|{body fingerprint}
//	done|{confirmed at, unix ms}|{body fingerprint}
type Value struct {
	State       State
	Owner       string // processing only
	At          time.Time
	Fingerprint string
}

func (v Value) String() string {
	ms := strconv.FormatInt(v.At.UnixMilli(), 10)
	if v.State == Processing {
		return string(Processing) + "|" + v.Owner + "|" + ms + "|" + v.Fingerprint
	}
	return string(Confirmed) + "|" + ms + "|" + v.Fingerprint
}

func ownerPrefix(token string) string {
	return string(Processing) + "|" + token + "|"
}

// ParseValue reads a claim key's value back. Redis is shared state, so the
// value is treated as untrusted input.
func ParseValue(s string) (Value, error) {
	parts := strings.Split(s, "|")
	var v Value
	var ms string
	switch {
	case len(parts) == 4 && parts[0] == string(Processing) && parts[1] != "":
		v = Value{State: Processing, Owner: parts[1], Fingerprint: parts[3]}
		ms = parts[2]
	case len(parts) == 3 && parts[0] == string(Confirmed):
		v = Value{State: Confirmed, Fingerprint: parts[2]}
		ms = parts[1]
	default:
		return Value{}, fmt.Errorf("claim value %.40q: unknown format", s)
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return Value{}, fmt.Errorf("claim value %.40q: bad time", s)
	}
	v.At = time.UnixMilli(n)
	return v, nil
}
