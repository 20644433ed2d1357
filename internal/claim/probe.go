package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// probeTTL is how long a probe key lives: long enough to be seen by an
// operator wondering what it is, short enough never to pile up.
const probeTTL = 30 * time.Second

// ProbeKey is the key Probe claims for name (the host's name, in the
// service): {prefix}:probe:{name}. On a cluster each primary gets a key of
// its own under it, {prefix}:probe:{name}:{N} (N a hash tag picked to fall
// in that primary's slots).
func (s *Store) ProbeKey(name string) string { return s.prefix + ":probe:" + name }

// Probe runs the claim script on a key of its own, the way a delivery's
// claim runs it, and reports whether that worked within the timeout. A
// PING says only that something answers: a cluster node that does not own
// the key (MOVED), a replica (READONLY), a sentinel's port (unknown
// command) or a wrong password fail a claim while PING may pass. The key
// holds "probe", which no claim parses, for probeTTL.
//
// On a cluster a claim lands on the primary its key hashes to, so one key
// would vouch for one primary only: Probe claims a key in every primary's
// slots, through the same client and slot map the claims use, and fails
// with a *ShardsError naming the slots where that did not work (and any
// slots no primary serves).
func (s *Store) Probe(ctx context.Context, name string) error {
	if s.rdb == nil {
		return ErrNoRedis
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if c, ok := s.rdb.(*redis.ClusterClient); ok && !hasHashTag(s.ProbeKey(name)) {
		return s.probeShards(ctx, c, name)
	}
	// A prefix with a hash tag puts every claim on one shard, which the
	// plain key's is.
	return s.probeKey(ctx, s.ProbeKey(name))
}

func (s *Store) probeKey(ctx context.Context, key string) error {
	res, err := claimScript.Run(ctx, s.rdb, []string{key}, "probe", probeTTL.Milliseconds()).Slice()
	if err != nil {
		return fmt.Errorf("claim probe %s: %w", key, err)
	}
	if len(res) != 1 && len(res) != 3 {
		return fmt.Errorf("claim probe %s: unexpected reply %v", key, res)
	}
	return nil
}

// Shard is one primary of a cluster, by the slots it serves.
type Shard struct {
	Slots   string // "0-5460", ranges joined by commas
	Primary string // its address as the cluster gives it; empty for slots no primary serves
	Err     error
}

// ShardsError is a cluster probe that failed on some primaries (or found
// slots no primary serves): claims whose keys hash there fail, while the
// others' work.
type ShardsError struct {
	Failed []Shard
	Of     int // the primaries the cluster has
}

func (e *ShardsError) Error() string {
	parts := make([]string, len(e.Failed))
	for i, sh := range e.Failed {
		parts[i] = fmt.Sprintf("slots %s (primary %s): %v", sh.Slots, orNone(sh.Primary), sh.Err)
	}
	return fmt.Sprintf("claims fail on %d of %d shards: %s", len(e.Failed), e.Of, strings.Join(parts, "; "))
}

func (e *ShardsError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, sh := range e.Failed {
		errs[i] = sh.Err
	}
	return errs
}

// Slots are the failed shards' slots, for a message that must not name
// addresses.
func (e *ShardsError) Slots() string {
	s := make([]string, len(e.Failed))
	for i, sh := range e.Failed {
		s[i] = sh.Slots
	}
	return strings.Join(s, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// errUncovered marks slots that no primary serves.
var errUncovered = errors.New("no primary serves these slots")

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// probeShards asks the cluster for its primaries and their slots (CLUSTER
// SLOTS) and claims, through c, a probe key in the slots of each.
func (s *Store) probeShards(ctx context.Context, c *redis.ClusterClient, name string) error {
	// CLUSTER SLOTS, not CLUSTER SHARDS: go-redis reads its own map with
	// it, so the ACL needs one cluster subcommand, and Redis before 7.0
	// has no SHARDS.
	//
	// The command goes to one primary, the next in turn each time (go-redis's
	// round-robin shard picker): a dead one costs a try, not the probe.
	var ranges []redis.ClusterSlot
	var err error
	for range 3 {
		//lint:ignore SA1019 see above
		if ranges, err = c.ClusterSlots(ctx).Result(); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("claim probe: cluster slots: %w", err)
	}
	type primary struct {
		addr   string
		ranges []redis.ClusterSlot
	}
	var primaries []*primary
	byID := map[string]*primary{}
	covered := make([]bool, clusterSlots)
	for _, r := range ranges {
		if len(r.Nodes) == 0 || r.Start < 0 || r.End >= clusterSlots || r.Start > r.End {
			continue
		}
		id := r.Nodes[0].ID
		if id == "" {
			id = r.Nodes[0].Addr
		}
		p := byID[id]
		if p == nil {
			p = &primary{addr: r.Nodes[0].Addr}
			byID[id] = p
			primaries = append(primaries, p)
		}
		p.ranges = append(p.ranges, r)
		for i := r.Start; i <= r.End; i++ {
			covered[i] = true
		}
	}
	shards := make([]Shard, len(primaries))
	var wg sync.WaitGroup
	for i, p := range primaries {
		slices.SortFunc(p.ranges, func(a, b redis.ClusterSlot) int { return a.Start - b.Start })
		shards[i] = Shard{Slots: slotRanges(p.ranges), Primary: p.addr}
		key := s.keyInSlots(s.ProbeKey(name), p.ranges[0].Start, p.ranges[0].End)
		wg.Go(func() { shards[i].Err = s.probeKey(ctx, key) })
	}
	wg.Wait()
	e := &ShardsError{Of: len(primaries)}
	for _, sh := range shards {
		if sh.Err != nil {
			e.Failed = append(e.Failed, sh)
		}
	}
	if gaps := uncovered(covered); gaps != "" {
		e.Failed = append(e.Failed, Shard{Slots: gaps, Err: errUncovered})
	}
	if len(e.Failed) == 0 {
		return nil
	}
	slices.SortFunc(e.Failed, func(a, b Shard) int { return strings.Compare(a.Slots, b.Slots) })
	return e
}

func slotRanges(rs []redis.ClusterSlot) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(r.Start) + "-" + strconv.Itoa(r.End)
	}
	return strings.Join(parts, ",")
}

// uncovered lists the runs of slots not covered, as "a-b,c-d".
func uncovered(covered []bool) string {
	var parts []string
	for i := 0; i < len(covered); i++ {
		if covered[i] {
			continue
		}
		j := i
		for j+1 < len(covered) && !covered[j+1] {
			j++
		}
		parts = append(parts, strconv.Itoa(i)+"-"+strconv.Itoa(j))
		i = j
	}
	return strings.Join(parts, ",")
}

// keyInSlots is base:{N} for the smallest N whose key hashes into
// [start, end]. The search is a few thousand CRC16s of short strings at
// worst (a range of one slot) and is kept per range: the slots of a
// cluster rarely move.
func (s *Store) keyInSlots(base string, start, end int) string {
	s.probeKeysMu.Lock()
	defer s.probeKeysMu.Unlock()
	r := [2]int{start, end}
	if k, ok := s.probeKeys[r]; ok && strings.HasPrefix(k, base+":{") {
		return k
	}
	if s.probeKeys == nil {
		s.probeKeys = map[[2]int]string{}
	}
	for n := 0; ; n++ {
		k := base + ":{" + strconv.Itoa(n) + "}"
		if slot := keySlot(k); start <= slot && slot <= end {
			s.probeKeys[r] = k
			return k
		}
	}
}

// hasHashTag reports whether key has a hash tag (a non-empty {...}): then
// the tag alone decides its slot (Redis Cluster spec, "Hash tags").
func hasHashTag(key string) bool {
	return hashed(key) != key
}

// hashed is the part of key Redis Cluster hashes: the first {...} when it
// is not empty, else the whole key.
func hashed(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	closing := strings.IndexByte(key[open+1:], '}')
	if closing <= 0 {
		return key
	}
	return key[open+1 : open+1+closing]
}

// keySlot is the cluster hash slot of key: CRC16 (XMODEM) of its hashed
// part, modulo 16384.
func keySlot(key string) int {
	return int(crc16(hashed(key))) % clusterSlots
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
