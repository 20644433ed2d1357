package support

import (
	"net/http"
	"net/netip"
)

// RateLimit is the form's rate limit with a bare 429, for the tests of how
// it tells clients apart; the form's own 429 is tested through Submit.
func RateLimit(perMinute int, trusted []netip.Prefix) func(http.Handler) http.Handler {
	return rateLimit(perMinute, trusted, func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusTooManyRequests, "too many requests")
	})
}
