package claim

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestSentinelFailoverLosesOnlyTheLastConfirms: confirms run in a steady
// stream through a SENTINEL FAILOVER, nobody waiting for the replica.
// Replication is asynchronous, so a confirm the old primary acknowledged
// just before the switch may be missing on the new one (its event, if
// redelivered, then runs again: the effects are idempotent). Every
// confirm acknowledged a second or more before the failover began is
// there; the count lost is the figure docs/WHERE-IT-RUNS.md gives.
func TestSentinelFailoverLosesOnlyTheLastConfirms(t *testing.T) {
	t.Parallel()
	sentinel := dbtest.StartRedisSentinel(t)
	rdb := openTest(t, sentinel.URL(), 500*time.Millisecond)
	s := NewStore(rdb, StoreConfig{Prefix: "test-sentinel-loss", Timeout: 500 * time.Millisecond, ProcessingTTL: time.Minute})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	var mu sync.Mutex
	acked := map[string]time.Time{} // id -> when its confirm was acknowledged
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			id := "evt_" + strconv.Itoa(i)
			if s.confirm(ctx, "stripe", id, "fp", time.Hour) == nil {
				mu.Lock()
				acked[id] = time.Now()
				mu.Unlock()
			}
		}
	}()
	time.Sleep(time.Second) // a stream before the failover
	began := time.Now()
	newPrimary, err := sentinel.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // and after it
	close(stop)
	<-done

	c := redis.NewClient(&redis.Options{Addr: newPrimary})
	defer c.Close()
	mu.Lock()
	defer mu.Unlock()
	var lost, lostEarly int
	var first, last time.Duration // of the lost, from the failover's start
	for id, at := range acked {
		n, err := c.Exists(ctx, s.Key("stripe", id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			lost++
			if d := at.Sub(began); lost == 1 || d < first {
				first = d
			}
			if d := at.Sub(began); lost == 1 || d > last {
				last = d
			}
			if at.Before(began.Add(-time.Second)) {
				lostEarly++
			}
		}
	}
	t.Logf("FIGURE sentinel failover under a stream of confirms: %d of %d acknowledged confirms missing on the new primary, acknowledged from %v to %v after SENTINEL FAILOVER was sent",
		lost, len(acked), first.Round(time.Millisecond), last.Round(time.Millisecond))
	if lostEarly > 0 {
		t.Fatalf("%d confirms acknowledged over a second before the failover are missing: more than the last ones lost", lostEarly)
	}
}

// BenchmarkConfirmWait: a confirm alone, and a confirm followed by WAIT 1
// (the replica has it), on a primary with one replica on loopback. This is
// what WAIT on the confirm would cost every delivery when the replica is
// healthy; with the replica gone, every WAIT runs to its timeout.
func BenchmarkConfirmWait(b *testing.B) {
	sentinel := dbtest.StartRedisSentinel(b)
	rdb := redis.NewClient(&redis.Options{Addr: sentinel.Primary.Addr()})
	b.Cleanup(func() { rdb.Close() })
	s := NewStore(rdb, StoreConfig{Prefix: "bench-wait", Timeout: time.Second, ProcessingTTL: time.Minute})
	for _, wait := range []bool{false, true} {
		b.Run(fmt.Sprintf("wait=%v", wait), func(b *testing.B) {
			ctx := b.Context()
			i := 0
			for b.Loop() {
				i++
				if err := s.confirm(ctx, "stripe", "evt_"+strconv.Itoa(i), benchFingerprint, time.Hour); err != nil {
					b.Fatal(err)
				}
				if wait {
					if n, err := rdb.Do(ctx, "WAIT", 1, 1000).Int(); err != nil || n != 1 {
						b.Fatalf("WAIT 1 = %d, %v", n, err)
					}
				}
			}
		})
	}
}
