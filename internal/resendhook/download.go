package resendhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// maxRedirects is how many redirects a download, or an API call, follows.
const maxRedirects = 3

// errRefusedTarget is a download the service will not make: a scheme other
// than https, or an address that is not public, on the first request or a
// redirect. The download URL comes from the API's answer, so this is
// defence in depth against an answer someone else controls: it must not
// make the service fetch from its own network (metadata endpoints, Redis,
// Postgres, admin ports).
var errRefusedTarget = errors.New("download target refused")

// nonPublic are the address ranges a download may not dial, beyond what
// netip.Addr's own predicates name (loopback, private, link-local,
// multicast, unspecified): shared address space, benchmarking, the IETF and
// documentation ranges, reserved space, and IPv6's local-use NAT64 and
// documentation prefixes.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // CGNAT, RFC 6598
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("fec0::/10"),
}

// publicAddr reports whether a may be dialled for a download.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || !a.IsGlobalUnicast() || a.IsPrivate() || a.IsLoopback() ||
		a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// refuseNonPublic is a net.Dialer's ControlContext: it runs after name
// resolution, on the very address about to be dialled (each one, when a
// name has several), so a name that resolves to a public address for a
// check and to a private one for the dial (DNS rebinding) cannot pass.
func refuseNonPublic(_ context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s address %q", errRefusedTarget, network, address)
	}
	if !publicAddr(ap.Addr()) {
		return fmt.Errorf("%w: %s is not a public address", errRefusedTarget, ap.Addr())
	}
	return nil
}

// newDownloadClient returns the client for attachments' download URLs:
// https to public addresses only, redirects included and at most
// maxRedirects, unless allowPrivate (RESEND_DOWNLOAD_ALLOW_PRIVATE: tests,
// a private mirror) lifts the address and scheme rule. No proxy: the
// address checked must be the one the content comes from. The delivery's
// context bounds each download.
func newDownloadClient(allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.ControlContext = refuseNonPublic
	}
	return &http.Client{
		Transport: &http.Transport{
			DialContext:           dialer.DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          16,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > maxRedirects {
				return fmt.Errorf("%w: more than %d redirects", errRefusedTarget, maxRedirects)
			}
			return checkScheme(req.URL, allowPrivate)
		},
	}
}

// checkScheme refuses a download URL that is not https, unless
// allowPrivate.
func checkScheme(u *url.URL, allowPrivate bool) error {
	if u.Scheme == "https" || (allowPrivate && u.Scheme == "http") {
		return nil
	}
	return fmt.Errorf("%w: scheme %q", errRefusedTarget, u.Scheme)
}

// errAPIRedirect is a redirect of a Resend API call away from
// RESEND_API_URL's scheme, host and port. The call carries the API key,
// and net/http forwards Authorization on a redirect to the same host name
// even on another port (it compares names, not ports), so the API client
// follows no such redirect at all.
var errAPIRedirect = errors.New("resend API redirected away from RESEND_API_URL; not followed, so the API key is not sent elsewhere")

// apiRedirects is the API client's CheckRedirect: at most maxRedirects,
// and only within the origin (scheme, host and port) of base.
func apiRedirects(base *url.URL) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) > maxRedirects {
			return fmt.Errorf("resend API: more than %d redirects", maxRedirects)
		}
		if !sameOrigin(req.URL, base) {
			return fmt.Errorf("%w: to %s", errAPIRedirect, req.URL.Redacted())
		}
		return nil
	}
}

// sameOrigin compares scheme, host name and port (the scheme's default
// when none is written).
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) &&
		strings.EqualFold(a.Hostname(), b.Hostname()) &&
		portOf(a) == portOf(b)
}

func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	switch strings.ToLower(u.Scheme) {
	case "https":
		return "443"
	case "http":
		return "80"
	}
	return ""
}
