package access_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// BenchmarkAccess measures each read of the answer at ACCESS_BENCH_SCALE
// subscriptions (default 100000; docs/PERFORMANCE.md has the figures at a
// million), over the pool as the service runs it, and logs each
// statement's plan and execution time under a generic plan (-v):
//
//	ACCESS_BENCH_SCALE=1000000 go test -run '^$' -bench Access -benchtime 2000x -v ./internal/access/
func BenchmarkAccess(b *testing.B) {
	n := 100_000
	if s := os.Getenv("ACCESS_BENCH_SCALE"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatalf("ACCESS_BENCH_SCALE=%q: %v", s, err)
		}
	}
	pool := dbtest.NewPool(b)
	fill(b, pool, 1, n)
	ctx := context.Background()
	for _, s := range access.Statements() {
		b.Logf("%s at %d subscriptions, generic plan:\n%s", s.Name, n, genericPlan(b, pool, s, "EXPLAIN (ANALYZE, BUFFERS)"))
	}
	store := access.NewStore(pool)
	keys := []struct {
		key    access.Key
		prefix string
	}{{access.ByClientReference, "user_"}, {access.ByCustomer, "cus_"}, {access.BySubscription, "sub_"}}
	for _, k := range keys {
		b.Run(string(k.key), func(b *testing.B) {
			i := 0
			for b.Loop() {
				i = (i*7919 + 1) % (n / 2)
				got, err := store.Lookup(ctx, k.key, fmt.Sprint(k.prefix, i+1))
				if err != nil || len(got) != 1 {
					b.Fatalf("lookup %s%d: %d answers, %v", k.prefix, i+1, len(got), err)
				}
			}
		})
	}
	b.Run("page of 100", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i = (i*7919 + 1) % (n / 2)
			if _, _, err := store.Page(ctx, fmt.Sprint("cus_", i), 100); err != nil {
				b.Fatal(err)
			}
		}
	})
}
