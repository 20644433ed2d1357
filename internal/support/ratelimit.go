package support

import (
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/go-chi/httprate"
)

// rateLimit allows each client address perMinute requests a minute
// (httprate's sliding window, kept in this process) and hands the rest to
// refuse, with Retry-After set. trusted are the proxies whose
// X-Forwarded-For is believed (TRUSTED_PROXIES); with none, every client is
// its TCP peer and X-Forwarded-For is ignored.
func rateLimit(perMinute int, trusted []netip.Prefix, refuse http.HandlerFunc) func(http.Handler) http.Handler {
	key := func(r *http.Request) (string, error) {
		return clientKey(r, trusted), nil
	}
	return httprate.LimitBy(perMinute, time.Minute, key,
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			// httprate has already set Retry-After to the window's length in
			// seconds (a safe bound: the sliding window frees a slot within
			// it); it is set here only should that change.
			if w.Header().Get("Retry-After") == "" {
				w.Header().Set("Retry-After", "60")
			}
			refuse(w, r)
		}),
		// The key function never fails and the in-process counter never
		// errs, but httprate's default would answer 428 in plain text.
		httprate.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, _ error) {
			writeError(w, http.StatusInternalServerError, "rate limiter failed")
		}),
	)
}

// clientKey is the address the rate limit counts against. A peer outside
// the trusted proxies is the client itself, whatever X-Forwarded-For it
// sends. Behind trusted proxies the client is the rightmost
// X-Forwarded-For hop that is not one of them: each proxy appends the
// address it saw, so everything to the left of that hop is the client's own
// claim and may be forged. IPv6 clients are counted by their /64, which one
// subscriber typically holds whole.
func clientKey(r *http.Request, trusted []netip.Prefix) string {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return r.RemoteAddr
	}
	if !isTrusted(peer, trusted) {
		return httprate.CanonicalizeIP(peer.String())
	}
	hops := forwardedFor(r.Header)
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHost(hops[i])
		if !ok {
			// A trusted proxy does not write garbage: the chain can no
			// longer be followed, so count against the peer.
			break
		}
		if !isTrusted(a, trusted) {
			return httprate.CanonicalizeIP(a.String())
		}
	}
	return httprate.CanonicalizeIP(peer.String())
}

// forwardedFor returns the hops of every X-Forwarded-For header, in order.
func forwardedFor(h http.Header) []string {
	var hops []string
	for _, v := range h.Values("X-Forwarded-For") {
		for hop := range strings.SplitSeq(v, ",") {
			hops = append(hops, strings.TrimSpace(hop))
		}
	}
	return hops
}

// parseHost reads an address with or without a port ("203.0.113.7",
// "203.0.113.7:4711", "[2001:db8::1]:443"), as RemoteAddr and proxies write
// it.
func parseHost(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
