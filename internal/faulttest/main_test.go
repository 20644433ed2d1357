package faulttest_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// serviceBin is the service binary, built once for the package's run.
var serviceBin string

// binEnv names a prebuilt binary to test instead of building one: a release
// build, or a patched one to check a proposed fix against the suite.
const binEnv = "FAULTTEST_BIN"

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every fault test skips itself
	}
	if bin := os.Getenv(binEnv); bin != "" {
		serviceBin = bin
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "faulttest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	serviceBin, err = faulttest.Build(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// rig is one fault case's world: its own redis-server and Postgres on free
// ports, a fake Resend API, and clients that look straight at both stores.
type rig struct {
	t      *testing.T
	redis  *dbtest.RedisServer
	pg     *dbtest.PostgresServer
	rdb    *redis.Client // straight to redis-server, never through a proxy
	db     *pgxpool.Pool
	api    *faulttest.ResendAPI
	client *http.Client // the providers' client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	if testing.Short() {
		t.Skip("fault suite: runs the service binary against throwaway servers; not in -short")
	}
	r := &rig{t: t}
	r.redis = dbtest.StartRedis(t)
	r.pg = dbtest.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := faulttest.DurableCommits(ctx, r.pg.URL()); err != nil {
		t.Fatal(err)
	}
	r.rdb = redis.NewClient(&redis.Options{Addr: r.redis.Addr()})
	t.Cleanup(func() { r.rdb.Close() })
	pool, err := pgxpool.New(ctx, r.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	r.db = pool
	t.Cleanup(pool.Close)
	r.api = faulttest.NewResendAPI()
	t.Cleanup(r.api.Close)
	r.client = &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}
	t.Cleanup(r.client.CloseIdleConnections)
	return r
}

// env is the service's environment on the rig's servers, with extra on top.
// REDIS_TIMEOUT is 1s rather than 250ms: on a test machine's two busy cores
// (the whole suite, three replicas, -race) a healthy Redis call can take
// longer than 250ms, and the degraded answer it then gets, correct as it is,
// is not what a case that keeps Redis up is asserting.
func (r *rig) env(extra map[string]string) map[string]string {
	env := faulttest.BaseEnv()
	env["DATABASE_URL"] = r.pg.URL()
	if r.redis != nil { // a topology test names its own Redis
		env["REDIS_URL"] = r.redis.URL()
	}
	env["RESEND_API_URL"] = r.api.URL()
	env["REDIS_TIMEOUT"] = "1s"
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// service starts the binary on the rig and kills it in t.Cleanup (before
// the servers stop: cleanups run in reverse).
func (r *rig) service(extra map[string]string) *faulttest.Service {
	r.t.Helper()
	svc, err := faulttest.NewService(serviceBin, r.env(extra), filepath.Join(r.t.TempDir(), "service.log"))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		svc.Kill()
		if r.t.Failed() {
			r.t.Logf("service log (%s), last lines:\n%s", svc.LogPath(), svc.LogTail(30))
		}
	})
	r.start(svc)
	return svc
}

// start (re)starts svc and waits until it is ready.
func (r *rig) start(svc *faulttest.Service) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := svc.Start(ctx); err != nil {
		r.t.Fatal(err)
	}
}

// replicas starts n services on the rig together, as a deployment does,
// and kills them in t.Cleanup. Started together, their migrations race for
// goose's lock, and their scheduled jobs for the jobs' locks.
func (r *rig) replicas(n int, extra map[string]string) []*faulttest.Service {
	r.t.Helper()
	replicas := make([]*faulttest.Service, n)
	var started sync.WaitGroup
	for i := range replicas {
		svc, err := faulttest.NewService(serviceBin, r.env(extra), filepath.Join(r.t.TempDir(), "replica.log"))
		if err != nil {
			r.t.Fatal(err)
		}
		r.t.Cleanup(func() {
			svc.Kill()
			if r.t.Failed() {
				r.t.Logf("replica %d log, last lines:\n%s", i, svc.LogTail(20))
			}
		})
		replicas[i] = svc
		started.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := svc.Start(ctx); err != nil {
				r.t.Error(err)
			}
		})
	}
	started.Wait()
	if r.t.Failed() {
		r.t.FailNow()
	}
	return replicas
}

// sumMetric adds up a metric's samples matching match over every replica's
// /metrics: a counter of the deployment, whichever replica counted.
func sumMetric(t *testing.T, replicas []*faulttest.Service, name string, match ...string) float64 {
	t.Helper()
	var total float64
	for _, svc := range replicas {
		m, err := svc.Metrics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		total += m.Sum(name, match...)
	}
	return total
}

// stripe delivers ev once, signed now.
func (r *rig) stripe(svc *faulttest.Service, ev faulttest.StripeEvent) faulttest.Answer {
	req, err := faulttest.StripeRequest(context.Background(), svc.URL(), ev.JSON(), time.Now())
	if err != nil {
		r.t.Fatal(err)
	}
	return faulttest.Do(r.client, req)
}

// resend delivers m once, signed now.
func (r *rig) resend(svc *faulttest.Service, m faulttest.Email) faulttest.Answer {
	req, err := faulttest.ResendRequest(context.Background(), svc.URL(), m, time.Now())
	if err != nil {
		r.t.Fatal(err)
	}
	return faulttest.Do(r.client, req)
}

// claim returns what the claim key of a provider's event holds in Redis
// ("" when absent) and its remaining TTL.
func (r *rig) claim(provider, id string) (string, time.Duration) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := "webhook:" + provider + ":" + id
	v, err := r.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", 0
	}
	if err != nil {
		r.t.Fatalf("GET %s: %v", key, err)
	}
	ttl, err := r.rdb.PTTL(ctx, key).Result()
	if err != nil {
		r.t.Fatalf("PTTL %s: %v", key, err)
	}
	return v, ttl
}

// supportRows counts the support messages holding mail m.
func (r *rig) supportRows(m faulttest.Email) int {
	r.t.Helper()
	return r.count(`SELECT count(*) FROM support_messages WHERE source = 'email' AND message_id = $1`, m.MessageID)
}

func (r *rig) count(query string, args ...any) int {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := r.db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		r.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// entitlement is the stored state of one subscription.
type entitlement struct {
	Status      string
	LastEventID string
	LastCreated time.Time
	UpdatedAt   time.Time
}

func (r *rig) entitlement(subID string) (entitlement, bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var e entitlement
	err := r.db.QueryRow(ctx, `SELECT status, last_event_id, last_event_created, updated_at FROM entitlements WHERE stripe_subscription_id = $1`, subID).
		Scan(&e.Status, &e.LastEventID, &e.LastCreated, &e.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return entitlement{}, false
	}
	if err != nil {
		r.t.Fatalf("read entitlement %s: %v", subID, err)
	}
	return e, true
}

// untilOK retries a delivery the way a provider does (compressed in time)
// until it is answered 2xx or the deadline passes. It returns every answer.
func untilOK(deadline time.Duration, deliver func() faulttest.Answer) []faulttest.Answer {
	var answers []faulttest.Answer
	end := time.Now().Add(deadline)
	for n := 1; ; n++ {
		a := deliver()
		answers = append(answers, a)
		if a.OK() || time.Now().After(end) {
			return answers
		}
		time.Sleep(faulttest.Backoff(n, 50*time.Millisecond, 500*time.Millisecond, 0.5))
	}
}

// subEvent is a subscription event of its own subscription: n names both.
func subEvent(n int, status string) faulttest.StripeEvent {
	return faulttest.StripeEvent{
		ID:             fmt.Sprintf("evt_fault_%06d", n),
		Type:           "customer.subscription.updated",
		Created:        1767225600 + int64(n),
		SubscriptionID: fmt.Sprintf("sub_fault_%06d", n),
		CustomerID:     fmt.Sprintf("cus_fault_%06d", n),
		Status:         status,
		PreviousStatus: "incomplete",
		PriceID:        "price_fault_monthly",
		PeriodEnd:      1769904000,
	}
}

// newEmail is an inbound mail to support, named name.
func newEmail(name string) faulttest.Email {
	return faulttest.Email{
		SvixID:    "msg_" + name,
		EmailID:   "em-" + name,
		MessageID: "<" + name + "@mail.example.com>",
		From:      "Ada Lovelace <ada@example.com>",
		To:        faulttest.SupportAddress,
		Subject:   "Order " + name,
		Text:      "Hello, my order " + name + " has not arrived.",
		Created:   time.Now(),
	}
}

// figure logs a measured figure; `go test -v` shows them, and
// docs/RELIABILITY.md quotes them.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURE %s: %s", t.Name(), fmt.Sprintf(format, args...))
}
