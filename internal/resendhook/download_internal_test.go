package resendhook

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/resend/resend-go/v3"
)

func TestPublicAddr(t *testing.T) {
	tests := map[string]bool{
		"93.184.215.14":        true,
		"2606:2800:21f:cb07::": true,
		"127.0.0.1":            false,
		"::1":                  false,
		"10.1.2.3":             false,
		"172.16.0.1":           false,
		"192.168.1.1":          false,
		"169.254.169.254":      false, // cloud metadata
		"fe80::1":              false,
		"fc00::1":              false,
		"0.0.0.0":              false,
		"::":                   false,
		"224.0.0.1":            false,
		"ff02::1":              false,
		"100.64.0.1":           false, // CGNAT
		"198.18.0.1":           false,
		"::ffff:127.0.0.1":     false, // v4-mapped loopback
		"::ffff:93.184.215.14": true,
		"255.255.255.255":      false,
		"2001:db8::1":          false,
		// IPv6 forms that carry an IPv4 address are judged by it.
		"64:ff9b::7f00:1":      false, // NAT64 well-known prefix: 127.0.0.1
		"64:ff9b::a9fe:a9fe":   false, // NAT64: 169.254.169.254
		"64:ff9b::a00:5":       false, // NAT64: 10.0.0.5
		"64:ff9b::808:808":     true,  // NAT64: 8.8.8.8
		"64:ff9b::7f00:1%eth0": false, // a zone does not hide the prefix
		"2001:db8::1%eth0":     false,
		"64:ff9b:1::a00:5":     false, // local-use NAT64, refused whatever it carries
		"::7f00:1":             false, // IPv4-compatible 127.0.0.1
		"::a00:5":              false, // IPv4-compatible 10.0.0.5
		"::808:808":            true,  // IPv4-compatible 8.8.8.8
		"::ffff:0:7f00:1":      false, // IPv4-translated 127.0.0.1
		"::ffff:0:808:808":     true,  // IPv4-translated 8.8.8.8
		"2002:7f00:1::1":       false, // 6to4 of 127.0.0.1
		"2002:a9fe:a9fe::1":    false, // 6to4 of 169.254.169.254
		"2002:c0a8:101::1":     false, // 6to4 of 192.168.1.1
		"2002:808:808::1":      true,  // 6to4 of 8.8.8.8
		// Teredo: the client's address is obfuscated and the relay reaches
		// anything, so the whole prefix is refused.
		"2001:0:4136:e378:8000:63bf:80ff:fffe": false, // client 127.0.0.1
		"2001:0:4136:e378:8000:63bf:f7f7:f7f7": false, // client 8.8.8.8
		// IANA special-purpose blocks that are not globally reachable
		// (issue 34: the first five were dialled).
		"100::1":           false, // discard-only
		"2001:2::1":        false, // benchmarking
		"2001:20::1":       false, // ORCHIDv2
		"3fff::1":          false, // documentation, RFC 9637
		"192.88.99.1":      false, // 6to4 relay anycast, deprecated
		"100:0:0:1::1":     false, // dummy prefix
		"2001:10::1":       false, // ORCHID, deprecated
		"2001:30::1":       false, // DETs
		"2001:1::1":        false, // PCP anycast: a service, not a file server
		"5f00::1":          false, // segment routing SIDs
		"192.0.0.170":      false, // NAT64 discovery
		"100:0:0:2::1":     true,  // just past the dummy prefix
		"2001:200::1":      true,  // just past IETF protocol assignments (APNIC)
		"3fff:1000::1":     true,  // just past documentation
		"192.88.100.1":     true,  // just past the 6to4 relay
		"2a00:1450:4001::": true,  // a public address
	}
	for s, want := range tests {
		if got := publicAddr(netip.MustParseAddr(s)); got != want {
			t.Errorf("publicAddr(%s) = %v, want %v", s, got, want)
		}
	}
}

// TestRefuseNonPublicSpecialPurpose: the dialler's check, which runs on
// the address about to be dialled, refuses each special-purpose block
// before a packet leaves; nothing here dials.
func TestRefuseNonPublicSpecialPurpose(t *testing.T) {
	for _, addr := range []string{"[100::1]:443", "[2001:2::1]:443", "[2001:20::1]:443", "[3fff::1]:443", "192.88.99.1:443"} {
		if err := refuseNonPublic(t.Context(), "tcp", addr, nil); !errors.Is(err, errRefusedTarget) {
			t.Errorf("refuseNonPublic(%s) = %v, want %v", addr, err, errRefusedTarget)
		}
	}
	if err := refuseNonPublic(t.Context(), "tcp", "[2a00:1450:4001::]:443", nil); err != nil {
		t.Errorf("refuseNonPublic(a public address) = %v, want nil", err)
	}
}

func TestSameOrigin(t *testing.T) {
	base, _ := url.Parse("https://api.resend.com/")
	tests := map[string]bool{
		"https://api.resend.com/emails/x":     true,
		"https://API.resend.com:443/emails/x": true,
		"https://api.resend.com:8443/emails":  false,
		"http://api.resend.com/emails":        false,
		"https://evil.example/emails":         false,
		"https://api.resend.com.evil.example": false,
	}
	for s, want := range tests {
		u, _ := url.Parse(s)
		if got := sameOrigin(u, base); got != want {
			t.Errorf("sameOrigin(%s) = %v, want %v", s, got, want)
		}
	}
}

// TestDownloadClient: the address rule holds on the address dialled, after
// name resolution (localhost is refused though the URL names no address),
// and redirects are followed at most maxRedirects times.
func TestDownloadClient(t *testing.T) {
	var hits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/hop/{n}", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		n, _ := strconv.Atoi(r.PathValue("n"))
		if n > 0 {
			http.Redirect(w, r, "/hop/"+strconv.Itoa(n-1), http.StatusFound)
			return
		}
		_, _ = w.Write([]byte("content"))
	})
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	tests := []struct {
		name         string
		allowPrivate bool
		url          string
		wantRefused  bool
		wantHits     int64
	}{
		{"localhost by name", false, "https://localhost:" + port + "/hop/0", true, 0},
		{"loopback address", false, srv.URL + "/hop/0", true, 0},
		{"allowed, 3 redirects", true, srv.URL + "/hop/3", false, 4},
		{"allowed, 4 redirects", true, srv.URL + "/hop/4", true, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hits.Store(0)
			c := newDownloadClient(tc.allowPrivate, nil)
			c.Transport.(*http.Transport).TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
			t.Cleanup(c.CloseIdleConnections)
			resp, err := c.Get(tc.url)
			if err == nil {
				resp.Body.Close()
			}
			if got := errors.Is(err, errRefusedTarget); got != tc.wantRefused {
				t.Errorf("refused = %v (err %v), want %v", got, err, tc.wantRefused)
			}
			if got := hits.Load(); got != tc.wantHits {
				t.Errorf("requests served = %d, want %d", got, tc.wantHits)
			}
		})
	}
}

// TestDownloadErrorHidesSignature: a failed download's error names the
// URL without its query, where the signature (a bearer credential) is.
func TestDownloadErrorHidesSignature(t *testing.T) {
	t.Parallel()
	d := downloader{client: newDownloadClient(true, nil), max: 1 << 20, allowPrivate: true}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the dial fails
	a := resend.EmailAttachment{Id: "att_1", DownloadUrl: "http://" + addr + "/a.txt?X-Amz-Signature=secret-sig-123&X-Amz-Credential=cred"}
	_, err = d.fetch(context.Background(), a, -1, newMailBudget(0).hold())
	if err == nil {
		t.Fatal("download from a closed port: no error")
	}
	if strings.Contains(err.Error(), "secret-sig-123") || strings.Contains(err.Error(), "cred") {
		t.Errorf("error %q carries the signed URL's query", err)
	}
}
