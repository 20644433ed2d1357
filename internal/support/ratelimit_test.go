package support_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

var trustedProxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("fc00::/7"),
}

// limited wraps a handler that accepts everything in RateLimit(2): the
// limiter is what is under test, not the form behind it.
func limited() http.Handler {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	return support.RateLimit(2, trustedProxies)(ok)
}

// from posts as a TCP peer, with optional X-Forwarded-For values.
func from(h http.Handler, peer string, xff ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/support/messages", nil)
	r.RemoteAddr = peer
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestRateLimitAnswer goes through the form itself: its 429 carries
// Retry-After, is logged (it used to leave no trace) and is counted.
func TestRateLimitAnswer(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer // written by the handler, read after it returned
	reg := prometheus.NewRegistry()
	pool := dbtest.NewPool(t)
	h := support.NewForm(support.NewQueue(pool), support.FormConfig{
		Rate: 2, TrustedProxies: trustedProxies, DatabaseMaxConns: 4,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Registerer: reg,
	}).Submit()
	msg := `{"email":"ada@example.com","message":"Help"}`
	for i := range 2 {
		if w := postFrom(h, "203.0.113.7:5000", msg); w.Code != http.StatusAccepted {
			t.Fatalf("post %d: status = %d %s, want 202", i+1, w.Code, w.Body)
		}
	}
	w := postFrom(h, "203.0.113.7:5001", msg) // another source port, same client
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("third post: status = %d, want 429", w.Code)
	}
	if s, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("Retry-After = %q, want whole seconds >= 1", w.Header().Get("Retry-After"))
	}
	got := decodeJSON[map[string]string](t, w)
	if diff := cmp.Diff(map[string]string{"error": "too many requests"}, got); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}
	if !strings.Contains(logs.String(), `"msg":"support form: rate limited, answered 429"`) ||
		!strings.Contains(logs.String(), `"client":"203.0.113.7"`) {
		t.Errorf("no log line for the 429 naming the client:\n%s", logs.String())
	}
	wantCounts(t, reg, map[string]float64{"accepted": 2, "rate_limited": 1})
	if n := len(rows(t, pool)); n != 2 {
		t.Errorf("rows = %d, want 2", n)
	}
}

// postFrom posts a JSON body to h as a TCP peer.
func postFrom(h http.Handler, peer, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/support/messages", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.RemoteAddr = peer
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestRateLimitForgedChains: a client behind a trusted proxy writes
// whatever X-Forwarded-For it likes, including addresses inside the trusted
// ranges; the proxy appends the address it saw. However the chain is
// forged, the client is one client.
func TestRateLimitForgedChains(t *testing.T) {
	t.Parallel()
	h := limited()
	const client = "198.51.100.1" // what the trusted proxy at 10.0.0.2 saw
	forged := []string{
		"", "1.1.1.1", "203.0.113.5, 203.0.113.6", "10.0.0.9", "10.0.0.9, 10.0.0.10",
		"fd00::1", "garbage", "2001:db8::1, 10.1.2.3", "203.0.113.7:80", "[2001:db8::7]:443",
	}
	allowed := 0
	for _, f := range forged {
		xff := client
		if f != "" {
			xff = f + ", " + client
		}
		if w := from(h, "10.0.0.2:5000", xff); w.Code == http.StatusAccepted {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("%d of %d forged chains got through, want the limit of 2", allowed, len(forged))
	}
}

// TestRateLimitTrustOff: with no trusted proxy (TRUSTED_PROXIES=""), the
// peer is the client, even a peer inside the private ranges, and
// X-Forwarded-For is ignored.
func TestRateLimitTrustOff(t *testing.T) {
	t.Parallel()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	h := support.RateLimit(2, nil)(ok)
	allowed := 0
	for i := range 10 {
		if w := from(h, "10.0.0.2:5000", "198.51.100."+strconv.Itoa(i+1)); w.Code == http.StatusAccepted {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("%d of 10 posts with distinct X-Forwarded-For got through, want 2", allowed)
	}
	// Another peer is another client.
	if w := from(h, "10.0.0.3:5000", "198.51.100.1"); w.Code != http.StatusAccepted {
		t.Errorf("another peer: status = %d, want 202", w.Code)
	}
}

// TestRateLimitKey posts twice as one client to use up its budget, then
// once as another: the last post is allowed only if the limiter tells the
// two apart.
func TestRateLimitKey(t *testing.T) {
	t.Parallel()
	type client struct {
		peer string
		xff  []string
	}
	tests := []struct {
		name          string
		first, second client
		wantSeparate  bool
	}{
		{"different direct clients",
			client{"203.0.113.7:5000", nil}, client{"203.0.113.8:5000", nil}, true},
		{"direct client spoofing X-Forwarded-For is still itself",
			client{"203.0.113.7:5000", []string{"198.51.100.1"}}, client{"203.0.113.7:5000", []string{"198.51.100.2"}}, false},
		{"untrusted peer cannot borrow another client's key",
			client{"203.0.113.7:5000", nil}, client{"203.0.113.9:5000", []string{"203.0.113.7"}}, true},
		{"clients behind a trusted proxy are told apart by X-Forwarded-For",
			client{"10.0.0.2:5000", []string{"198.51.100.1"}}, client{"10.0.0.2:5000", []string{"198.51.100.2"}}, true},
		{"one client through two trusted proxies is one client",
			client{"10.0.0.2:5000", []string{"198.51.100.1"}}, client{"10.0.0.3:5000", []string{"198.51.100.1, 10.0.0.9"}}, false},
		{"behind the proxy, the rightmost untrusted hop counts, not what the client wrote",
			client{"10.0.0.2:5000", []string{"1.1.1.1, 198.51.100.1"}}, client{"10.0.0.2:5000", []string{"2.2.2.2, 198.51.100.1"}}, false},
		{"X-Forwarded-For split over several headers",
			client{"10.0.0.2:5000", []string{"198.51.100.1"}}, client{"10.0.0.2:5000", []string{"9.9.9.9", "198.51.100.1", "10.0.0.7"}}, false},
		{"trusted proxy without X-Forwarded-For counts as itself",
			client{"10.0.0.2:5000", nil}, client{"10.0.0.2:5000", nil}, false},
		{"IPv6 clients count by /64",
			client{"[2001:db8:1:2::1]:5000", nil}, client{"[2001:db8:1:2::ffff]:5000", nil}, false},
		{"IPv4-mapped IPv6 peer is the IPv4 client",
			client{"203.0.113.7:5000", nil}, client{"[::ffff:203.0.113.7]:5000", nil}, false},
		{"IPv6 client behind an IPv6 trusted proxy",
			client{"[fd00::1]:5000", []string{"2001:db8:1:2::1"}}, client{"[fd00::1]:5000", []string{"2001:db8:9:9::1"}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := limited()
			for i := range 2 {
				if w := from(h, tc.first.peer, tc.first.xff...); w.Code != http.StatusAccepted {
					t.Fatalf("first client, post %d: status = %d, want 202", i+1, w.Code)
				}
			}
			want := http.StatusTooManyRequests
			if tc.wantSeparate {
				want = http.StatusAccepted
			}
			if w := from(h, tc.second.peer, tc.second.xff...); w.Code != want {
				t.Errorf("second client: status = %d, want %d", w.Code, want)
			}
		})
	}
}

// TestRateLimitFloodLogsSampled: 2,000 posts over the limit from one client
// make the first 10 lines in full (the client named), not 2,000; the
// counter counts every one.
func TestRateLimitFloodLogsSampled(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer // written by the handler, read after it returned
	reg := prometheus.NewRegistry()
	// An invalid post never reaches the queue: no database needed.
	h := support.NewForm(nil, support.FormConfig{
		Rate: 1, DatabaseMaxConns: 4,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Registerer: reg,
	}).Submit()
	if w := postFrom(h, "203.0.113.7:5000", `{"email":"nope"}`); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("first post: status = %d, want 422", w.Code)
	}
	for i := range 2000 {
		if w := postFrom(h, "203.0.113.7:5000", `{"email":"nope"}`); w.Code != http.StatusTooManyRequests {
			t.Fatalf("post %d: status = %d, want 429", i+2, w.Code)
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 10 || !strings.Contains(lines[0], `"client":"203.0.113.7"`) {
		t.Errorf("%d log lines for 2,000 refused posts, want the first 10 (the client named); the first: %s", len(lines), lines[0])
	}
	wantCounts(t, reg, map[string]float64{"invalid": 1, "rate_limited": 2000})
}
