package resendhook

import (
	"net/netip"
	"net/url"
	"testing"
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
	}
	for s, want := range tests {
		if got := publicAddr(netip.MustParseAddr(s)); got != want {
			t.Errorf("publicAddr(%s) = %v, want %v", s, got, want)
		}
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
