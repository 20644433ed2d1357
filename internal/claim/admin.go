package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Operator tools: what `munchable-webhooks claims` needs to look at a claim
// and to settle one by hand. The delivery path never calls these.

var (
	// ErrAbsent: no key for the event (never claimed, released or expired).
	ErrAbsent = errors.New("no claim")
	// ErrNotProcessing: ForceRelease found a done key (or a value that is not
	// a claim) and was not told to force.
	ErrNotProcessing = errors.New("not a processing claim")
)

// Inspect reads the key of one provider's event. It returns ErrAbsent when
// there is none.
func (s *Store) Inspect(ctx context.Context, provider, eventID string) (Entry, error) {
	if s.rdb == nil {
		return Entry{}, ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	// One round trip, so the TTL belongs to the value read.
	pipe := s.rdb.Pipeline()
	get := pipe.Get(ctx, key)
	pttl := pipe.PTTL(ctx, key)
	failures := pipe.Get(ctx, failuresKey(key))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Entry{}, fmt.Errorf("inspect %s: %w", key, err)
	}
	raw, err := get.Result()
	if errors.Is(err, redis.Nil) {
		// The failures outlive the claim they were counted on: a poison
		// event whose last attempt was released has no key, but its
		// count is what the operator came for.
		e := Entry{Key: key, Provider: provider, EventID: eventID}
		e.Failures, _ = failures.Int64()
		return e, fmt.Errorf("%s: %w", key, ErrAbsent)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("inspect %s: %w", key, err)
	}
	e := newEntry(key, provider, eventID, raw, pttl.Val())
	e.Failures, _ = failures.Int64() // absent: no failure
	return e, nil
}

// forceReleaseScript deletes a processing claim whoever owns it, and any
// other value only when ARGV[2] is "force". Checking and deleting in one
// script means a claim confirmed in between is not deleted by mistake.
var forceReleaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  return {0, ''}
end
if string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] or ARGV[2] == 'force' then
  redis.call('DEL', KEYS[1])
  return {1, v}
end
return {0, v}
`)

// ForceRelease deletes the event's processing claim, whoever holds it, so
// the provider's next retry is a first delivery instead of waiting out the
// processing TTL. A done key (or a value that is not a claim) is deleted
// only with force, since deleting it lets the next retry apply the event
// again. It returns what it deleted; ErrAbsent when there was nothing, and
// ErrNotProcessing, with the entry found, when it refused.
func (s *Store) ForceRelease(ctx context.Context, provider, eventID string, force bool) (Entry, error) {
	if s.rdb == nil {
		return Entry{}, ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	key := s.Key(provider, eventID)
	mode := ""
	if force {
		mode = "force"
	}
	res, err := forceReleaseScript.Run(ctx, s.rdb, []string{key}, string(Processing)+"|", mode).Slice()
	if err != nil {
		return Entry{}, fmt.Errorf("release %s: %w", key, err)
	}
	if len(res) != 2 {
		return Entry{}, fmt.Errorf("release %s: unexpected reply %v", key, res)
	}
	deleted, _ := res[0].(int64)
	raw, _ := res[1].(string)
	if raw == "" {
		return Entry{}, fmt.Errorf("%s: %w", key, ErrAbsent)
	}
	e := newEntry(key, provider, eventID, raw, 0)
	if deleted != 1 {
		state := string(e.State)
		if state == "" {
			state = "a value that is not a claim"
		}
		return e, fmt.Errorf("%s is %s: %w", key, state, ErrNotProcessing)
	}
	return e, nil
}

// MarkDone writes the event's done marker for ttl (the provider's dedupe
// TTL), whatever the key holds: for an event whose effect an operator has
// applied or chosen to skip. It keeps the fingerprint of the value it
// replaces, so a later delivery with another body still shows as a
// mismatch. A processing attempt still running is not disturbed: its
// confirm rewrites the marker and its release leaves a done key alone.
func (s *Store) MarkDone(ctx context.Context, provider, eventID string, ttl time.Duration) error {
	e, err := s.Inspect(ctx, provider, eventID)
	if err != nil && !errors.Is(err, ErrAbsent) {
		return err
	}
	return s.confirm(ctx, provider, eventID, e.Fingerprint, ttl)
}

// Stuck lists the processing claims claimed before now minus olderThan,
// oldest first. It walks the key space with SCAN, which never blocks Redis
// the way KEYS does; on a Redis Cluster it walks every primary, since SCAN
// sees only the node it is sent to.
func (s *Store) Stuck(ctx context.Context, olderThan time.Duration, now time.Time) ([]Entry, error) {
	if s.rdb == nil {
		return nil, ErrNoRedis
	}
	var (
		mu    sync.Mutex
		stuck []Entry
	)
	walk := func(ctx context.Context, node redis.Cmdable) error {
		found, err := s.stuckOn(ctx, node, olderThan, now)
		mu.Lock()
		stuck = append(stuck, found...)
		mu.Unlock()
		return err
	}
	var err error
	if cluster, ok := s.rdb.(*redis.ClusterClient); ok {
		// The primaries are walked at once, each by its own goroutine,
		// which ForEachMaster waits for.
		err = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return walk(ctx, node)
		})
	} else {
		err = walk(ctx, s.rdb)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(stuck, func(a, b Entry) int { return a.At.Compare(b.At) })
	if err := s.readFailures(ctx, stuck); err != nil {
		return nil, err
	}
	return stuck, nil
}

// stuckOn walks one node's keys under the prefix (SCAN goes to node) and
// returns its stuck claims.
func (s *Store) stuckOn(ctx context.Context, node redis.Cmdable, olderThan time.Duration, now time.Time) ([]Entry, error) {
	const batch = 500
	prefix := s.prefix + ":"
	var stuck []Entry
	var cursor uint64
	for {
		// Each call is bounded on its own: a long walk is many short calls.
		keys, next, err := s.scan(ctx, node, cursor, escapeGlob(prefix)+"*", batch)
		if err != nil {
			return nil, err
		}
		entries, err := s.read(ctx, node, keys)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.State == Processing && now.Sub(e.At) > olderThan {
				e.Provider, e.EventID, _ = strings.Cut(strings.TrimPrefix(e.Key, prefix), ":")
				stuck = append(stuck, e)
			}
		}
		if cursor = next; cursor == 0 {
			return stuck, nil
		}
	}
}

// readFailures fills in each entry's failed attempts, in one round trip.
func (s *Store) readFailures(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(entries))
	for i, e := range entries {
		gets[i] = pipe.Get(ctx, failuresKey(e.Key))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read failures: %w", err)
	}
	for i := range entries {
		entries[i].Failures, _ = gets[i].Int64() // absent: no failure
	}
	return nil
}

func (s *Store) scan(ctx context.Context, node redis.Cmdable, cursor uint64, match string, count int64) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	keys, next, err := node.Scan(ctx, cursor, match, count).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("scan %s: %w", match, err)
	}
	return keys, next, nil
}

// read fetches the values and TTLs of keys, all on node (where SCAN found
// them), in one pipelined round trip; keys that expired since the SCAN are
// left out.
func (s *Store) read(ctx context.Context, node redis.Cmdable, keys []string) ([]Entry, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	pipe := node.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
		ttls[i] = pipe.PTTL(ctx, k)
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	out := make([]Entry, 0, len(keys))
	for i, k := range keys {
		raw, err := gets[i].Result()
		var reply redis.Error
		switch {
		case err == nil:
		case errors.As(err, &reply):
			// nil (expired since the SCAN) or WRONGTYPE (someone else's key
			// under the prefix): not a claim either way.
			continue
		default:
			return nil, fmt.Errorf("read claims: %w", err)
		}
		out = append(out, newEntry(k, "", "", raw, ttls[i].Val()))
	}
	return out, nil
}

// escapeGlob escapes the characters SCAN's MATCH treats as a pattern, so a
// prefix is matched literally.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
