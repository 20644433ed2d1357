package support_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

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

func TestRateLimitAnswer(t *testing.T) {
	t.Parallel()
	h := limited()
	for i := range 2 {
		if w := from(h, "203.0.113.7:5000"); w.Code != http.StatusAccepted {
			t.Fatalf("post %d: status = %d, want 202", i+1, w.Code)
		}
	}
	w := from(h, "203.0.113.7:5001") // another source port, same client
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
