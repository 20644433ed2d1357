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

	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/tracing"
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
// multicast, unspecified): every block of IANA's IPv4 and IPv6
// Special-Purpose Address Registries (as of 2024-10) that is not globally
// reachable, and the deprecated ones. A few blocks are refused whole though
// the registry marks an address or two inside them reachable: those are
// anycast services (PCP, TURN, DNS-SD, AMT relays, AS112), never the host
// of a mail attachment, and a shorter list is one that stays right.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network", RFC 791
	netip.MustParsePrefix("100.64.0.0/10"),   // CGNAT, RFC 6598
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments, RFC 6890
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation, RFC 5737
	netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast, deprecated (RFC 7526)
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking, RFC 2544
	netip.MustParsePrefix("198.51.100.0/24"), // documentation, RFC 5737
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation, RFC 5737
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address
	netip.MustParsePrefix("64:ff9b:1::/48"),  // local-use IPv4/IPv6 translation, RFC 8215
	netip.MustParsePrefix("100::/64"),        // discard-only, RFC 6666
	netip.MustParsePrefix("100:0:0:1::/64"),  // dummy prefix, RFC 9780
	// IETF protocol assignments, RFC 2928: Teredo (2001::/32, RFC 4380:
	// its client address is obfuscated and its relays reach any address),
	// benchmarking (2001:2::/48), ORCHID and ORCHIDv2 (2001:10::/28,
	// 2001:20::/28: identifiers, not locators), DETs (2001:30::/28).
	netip.MustParsePrefix("2001::/23"),
	netip.MustParsePrefix("2001:db8::/32"), // documentation, RFC 3849
	netip.MustParsePrefix("3fff::/20"),     // documentation, RFC 9637
	netip.MustParsePrefix("5f00::/16"),     // segment routing SIDs, RFC 9602
	netip.MustParsePrefix("fec0::/10"),     // site-local, deprecated (RFC 3879)
}

// embedsIPv4 are the IPv6 forms that carry an IPv4 address (at byte at of
// the 16), which a translator or relay on the way delivers to: such an
// address is as public as the IPv4 address it carries.
var embedsIPv4 = []struct {
	prefix netip.Prefix
	at     int
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},    // NAT64 well-known prefix, RFC 6052
	{netip.MustParsePrefix("::/96"), 12},           // IPv4-compatible, RFC 4291 (deprecated)
	{netip.MustParsePrefix("::ffff:0:0:0/96"), 12}, // IPv4-translated, RFC 2765 (not IPv4-mapped ::ffff:0:0/96)
	{netip.MustParsePrefix("2002::/16"), 2},        // 6to4, RFC 3056: bits 16-47
}

// publicAddr reports whether a may be dialled for a download. An IPv6
// address that carries an IPv4 one (IPv4-mapped, or a form of
// embedsIPv4) is judged by the IPv4 address. A zone is dropped first:
// netip.Prefix.Contains matches no zoned address, so "%eth0" would
// otherwise take any address past the prefixes.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, e := range embedsIPv4 {
		if e.prefix.Contains(a) {
			b := a.As16()
			a = netip.AddrFrom4([4]byte(b[e.at : e.at+4]))
			break
		}
	}
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
func newDownloadClient(allowPrivate bool, tp trace.TracerProvider) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.ControlContext = refuseNonPublic
	}
	return &http.Client{
		Transport: tracing.Transport(tp, &http.Transport{
			DialContext:           dialer.DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          16,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}),
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
