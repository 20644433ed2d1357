package relay_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// BenchmarkRelayAppWebhook is the relay's time per change for the app's
// webhook, as the service runs it (AppWebhookParallel at once): b.N
// subscription changes are written (three to a transaction, as deliveries
// write them) while the relay reads, signs, POSTs and records them all.
// The receiver, in this process, answers 200 without verifying.
func BenchmarkRelayAppWebhook(b *testing.B) {
	pool := dbtest.NewPool(b)
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(srv.Close)
	wh, err := relay.NewAppWebhook(relay.AppWebhookConfig{URL: srv.URL + "/hooks", Secret: appSecret,
		Kinds: []string{ledger.KindSubscription}, AllowHTTP: true})
	if err != nil {
		b.Fatal(err)
	}
	rel := relay.New(relay.Config{Pool: pool, Poll: 10 * time.Millisecond,
		Consumers: []relay.Consumer{{Name: relay.AppWebhookConsumer, Kinds: wh.Kinds(), Destination: wh, Parallel: relay.AppWebhookParallel}}})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rel.Run(rctx, nil) }()
	b.Cleanup(func() { cancel(); <-done })
	for { // the consumer starts at the end of the feed: wait for it to be placed
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM feed_consumers`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i += 3 {
		if _, err := pool.Exec(ctx, `INSERT INTO changes (at, kind, subject, after)
SELECT now(), 'subscription', 'sub_' || g, '{"status":"active","items":[{"price":"price_1"}]}' FROM generate_series($1::int, $2::int) g`,
			i, min(i+3, b.N)-1); err != nil {
			b.Fatal(err)
		}
	}
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relay_deliveries WHERE state = 'delivered'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n >= b.N {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}
