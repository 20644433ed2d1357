package claim

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

func newTestStore(t *testing.T, processingTTL time.Duration) (*Store, *redis.Client) {
	t.Helper()
	rdb, prefix := dbtest.Redis(t)
	return NewStore(rdb, StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: processingTTL}), rdb
}

// attempt is a claim attempt as the tests read it.
type attempt struct {
	Token string
	Found Entry
}

func (a attempt) claimed() bool { return a.Token != "" }

func tryClaim(s *Store, ctx context.Context, provider, eventID, fp string) (attempt, error) {
	token, found, err := s.claim(ctx, provider, eventID, fp)
	return attempt{token, found}, err
}

func TestClaimStates(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, 2*time.Minute)
	key := s.Key("stripe", "evt_1")

	first, err := tryClaim(s, ctx, "stripe", "evt_1", "fp1")
	if err != nil {
		t.Fatal(err)
	}
	if !first.claimed() || first.Token == "" {
		t.Fatalf("first claim = %+v, want claimed with a token", first)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= time.Minute || ttl > 2*time.Minute {
		t.Errorf("processing TTL = %s, want about 2m", ttl)
	}

	second, err := tryClaim(s, ctx, "stripe", "evt_1", "fp1")
	if err != nil {
		t.Fatal(err)
	}
	if second.Found.State != Processing || second.Found.TTL <= time.Minute || second.Found.Owner != first.Token {
		t.Fatalf("second claim = %+v, want in progress, owned by the first, with its TTL", second)
	}

	if err := s.confirm(ctx, "stripe", "evt_1", "fp1", 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	third, err := tryClaim(s, ctx, "stripe", "evt_1", "fp1")
	if err != nil {
		t.Fatal(err)
	}
	if third.Found.State != Done || third.Found.Fingerprint != "fp1" {
		t.Fatalf("claim after confirm = %+v, want done", third)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl < 71*time.Hour {
		t.Errorf("done TTL = %s, want the dedupe TTL (72h)", ttl)
	}
}

func TestReleaseOnlyOwnClaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, 2*time.Minute)

	mine, err := tryClaim(s, ctx, "stripe", "evt_2", "")
	if err != nil {
		t.Fatal(err)
	}
	released, _, err := s.release(ctx, "stripe", "evt_2", "someone-else", time.Hour)
	if err != nil || released {
		t.Fatalf("release with another token = %v, %v; want false, nil", released, err)
	}
	if n := rdb.Exists(ctx, s.Key("stripe", "evt_2")).Val(); n != 1 {
		t.Fatal("a release with another token deleted the claim")
	}
	released, _, err = s.release(ctx, "stripe", "evt_2", mine.Token, time.Hour)
	if err != nil || !released {
		t.Fatalf("release with own token = %v, %v; want true, nil", released, err)
	}
	again, err := tryClaim(s, ctx, "stripe", "evt_2", "")
	if err != nil || !again.claimed() {
		t.Fatalf("claim after release = %+v, %v; want claimed", again, err)
	}
}

// A delivery whose claim expired (it ran too long, or its process stalled)
// must not delete the claim of the delivery that took over.
func TestExpiredOwnerCannotReleaseNewOwner(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, rdb := newTestStore(t, 100*time.Millisecond)

	old, err := tryClaim(s, ctx, "resend", "msg_1", "")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	current, err := tryClaim(s, ctx, "resend", "msg_1", "")
	if err != nil || !current.claimed() {
		t.Fatalf("claim after expiry = %+v, %v; want claimed", current, err)
	}
	released, _, err := s.release(ctx, "resend", "msg_1", old.Token, time.Hour)
	if err != nil || released {
		t.Fatalf("expired owner's release = %v, %v; want false, nil", released, err)
	}
	if e := newEntry("", "", "", rdb.Get(ctx, s.Key("resend", "msg_1")).Val(), 0); e.Owner != current.Token {
		t.Fatalf("key holds %+v, want the new owner's claim", e)
	}
}

// Confirm is a plain SET: it lands even when the confirming delivery's own
// claim has expired, because its effect is committed.
func TestConfirmLandsAfterClaimExpired(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, 50*time.Millisecond)
	if _, err := tryClaim(s, ctx, "stripe", "evt_3", "fp"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := s.confirm(ctx, "stripe", "evt_3", "fp", time.Hour); err != nil {
		t.Fatal(err)
	}
	r, err := tryClaim(s, ctx, "stripe", "evt_3", "fp")
	if err != nil || r.Found.State != Done {
		t.Fatalf("claim after late confirm = %+v, %v; want done", r, err)
	}
}

// A release must not undo a confirm: once done, the key stays done.
func TestReleaseDoesNotDeleteDone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, _ := newTestStore(t, time.Minute)
	c, err := tryClaim(s, ctx, "stripe", "evt_4", "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.confirm(ctx, "stripe", "evt_4", "fp", time.Hour); err != nil {
		t.Fatal(err)
	}
	if released, _, err := s.release(ctx, "stripe", "evt_4", c.Token, time.Hour); err != nil || released {
		t.Fatalf("release after confirm = %v, %v; want false, nil", released, err)
	}
}

func TestStoreWithoutRedis(t *testing.T) {
	t.Parallel()
	s := NewStore(nil, StoreConfig{Prefix: "webhook", Timeout: time.Second, ProcessingTTL: time.Minute})
	if _, err := tryClaim(s, t.Context(), "stripe", "evt", ""); !errors.Is(err, ErrNoRedis) {
		t.Errorf("Claim err = %v, want ErrNoRedis", err)
	}
	if err := s.confirm(t.Context(), "stripe", "evt", "", time.Hour); !errors.Is(err, ErrNoRedis) {
		t.Errorf("Confirm err = %v, want ErrNoRedis", err)
	}
	if _, _, err := s.release(t.Context(), "stripe", "evt", "tok", time.Hour); !errors.Is(err, ErrNoRedis) {
		t.Errorf("Release err = %v, want ErrNoRedis", err)
	}
}

// A Redis that accepts connections but never answers must cost a claim no
// more than the store's timeout.
func TestClaimTimesOutOnHungRedis(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true, Protocol: 2})
	t.Cleanup(func() { rdb.Close() })
	s := NewStore(rdb, StoreConfig{Prefix: "webhook", Timeout: 100 * time.Millisecond, ProcessingTTL: time.Minute})

	start := time.Now()
	_, err = tryClaim(s, t.Context(), "stripe", "evt", "")
	if err == nil {
		t.Fatal("claim against a hung redis succeeded")
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("claim took %s against a 100ms timeout", elapsed)
	}
}

func TestEntryValue(t *testing.T) {
	t.Parallel()
	at := time.UnixMilli(1_700_000_000_123)
	for _, e := range []Entry{
		{State: Processing, Owner: "abc123", At: at, Fingerprint: "ff00"},
		{State: Processing, Owner: "abc123", At: at},
		{State: Done, At: at, Fingerprint: "ff00"},
	} {
		var got Entry
		if err := got.parse(e.value()); err != nil {
			t.Errorf("parse(%q): %v", e.value(), err)
			continue
		}
		if diff := cmp.Diff(e, got); diff != "" {
			t.Errorf("round trip of %q (-want +got):\n%s", e.value(), diff)
		}
	}
	for _, bad := range []string{"", "1", "processing||1|", "processing|tok|x|fp", "done|-5|fp", "done|1", "other|1|2", strings.Repeat("|", 10)} {
		if e := newEntry("k", "p", "id", bad, 0); e.State != "" {
			t.Errorf("newEntry(%q) = %+v, want no state", bad, e)
		}
	}
}

func FuzzParseValue(f *testing.F) {
	f.Add("processing|0123456789abcdef01234567|1700000000123|00ff")
	f.Add("done|1700000000123|00ff")
	f.Add("done||")
	f.Fuzz(func(t *testing.T, s string) {
		var e Entry
		if e.parse(s) != nil {
			return
		}
		// Whatever parses must survive a round trip unchanged.
		var again Entry
		if err := again.parse(e.value()); err != nil {
			t.Fatalf("parse(%q) ok, but its value %q does not parse: %v", s, e.value(), err)
		}
		if !again.At.Equal(e.At) || again.Owner != e.Owner || again.State != e.State || again.Fingerprint != e.Fingerprint {
			t.Fatalf("round trip changed %+v into %+v", e, again)
		}
	})
}

func TestKey(t *testing.T) {
	t.Parallel()
	s := NewStore(nil, StoreConfig{Prefix: "webhook"})
	if got, want := s.Key("stripe", "evt_1"), "webhook:stripe:evt_1"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
}

func newClient(t *testing.T, opts *redis.Options) *redis.Client {
	t.Helper()
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}
