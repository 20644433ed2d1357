package faulttest_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// leaseTTL is the test's LEADER_LEASE_TTL: short, so that a takeover
// takes seconds, yet several renewals long on busy cores.
const leaseTTL = 2 * time.Second

// TestFrozenLeader: two replicas sweep Resend; the one whose pass is
// listing received mail (its list held by the fake API) is frozen
// (SIGSTOP) mid-pass. The other takes over once
// the frozen one's lease has expired by Postgres's clock, runs its own
// pass and records it. Then the frozen one's list is answered and it is
// woken (SIGCONT): its pass records nothing (every write to
// scheduled_jobs is by the successor's token, and no recorded passes
// overlap), it starts no pass beside the successor (no list request of
// its own after waking), it logs that it lost the lease, and the mail is
// queued once.
//
// Before leases (a session advisory lock) the frozen leader kept the lock
// for as long as its connection lived: no sweep ran for 40 s, and with
// idle_session_timeout the old leader woke and recorded its pass beside
// its successor's.
func TestFrozenLeader(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	apis := []*faulttest.ResendAPI{r.api, faulttest.NewResendAPI()}
	t.Cleanup(apis[1].Close)
	m := newEmail("frozen-leader")
	held := make(chan int, 1) // which replica's API holds the first list
	release := make(chan struct{})
	var once sync.Once
	for i, api := range apis {
		api.Add(m) // received and listed; its webhook is not sent
		api.SetListHook(func(ctx context.Context) {
			first := false
			once.Do(func() { first = true })
			if !first {
				return
			}
			held <- i
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	env := map[string]string{
		"SWEEP_INTERVAL":   sweepInterval.String(),
		"LEADER_LEASE_TTL": leaseTTL.String(),
	}
	replicas := make([]*faulttest.Service, 2)
	for i := range replicas {
		env["RESEND_API_URL"] = apis[i].URL()
		replicas[i] = r.service(env)
	}
	var l int
	select {
	case l = <-held:
	case <-time.After(time.Minute):
		t.Fatal("no sweep listed within 1m")
	}
	leaderSvc := replicas[l]
	// Every write to scheduled_jobs, kept: the test's own instrument.
	const audit = `
CREATE TABLE scheduled_jobs_audit (token bigint, started_at timestamptz, succeeded_at timestamptz);
CREATE FUNCTION scheduled_jobs_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO scheduled_jobs_audit VALUES (NEW.token, NEW.started_at, NEW.succeeded_at); RETURN NEW; END $$;
CREATE TRIGGER audit AFTER INSERT OR UPDATE ON scheduled_jobs FOR EACH ROW EXECUTE FUNCTION scheduled_jobs_audit();`
	if _, err := r.db.Exec(context.Background(), audit); err != nil {
		t.Fatal(err)
	}
	frozenToken := r.count(`SELECT token FROM leader_leases WHERE name = 'sweep_resend'`)

	if err := leaderSvc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = leaderSvc.Signal(syscall.SIGCONT) }) // so that Kill's wait ends
	eventually(t, 30*time.Second, "the other replica takes the lease over", func() bool {
		return r.count(`SELECT token FROM leader_leases WHERE name = 'sweep_resend'`) > frozenToken
	})
	takeover := time.Since(stopped)
	eventually(t, time.Minute, "the successor records its pass", func() bool {
		return r.count(`SELECT count(*) FROM scheduled_jobs_audit`) > 0
	})
	recorded := time.Since(stopped)
	if n := r.supportRows(m); n != 1 {
		t.Errorf("support rows after the successor's pass = %d, want 1", n)
	}

	// The frozen leader's list is answered while it sleeps; it wakes.
	close(release)
	listsBefore := apis[l].Lists()
	if err := leaderSvc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := time.Now()
	gaveUp := func() bool {
		b, err := os.ReadFile(leaderSvc.LogPath())
		return err == nil && strings.Contains(string(b), "scheduled job lost its lease during a run")
	}
	// Its pass ends one way or the other: it gives up, or (the fault this
	// test is for) records over its successor.
	eventually(t, 30*time.Second, "the woken leader's pass ends", func() bool {
		return gaveUp() || r.count(`SELECT count(*) FROM scheduled_jobs_audit WHERE token <= $1`, frozenToken) > 0
	})
	noticed := time.Since(woke)
	if !gaveUp() {
		t.Error("the woken leader did not log that it lost its lease")
	}

	lateLists := apis[l].Lists() - listsBefore
	if lateLists != 0 {
		t.Errorf("list requests by the woken leader = %d, want 0: no pass beside the successor's", lateLists)
	}
	rows, err := r.db.Query(context.Background(), `SELECT token, started_at, succeeded_at FROM scheduled_jobs_audit ORDER BY started_at`)
	if err != nil {
		t.Fatal(err)
	}
	type pass struct {
		token       int64
		start, stop time.Time
	}
	var passes []pass
	for rows.Next() {
		var p pass
		if err := rows.Scan(&p.token, &p.start, &p.stop); err != nil {
			t.Fatal(err)
		}
		passes = append(passes, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	overlapping := 0
	for i, p := range passes {
		if p.token <= int64(frozenToken) {
			t.Errorf("pass %d recorded with token %d, the frozen leader's (%d) or older", i, p.token, frozenToken)
		}
		if i > 0 && p.start.Before(passes[i-1].stop) {
			overlapping++
		}
	}
	if overlapping > 0 {
		t.Errorf("%d recorded passes overlap the one before: %+v", overlapping, passes)
	}
	if n := r.supportRows(m); n != 1 {
		t.Errorf("support rows after the old leader woke = %d, want 1", n)
	}
	if n := r.count(`SELECT count(*) FROM leader_leases WHERE name = 'sweep_resend' AND token > $1`, frozenToken); n != 1 {
		t.Errorf("lease after the old leader woke: %d rows past token %d, want the successor's", n, frozenToken)
	}
	figure(t, "LEADER_LEASE_TTL %s: leader frozen mid-pass; lease taken over %.1f s after SIGSTOP, successor's pass recorded at %.1f s; "+
		"woken leader's pass ended %.2f s after SIGCONT; %d recorded passes, %d overlapping; %d list requests by the woken leader",
		leaseTTL, takeover.Seconds(), recorded.Seconds(), noticed.Seconds(), len(passes), overlapping, lateLists)
}
