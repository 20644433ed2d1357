package faulttest_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
	"github.com/munchable/munchable-webhooks/migrations"
)

// migrationLockTimeout is the runner's lock_timeout
// (migrations.DefaultOptions), which the service migrates with.
var migrationLockTimeout = migrations.DefaultOptions().LockTimeout

// The previous release (deploy/previous-release) and this build on one
// database, under a steady stream of signed Stripe deliveries, inbound
// mails and support form posts, with the forward to the team on in both:
// the previous release serving; this build migrating (while a report's
// transaction holds webhook_events, which every delivery writes and the
// migration alters) and serving beside it; the previous one stopped; then
// the previous binary again on the new schema (a rollback); then this
// build again. Nothing lost, no wrong row, each support message once and
// forwarded once, every non-2xx answered to a retry that succeeded, and no
// delivery waiting on the migration longer than its lock timeout.
//
// Not parallel: the delivery times it bounds are the migration's, and the
// fault tests beside it on two cores would add their own.
func TestUpgradeAndRollback(t *testing.T) {
	r := newRig(t) // first: it skips under -short, as every fault test does
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := faulttest.PreviousRelease(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	previousBin, err := faulttest.BuildRelease(ctx, root, rev)
	if err != nil {
		t.Fatal(err) // never a skip: CI has the whole history
	}
	version := checkVersion(t, serviceBin, migrations.Version())

	env := map[string]string{"SUPPORT_FORM_RATE": "10000"}
	for k, v := range forwardEnv {
		env[k] = v
	}
	release := func(bin, name string) *faulttest.Service {
		svc, err := faulttest.NewService(bin, r.env(env), filepath.Join(t.TempDir(), name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			svc.Kill()
			if t.Failed() {
				t.Logf("%s log, last lines:\n%s", name, svc.LogTail(20))
			}
		})
		return svc
	}
	previous, current := release(previousBin, "previous"), release(serviceBin, "current")

	r.start(previous)
	r.waitForward()
	lb := &balancer{}
	lb.route(previous)
	load := startLoad(r, lb)
	time.Sleep(2 * time.Second)

	// A report reads webhook_events in a transaction that stays open 5 s,
	// across more than two of the migration's lock timeouts.
	report, err := pgx.Connect(ctx, r.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer report.Close(context.Background())
	tx, err := report.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM webhook_events`); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(5*time.Second, func() { _ = tx.Rollback(context.Background()) })

	// This build migrates (waiting behind the report) and serves beside
	// the previous release.
	migrating := time.Now()
	r.start(current)
	migrated := time.Now()
	if log := current.LogTail(200); !strings.Contains(log, "migration waited for a lock held elsewhere") {
		t.Errorf("the migration never waited for the report's lock: the case tested nothing\n%s", log)
	}
	lb.route(previous, current)
	time.Sleep(3 * time.Second)

	// The previous release stops: the balancer drains it first.
	lb.route(current)
	terminate(t, previous)
	time.Sleep(2 * time.Second)

	// Rollback: the previous binary on the new schema, then this one again,
	// each rolled out as a deployment does: the new pod ready and in the
	// rotation, then the old one drained and stopped.
	rollTo := func(from, to *faulttest.Service) {
		r.start(to)
		lb.route(from, to)
		time.Sleep(time.Second)
		lb.route(to)
		terminate(t, from)
	}
	rollTo(current, previous)
	time.Sleep(3 * time.Second)
	rollTo(previous, current)
	time.Sleep(2 * time.Second)
	res := load.stop()

	if got := r.count(`SELECT count(*) FROM goose_db_version WHERE version_id = $1`, migrations.Version()); got != 1 {
		t.Fatalf("schema version %d applied %d times, want once", migrations.Version(), got)
	}
	if res.unanswered > 0 {
		t.Errorf("%d deliveries never answered 2xx within a minute of retries", res.unanswered)
	}

	// Every Stripe event accepted is stored as sent.
	for _, ev := range res.events {
		if e, ok := r.entitlement(ev.SubscriptionID); !ok || e.LastEventID != ev.ID || e.Status != ev.Status {
			t.Errorf("%s: entitlement %+v (found %v), want status %s from %s", ev.SubscriptionID, e, ok, ev.Status, ev.ID)
		}
	}
	if n := r.count(`SELECT count(*) FROM webhook_events WHERE provider = 'stripe' AND outcome = 'applied'`); n != len(res.events) {
		t.Errorf("%d stripe events applied in the ledger, want %d", n, len(res.events))
	}
	// Which release recorded what: this build names its sessions, the
	// previous release did not.
	byCurrent := r.count(`SELECT count(*) FROM webhook_events WHERE received_by = $1`, "munchable-webhooks "+version)
	byPrevious := r.count(`SELECT count(*) FROM webhook_events WHERE received_by IS NULL`)
	if byCurrent == 0 || byPrevious == 0 {
		t.Errorf("events recorded by this build %d, by the previous release %d: want both", byCurrent, byPrevious)
	}

	// Each mail and each form post is one support message, forwarded once.
	messages := len(res.mails) + len(res.forms)
	for _, m := range res.mails {
		if n := r.supportRows(m); n != 1 {
			t.Errorf("mail %s: %d support messages, want 1", m.MessageID, n)
		}
	}
	for _, text := range res.forms {
		if n := r.count(`SELECT count(*) FROM support_messages WHERE source = 'web' AND text_body = $1`, text); n != 1 {
			t.Errorf("form post %q: %d support messages, want 1", text, n)
		}
	}
	r.waitCount("every message forwarded", messages,
		`SELECT count(*) FROM relay_deliveries WHERE consumer = 'forward' AND state = 'delivered'`)
	if got := r.api.Emails(); got != messages {
		t.Errorf("Resend sent %d emails for %d support messages, want one each", got, messages)
	}

	slowest := res.slowestBetween(migrating, migrated)
	if limit := migrationLockTimeout + 1500*time.Millisecond; slowest > limit {
		t.Errorf("slowest delivery while this build migrated took %s, want at most about the lock timeout %s (limit %s)",
			slowest, migrationLockTimeout, limit)
	}
	figure(t, "previous release %.12s and this build (schema %d): %d Stripe events, %d mails, %d form posts; %d non-2xx answers, each retried to a 2xx; "+
		"migration took %s behind a 5 s report transaction; slowest delivery during it %s (lock_timeout %s), over the whole run %s; "+
		"events recorded by this build %d, by the previous release %d",
		rev, migrations.Version(), len(res.events), len(res.mails), len(res.forms), res.non2xx,
		migrated.Sub(migrating).Round(time.Millisecond), slowest.Round(time.Millisecond), migrationLockTimeout,
		res.slowestBetween(time.Time{}, time.Now()).Round(time.Millisecond), byCurrent, byPrevious)
}

// checkVersion runs `bin version`, checks its schema line and returns
// its version.
func checkVersion(t *testing.T, bin string, schema int64) string {
	t.Helper()
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("%s version: %v", bin, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "version: ") || !strings.HasPrefix(lines[1], "commit: ") ||
		lines[2] != fmt.Sprintf("schema: %d", schema) {
		t.Fatalf("version printed %q, want version, commit and schema: %d lines", out, schema)
	}
	return strings.TrimPrefix(lines[0], "version: ")
}

// terminate stops svc as Kubernetes does, with SIGTERM and a grace.
func terminate(t *testing.T, svc *faulttest.Service) {
	t.Helper()
	if _, err := svc.Terminate(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// balancer hands each attempt to the next of the replicas in its rotation,
// as a load balancer does; a replica leaves it before it is stopped.
type balancer struct {
	mu   sync.Mutex
	live []*faulttest.Service
	next int
}

func (b *balancer) route(live ...*faulttest.Service) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.live = live
}

func (b *balancer) pick() *faulttest.Service {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	return b.live[b.next%len(b.live)]
}

// load sends Stripe events (about 30 a second), mails and form posts
// (about 3 a second each), each retried as a provider or a browser would
// until it is answered 2xx, and keeps every attempt.
type load struct {
	r      *rig
	lb     *balancer
	stopCh chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	attempts []faulttest.Answer
	res      loadResult
}

type loadResult struct {
	events     []faulttest.StripeEvent
	mails      []faulttest.Email
	forms      []string
	non2xx     int
	unanswered int
	attempts   []faulttest.Answer
}

func startLoad(r *rig, lb *balancer) *load {
	l := &load{r: r, lb: lb, stopCh: make(chan struct{})}
	var n atomic.Int64
	l.every(33*time.Millisecond, func() {
		i := int(n.Add(1))
		ev := subEvent(100000+i, "active")
		if l.deliver(func(svc *faulttest.Service) faulttest.Answer { return r.stripe(svc, ev) }) {
			l.mu.Lock()
			l.res.events = append(l.res.events, ev)
			l.mu.Unlock()
		}
	})
	l.every(300*time.Millisecond, func() {
		m := newEmail(fmt.Sprintf("upgrade-%d", n.Add(1)))
		r.api.Add(m)
		if l.deliver(func(svc *faulttest.Service) faulttest.Answer { return r.resend(svc, m) }) {
			l.mu.Lock()
			l.res.mails = append(l.res.mails, m)
			l.mu.Unlock()
		}
	})
	l.every(300*time.Millisecond, func() {
		i := n.Add(1)
		text := fmt.Sprintf("Help with order %d", i)
		body := fmt.Sprintf(`{"email":"ada@example.com","message":%q}`, text)
		key := fmt.Sprintf("upgrade-form-%d", i)
		if l.deliver(func(svc *faulttest.Service) faulttest.Answer { return r.form(svc, key, body) }) {
			l.mu.Lock()
			l.res.forms = append(l.res.forms, text)
			l.mu.Unlock()
		}
	})
	return l
}

// every runs f in a goroutine of its own each period until stop.
func (l *load) every(period time.Duration, f func()) {
	l.wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-l.stopCh:
				return
			case <-tick.C:
				l.wg.Go(f)
			}
		}
	})
}

// deliver sends one delivery until a 2xx, each attempt to the replica the
// balancer picks, for up to a minute, and reports whether it got one.
func (l *load) deliver(attempt func(*faulttest.Service) faulttest.Answer) bool {
	end := time.Now().Add(time.Minute)
	for n := 1; ; n++ {
		a := attempt(l.lb.pick())
		l.mu.Lock()
		l.attempts = append(l.attempts, a)
		if !a.OK() {
			l.res.non2xx++
		}
		l.mu.Unlock()
		if a.OK() {
			return true
		}
		if time.Now().After(end) {
			l.mu.Lock()
			l.res.unanswered++
			l.mu.Unlock()
			return false
		}
		time.Sleep(faulttest.Backoff(n, 50*time.Millisecond, 500*time.Millisecond, 0.5))
	}
}

func (l *load) stop() loadResult {
	close(l.stopCh)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.res.attempts = l.attempts
	return l.res
}

// slowestBetween is the longest attempt sent between from and to.
func (res loadResult) slowestBetween(from, to time.Time) time.Duration {
	var slowest time.Duration
	for _, a := range res.attempts {
		if a.Sent.Before(from) || a.Sent.After(to) {
			continue
		}
		slowest = max(slowest, a.Done.Sub(a.Sent))
	}
	return slowest
}

// form posts the support form as the site's page does, with an
// Idempotency-Key that its retries repeat.
func (r *rig) form(svc *faulttest.Service, key, body string) faulttest.Answer {
	req, err := http.NewRequest(http.MethodPost, svc.URL()+"/support/messages", bytes.NewReader([]byte(body)))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return faulttest.Do(r.client, req)
}
