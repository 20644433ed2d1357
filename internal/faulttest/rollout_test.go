package faulttest_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// A destination switched on by a rolling deploy starts when its first
// configured replica starts (issue 43). In each case an old replica
// (without the destination, as the previous release) leads the relay; a
// new, configured replica starts and takes posts while the old one still
// leads; the old one takes more; the old one stops and the new one takes
// the relay's lease. Every post made once the new replica had started is
// delivered once; the one from before it started is not.

// rolloutPosts is how many posts each replica takes after the new one
// started.
const rolloutPosts = 3

// relayHolder is the pid in the relay lease's holder (host/pid), 0 when
// nobody holds it.
func (r *rig) relayHolder() int {
	r.t.Helper()
	var holder string
	err := r.db.QueryRow(context.Background(),
		`SELECT coalesce((SELECT holder FROM leader_leases WHERE name = 'relay' AND expires_at > now()), '')`).Scan(&holder)
	if err != nil {
		r.t.Fatal(err)
	}
	pid, _ := strconv.Atoi(holder[strings.LastIndex(holder, "/")+1:])
	return pid
}

// waitRelayLeader waits until svc holds the relay's lease.
func (r *rig) waitRelayLeader(svc *faulttest.Service) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for r.relayHolder() != svc.PID() {
		if time.Now().After(deadline) {
			r.t.Fatalf("replica %d never took the relay's lease (held by %d)", svc.PID(), r.relayHolder())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rollout runs the deploy: post(svc, n) makes post n to svc and returns
// the id that names it in its delivery. It waits until consumer has
// delivered as many as were posted once the new replica had started, and
// returns the id of the post made before it started and the ids of those
// made after.
func (r *rig) rollout(newEnv map[string]string, consumer string, post func(*faulttest.Service, int) int64) (before int64, after []int64) {
	r.t.Helper()
	old := r.service(map[string]string{"LEADER_LEASE_TTL": leaseTTL.String()})
	r.waitRelayLeader(old)
	before = post(old, 0)

	env := maps.Clone(newEnv)
	env["LEADER_LEASE_TTL"] = leaseTTL.String()
	nw := r.service(env)
	for i := range rolloutPosts {
		after = append(after, post(nw, 1+i))
	}
	for i := range rolloutPosts {
		after = append(after, post(old, 1+rolloutPosts+i))
	}
	if pid := r.relayHolder(); pid != old.PID() {
		r.t.Fatalf("the relay's lease is held by %d, want the old replica %d: the posts were meant to come before the new one led", pid, old.PID())
	}
	if _, err := old.Terminate(30 * time.Second); err != nil {
		r.t.Fatal(err)
	}
	r.waitRelayLeader(nw)
	r.waitCount("every post after the new replica started delivered", len(after),
		`SELECT count(*) FROM relay_deliveries WHERE consumer = $1 AND state = 'delivered'`, consumer)
	return before, after
}

// once is each of ids, in format, counted once.
func once(format string, ids []int64) map[string]int {
	m := map[string]int{}
	for _, id := range ids {
		m[fmt.Sprintf(format, id)] = 1
	}
	return m
}

// TestForwardSwitchedOnMidRollout: SUPPORT_FORWARD_TO switched on by a
// rolling deploy. Before registration at start-up, the mails taken while
// the old replica led were behind the consumer's cursor, never forwarded.
func TestForwardSwitchedOnMidRollout(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	before, after := r.rollout(forwardEnv, "forward", func(svc *faulttest.Service, n int) int64 {
		m := newEmail(fmt.Sprintf("rollout-%d", n))
		r.api.Add(m)
		if a := r.resend(svc, m); !a.OK() {
			t.Fatalf("mail %d: %v", n, a)
		}
		return r.supportMessageID(m)
	})
	want := once("support-message/%d", after)
	got := map[string]int{}
	for _, s := range r.api.Sends() {
		got[s.Key]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sends by Idempotency-Key %v, want %v (support-message/%d, from before, never)", got, want, before)
	}
	if n := r.count(`SELECT count(*) FROM relay_deliveries WHERE consumer = 'forward'`); n != len(after) {
		t.Errorf("%d forward deliveries, want %d", n, len(after))
	}
}

// TestAppWebhookSwitchedOnMidRollout: APP_WEBHOOK_URL switched on by a
// rolling deploy, as above: every subscription change after the new
// replica started reaches the app once, none from before.
func TestAppWebhookSwitchedOnMidRollout(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	app := newAppReceiver(t)
	app.unblock() // nothing held: this test is not about a kill mid-delivery
	before, after := r.rollout(app.env(), "app_webhook", func(svc *faulttest.Service, n int) int64 {
		ev := subEvent(n, "active")
		if a := r.stripe(svc, ev); !a.OK() {
			t.Fatalf("event %d: %v", n, a)
		}
		return r.subscriptionChangeID(ev)
	})
	want := once("chg_%d", after)
	got := map[string]int{}
	for i, p := range app.Posts() {
		if p.Verify != nil {
			t.Errorf("POST %d: svix refuses it: %v", i+1, p.Verify)
		}
		got[p.Header.Get("webhook-id")]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("POSTs by webhook-id %v, want %v (chg_%d, from before, never)", got, want, before)
	}
}

// TestFirstMilliseconds: one replica, both destinations on, takes posts
// the moment /readyz first answers 200, before its relay has run:
// every one is delivered. Fresh, the relay takes its lease within
// milliseconds and the posts race it (before registration at start-up,
// the first ones were sometimes lost); after a kill, the replica comes
// back with the destinations switched on while its killed run still holds
// the relay's lease, so every post comes before the relay runs (before,
// every one was lost).
func TestFirstMilliseconds(t *testing.T) {
	t.Parallel()
	for _, killed := range []bool{false, true} {
		t.Run(map[bool]string{false: "fresh", true: "after a kill"}[killed], func(t *testing.T) {
			t.Parallel()
			firstMilliseconds(t, killed)
		})
	}
}

func firstMilliseconds(t *testing.T, afterKill bool) {
	r := newRig(t)
	app := newAppReceiver(t)
	app.unblock()
	held := 0 // the killed run's pid, holding the relay's lease
	if afterKill {
		// Long enough to outlast the restart on busy cores.
		prev := r.service(map[string]string{"LEADER_LEASE_TTL": "12s"})
		r.waitRelayLeader(prev)
		held = prev.PID()
		prev.Kill()
	}
	env := maps.Clone(forwardEnv)
	maps.Copy(env, app.env())
	svc, err := faulttest.NewService(serviceBin, r.env(env), filepath.Join(t.TempDir(), "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Kill()
		if t.Failed() {
			t.Logf("service log, last lines:\n%s", svc.LogTail(30))
		}
	})
	const posts = 8
	mails := make([]faulttest.Email, posts)
	for i := range mails {
		mails[i] = newEmail(fmt.Sprintf("first-ms-%d", i))
		r.api.Add(mails[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := svc.Launch(); err != nil {
		t.Fatal(err)
	}
	if err := svc.WaitReady(ctx); err != nil {
		t.Fatalf("%v\n%s", err, svc.LogTail(20))
	}
	ready := time.Now()
	var wg sync.WaitGroup
	for i := range posts {
		wg.Go(func() {
			if a := r.resend(svc, mails[i]); !a.OK() {
				t.Errorf("mail %d: %v", i, a)
			}
		})
		wg.Go(func() {
			if a := r.stripe(svc, subEvent(i, "active")); !a.OK() {
				t.Errorf("event %d: %v", i, a)
			}
		})
	}
	wg.Wait()
	taken := time.Since(ready)
	if afterKill && r.relayHolder() != held {
		t.Fatalf("the relay's lease is held by %d, want the killed run %d: the posts were meant to come before the relay ran", r.relayHolder(), held)
	}
	r.waitCount("every mail forwarded", posts,
		`SELECT count(*) FROM relay_deliveries WHERE consumer = 'forward' AND state = 'delivered'`)
	r.waitCount("every subscription change sent to the app", posts,
		`SELECT count(*) FROM relay_deliveries WHERE consumer = 'app_webhook' AND state = 'delivered'`)
	if n := r.api.Emails(); n != posts {
		t.Errorf("%d emails forwarded, want %d", n, posts)
	}
	figure(t, "%d mails and %d Stripe events posted within %v of /readyz's first 200: all forwarded and sent to the app",
		posts, posts, taken.Round(time.Millisecond))
}

// supportMessageID is the id of the support message holding mail m.
func (r *rig) supportMessageID(m faulttest.Email) int64 {
	r.t.Helper()
	return int64(r.count(`SELECT id FROM support_messages WHERE source = 'email' AND message_id = $1`, m.MessageID))
}

// subscriptionChangeID is the id of the subscription change ev made.
func (r *rig) subscriptionChangeID(ev faulttest.StripeEvent) int64 {
	r.t.Helper()
	return int64(r.count(`SELECT id FROM changes WHERE kind = 'subscription' AND subject = $1`, ev.SubscriptionID))
}
