package resendhook_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/support"
	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// TestSweepEnds: a list that never ends as it should stops the pass,
// saying why, with sweep.ErrStopped: has_more for ever with new pages
// (SWEEP_MAX_PAGES), the same page again, a creation time that does not
// parse. Before, the first two never ended and the third read on.
func TestSweepEnds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{quiet: true})
	tests := []struct {
		name string
		page func(n int64) []map[string]any
		want sweep.Stop
	}{
		{"has_more for ever", func(n int64) []map[string]any {
			return []map[string]any{{"id": fmt.Sprintf("em_%d", n), "created_at": time.Now().UTC().Format(time.RFC3339Nano), "to": []string{"sales@munchable.app"}}}
		}, sweep.StopMaxPages},
		{"the same page again", func(int64) []map[string]any {
			return []map[string]any{{"id": "em_same", "created_at": time.Now().UTC().Format(time.RFC3339Nano), "to": []string{"sales@munchable.app"}}}
		}, sweep.StopPageSeen},
		{"a date that does not parse", func(n int64) []map[string]any {
			return []map[string]any{{"id": fmt.Sprintf("em_%d", n), "created_at": "yesterday", "to": []string{"sales@munchable.app"}}}
		}, sweep.StopBadDate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var pages atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := pages.Add(1)
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "has_more": true, "data": tc.page(n)})
			}))
			t.Cleanup(srv.Close)
			apiURL, _ := url.Parse(srv.URL)
			r := resendhook.New(resendhook.Config{Queue: support.NewQueue(h.pool), Webhook: h.wh, APIKey: apiKey, APIURL: apiURL})
			const maxPages = 3
			n, err := r.SweepPass(h.ep, maxPages)(t.Context(), time.Now().Add(-time.Hour))
			if !errors.Is(err, sweep.ErrStopped) || n.Stopped != tc.want {
				t.Errorf("pass = %+v, %v; want stopped for %s", n, err, tc.want)
			}
			if got := pages.Load(); got > maxPages {
				t.Errorf("%d pages read, want at most %d", got, maxPages)
			}
		})
	}
}
