package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// postForm posts a JSON support message, with extra headers in pairs.
func (s *service) postForm(t *testing.T, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+"/support/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestFormCannotStarveWebhooks locks support_messages in another
// transaction, as a long migration or a stuck session would, and posts the
// form while Stripe deliveries arrive: the form may hold a quarter of the
// pool (one of DATABASE_MAX_CONNS=4) and gives up at its own deadline with
// 503, while every delivery is answered 200 and /readyz stays 200.
func TestFormCannotStarveWebhooks(t *testing.T) {
	t.Parallel()
	s := startService(t, map[string]string{"DATABASE_MAX_CONNS": "4", "SUPPORT_FORM_RATE": "100"})
	unlock := dbtest.LockTable(t, s.databaseURL, "support_messages")

	const forms, deliveries = 6, 12
	var wg sync.WaitGroup
	formAnswers := make([]*http.Response, forms)
	for i := range forms {
		wg.Go(func() {
			formAnswers[i] = s.postForm(t, fmt.Sprintf(`{"email":"ada@example.com","message":"Help %d"}`, i))
		})
	}
	// Let the posts take their slot and wait on the lock.
	time.Sleep(300 * time.Millisecond)
	stripeAnswers := make([]int, deliveries)
	for i := range deliveries {
		wg.Go(func() {
			body := bytes.ReplaceAll(fixture(t), []byte("evt_1QmunchableUpdated0001"), fmt.Appendf(nil, "evt_lock_%d", i))
			body = bytes.ReplaceAll(body, []byte("sub_1QmunchableSub0001"), fmt.Appendf(nil, "sub_lock_%d", i))
			resp := s.postStripe(t, body)
			stripeAnswers[i] = resp.StatusCode
		})
	}
	var ready []int
	for range 3 {
		r, err := http.Get(s.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		ready = append(ready, r.StatusCode)
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()

	for i, code := range stripeAnswers {
		if code != http.StatusOK {
			t.Errorf("Stripe delivery %d while the support table was locked: %d, want 200", i, code)
		}
	}
	for _, code := range ready {
		if code != http.StatusOK {
			t.Errorf("/readyz while the support table was locked: %v, want 200 each time", ready)
			break
		}
	}
	for i, r := range formAnswers {
		if r == nil || r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
			t.Errorf("form post %d: %v, want 503 with Retry-After", i, r)
		}
	}
	unlock()
	if r := s.postForm(t, `{"email":"ada@example.com","message":"Help"}`); r == nil || r.StatusCode != http.StatusAccepted {
		t.Errorf("form post after the lock: %v, want 202", r)
	}
	if m := metricsText(t, s); !strings.Contains(m, fmt.Sprintf(`support_form_submissions_total{outcome="failed"} %d`, forms)) {
		t.Errorf("/metrics does not count %d failed form posts", forms)
	}
}

func metricsText(t *testing.T, s *service) string {
	t.Helper()
	r, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// TestFormTrustedProxiesEmpty: TRUSTED_PROXIES="" trusts no proxy, not
// even on loopback (which the default trusts): X-Forwarded-For cannot make
// one client many.
func TestFormTrustedProxiesEmpty(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		env      map[string]string
		accepted int
	}{
		{"trust off", map[string]string{"TRUSTED_PROXIES": "", "SUPPORT_FORM_RATE": "2"}, 2},
		{"default trusts loopback", map[string]string{"SUPPORT_FORM_RATE": "2"}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startService(t, tc.env)
			accepted := 0
			for i := range 4 {
				r := s.postForm(t, `{"email":"ada@example.com","message":"Help"}`, "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1))
				if r != nil && r.StatusCode == http.StatusAccepted {
					accepted++
				}
			}
			if accepted != tc.accepted {
				t.Errorf("%d of 4 posts with distinct X-Forwarded-For accepted, want %d", accepted, tc.accepted)
			}
		})
	}
}

// TestReadyzBusyPool holds every connection of the pool, as slow work
// would: readiness asks Postgres on a connection of its own, so it stays
// 200, where a ping through the pool waited for a connection and failed.
func TestReadyzBusyPool(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for range cfg.MaxConns {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
	}
	probe := newPostgresProbe(pool)
	t.Cleanup(probe.close)
	h := handleReadyz(probe, claim.NewUsable(claim.NewStore(nil, claim.StoreConfig{}), slog.New(slog.DiscardHandler)), new(atomic.Bool))
	for i := range 2 { // the second reuses the probe's connection
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var rep struct {
			Ready    bool
			Postgres string
		}
		if err := json.Unmarshal(w.Body.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		if w.Code != http.StatusOK || !rep.Ready || rep.Postgres != "ok" {
			t.Errorf("readyz %d with the pool exhausted: %d %s, want 200 with postgres ok", i+1, w.Code, w.Body)
		}
	}
}

// TestReadyzProbeAnswersFromFresh: within probeFresh of its last answer
// the Postgres probe gives that answer again without asking (a flood of
// /readyz costs one ping a second); after it, it asks, and so sees a
// server that has gone.
func TestReadyzProbeAnswersFromFresh(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	probe := newPostgresProbe(pool)
	t.Cleanup(probe.close)
	now := time.Now()
	probe.now = func() time.Time { return now }
	if err := probe.ping(t.Context()); err != nil {
		t.Fatalf("first ping: %v", err)
	}
	// The server "goes": the probe's connection ends and a new one finds
	// nothing listening.
	probe.closeConn()
	probe.cfg.Port = 1
	now = now.Add(probeFresh / 2)
	if err := probe.ping(t.Context()); err != nil {
		t.Errorf("ping within probeFresh of an ok: %v, want the fresh ok", err)
	}
	now = now.Add(probeFresh)
	if err := probe.ping(t.Context()); err == nil {
		t.Error("ping after probeFresh, nothing listening: ok, want an error")
	}
}
