package support

import (
	"net/http/httptest"
	"testing"
)

// TestWantsHTML: only a client that prefers text/html gets pages; every
// client that got JSON before still does.
func TestWantsHTML(t *testing.T) {
	t.Parallel()
	tests := []struct {
		accept string
		want   bool
	}{
		{"", false},
		{"*/*", false},
		{"application/json", false},
		{"text/html, application/json", false}, // a tie keeps JSON
		{"application/json, text/html;q=0.9", false},
		{"text/html", true},
		{"text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8", true}, // Chromium
		{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", true},                       // Firefox
		{"application/json;q=0.5, text/html", true},
		{"application/json;q=0.5, */*", false}, // no HTML named
		{"text/html;q=0", false},
		{"text/html;q=bogus, application/json", false},
	}
	for _, tc := range tests {
		r := httptest.NewRequest("POST", "/support/messages", nil)
		r.Header.Set("Accept", tc.accept)
		if got := wantsHTML(r); got != tc.want {
			t.Errorf("Accept %q: wantsHTML = %v, want %v", tc.accept, got, tc.want)
		}
	}
}
