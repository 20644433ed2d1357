package claim

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, 2*time.Minute)

	if _, err := s.Inspect(ctx, "stripe", "evt_absent"); !errors.Is(err, ErrAbsent) {
		t.Fatalf("inspect of an absent key: err = %v, want ErrAbsent", err)
	}

	r, err := tryClaim(s, ctx, "stripe", "evt_1", "fp1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Inspect(ctx, "stripe", "evt_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != Processing || got.Owner != r.Token || got.Fingerprint != "fp1" || got.Key != s.Key("stripe", "evt_1") {
		t.Errorf("inspect of a processing claim = %+v, want processing owned by %s", got, r.Token)
	}
	if got.TTL <= time.Minute || got.TTL > 2*time.Minute {
		t.Errorf("TTL = %s, want about 2m", got.TTL)
	}
	if age := time.Since(got.At); age < 0 || age > time.Minute {
		t.Errorf("claimed %s ago, want just now", age)
	}

	if err := s.confirm(ctx, "stripe", "evt_1", "fp1", 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err = s.Inspect(ctx, "stripe", "evt_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != Done || got.TTL < 71*time.Hour {
		t.Errorf("inspect of a done key = %+v, want done with the dedupe TTL", got)
	}
}

func TestForceRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, 2*time.Minute)
	exists := func(id string) bool { return rdb.Exists(ctx, s.Key("stripe", id)).Val() == 1 }

	// Someone else's processing claim: released, whoever owns it.
	r, err := tryClaim(s, ctx, "stripe", "evt_stuck", "fp")
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.ForceRelease(ctx, "stripe", "evt_stuck", false)
	if err != nil {
		t.Fatalf("force release of a processing claim: %v", err)
	}
	if e.Owner != r.Token || exists("evt_stuck") {
		t.Errorf("released %+v; key still there: %v", e, exists("evt_stuck"))
	}
	if _, err := s.ForceRelease(ctx, "stripe", "evt_stuck", false); !errors.Is(err, ErrAbsent) {
		t.Errorf("second release: err = %v, want ErrAbsent", err)
	}

	// A done key: refused without force, deleted with it.
	if err := s.confirm(ctx, "stripe", "evt_done", "fp", time.Hour); err != nil {
		t.Fatal(err)
	}
	e, err = s.ForceRelease(ctx, "stripe", "evt_done", false)
	if !errors.Is(err, ErrNotProcessing) || e.State != Done || !exists("evt_done") {
		t.Fatalf("release of a done key without force = %+v, %v; want refused, key kept", e, err)
	}
	if _, err := s.ForceRelease(ctx, "stripe", "evt_done", true); err != nil || exists("evt_done") {
		t.Fatalf("forced release of a done key: %v; key still there: %v", err, exists("evt_done"))
	}

	// A value that is not a claim is not ours to delete without force.
	rdb.Set(ctx, s.Key("stripe", "evt_foreign"), "something else", time.Hour)
	if _, err := s.ForceRelease(ctx, "stripe", "evt_foreign", false); !errors.Is(err, ErrNotProcessing) || !exists("evt_foreign") {
		t.Errorf("release of a foreign value: err = %v, want ErrNotProcessing and the key kept", err)
	}
}

func TestMarkDone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, 2*time.Minute)

	// Absent: the next delivery is a duplicate.
	if err := s.MarkDone(ctx, "resend", "msg_1", 30*time.Hour); err != nil {
		t.Fatal(err)
	}
	r, err := tryClaim(s, ctx, "resend", "msg_1", "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Found.State != Done || r.Found.TTL < 29*time.Hour {
		t.Errorf("claim after MarkDone = %+v, want done with the dedupe TTL", r)
	}

	// Over a live claim: the fingerprint is kept, and the holder's release
	// afterwards leaves the done marker alone.
	held, err := tryClaim(s, ctx, "resend", "msg_2", "fp2")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDone(ctx, "resend", "msg_2", 30*time.Hour); err != nil {
		t.Fatal(err)
	}
	if released, _, err := s.release(ctx, "resend", "msg_2", held.Token, time.Hour); err != nil || released {
		t.Fatalf("holder's release after MarkDone = %v, %v; want false, nil", released, err)
	}
	e, err := s.Inspect(ctx, "resend", "msg_2")
	if err != nil {
		t.Fatal(err)
	}
	if e.State != Done || e.Fingerprint != "fp2" {
		t.Errorf("after MarkDone over a claim: %+v, want done with fingerprint fp2", e)
	}
}

func TestStuck(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base, rdb := newTestStore(t, 2*time.Minute)
	// Glob characters in the prefix must match literally; the cleanup of the
	// test prefix still covers these keys.
	s := NewStore(rdb, StoreConfig{Prefix: base.prefix + "[a]", Timeout: time.Second, ProcessingTTL: 2 * time.Minute})
	now := time.Now()
	put := func(st *Store, provider, id string, v Entry) {
		t.Helper()
		if err := rdb.Set(ctx, st.Key(provider, id), v.value(), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	put(s, "stripe", "evt_old", Entry{State: Processing, Owner: "o1", At: now.Add(-10 * time.Minute)})
	put(s, "resend", "msg_older", Entry{State: Processing, Owner: "o2", At: now.Add(-20 * time.Minute)})
	put(s, "stripe", "evt_young", Entry{State: Processing, Owner: "o3", At: now.Add(-30 * time.Second)})
	put(s, "stripe", "evt_done", Entry{State: Done, At: now.Add(-time.Hour)})
	rdb.Set(ctx, s.Key("stripe", "evt_garbage"), "garbage", time.Hour)
	rdb.HSet(ctx, s.Key("stripe", "evt_hash"), "f", "v")
	// Same text without the glob escape ("[a]" as a class matches "a"), and
	// a sibling prefix: neither is under s's prefix.
	put(NewStore(rdb, StoreConfig{Prefix: base.prefix + "a"}), "stripe", "evt_other", Entry{State: Processing, Owner: "x", At: now.Add(-time.Hour)})
	put(NewStore(rdb, StoreConfig{Prefix: base.prefix + "[a]x"}), "stripe", "evt_other", Entry{State: Processing, Owner: "x", At: now.Add(-time.Hour)})
	// Enough keys that the walk takes several SCAN calls.
	pipe := rdb.Pipeline()
	for i := range 1200 {
		pipe.Set(ctx, s.Key("stripe", fmt.Sprintf("evt_fresh_%d", i)), Entry{State: Processing, Owner: "f", At: now}.value(), time.Hour)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	got, err := s.Stuck(ctx, 2*time.Minute, now)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ Provider, EventID, Owner string }
	var rows []row
	for _, e := range got {
		rows = append(rows, row{e.Provider, e.EventID, e.Owner})
		if e.TTL <= 0 || e.Key != s.Key(e.Provider, e.EventID) {
			t.Errorf("entry %+v: want its key and a TTL", e)
		}
	}
	want := []row{{"resend", "msg_older", "o2"}, {"stripe", "evt_old", "o1"}}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("stuck claims, oldest first (-want +got):\n%s", diff)
	}
}

func TestAdminWithoutRedis(t *testing.T) {
	t.Parallel()
	s := NewStore(nil, StoreConfig{Prefix: "webhook", Timeout: time.Second})
	ctx := t.Context()
	if _, err := s.Inspect(ctx, "stripe", "evt"); !errors.Is(err, ErrNoRedis) {
		t.Errorf("Inspect: %v", err)
	}
	if _, err := s.ForceRelease(ctx, "stripe", "evt", true); !errors.Is(err, ErrNoRedis) {
		t.Errorf("ForceRelease: %v", err)
	}
	if err := s.MarkDone(ctx, "stripe", "evt", time.Hour); !errors.Is(err, ErrNoRedis) {
		t.Errorf("MarkDone: %v", err)
	}
	if _, err := s.Stuck(ctx, time.Minute, time.Now()); !errors.Is(err, ErrNoRedis) {
		t.Errorf("Stuck: %v", err)
	}
}
