package claim

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/logsample"
)

// A flood of refusals costs a bounded number of log lines: 2,000 bad
// signatures, 500 stale timestamps and 500 bodies that are not JSON (one
// line each before: 3,000 WARN lines) make the first 10 lines of each
// reason and, once the window ends, one summary line each with the count
// left out; the rejections counter still counts every one.
func TestRejectionFloodLogsSampled(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	refusals := logsample.New(logger, logsample.Config{Now: func() time.Time { return now }})
	reg := prometheus.NewRegistry()
	// Rejections are answered before the claim: no store is reached.
	flow := NewFlow(nil, FlowConfig{HandlerTimeout: time.Second, Logger: logger, Registerer: reg, Refusals: refusals})
	rig := &intakeRig{decoded: make(chan []byte, 1)}
	handler := flow.Endpoint(stripe).Handler(rig.decode)
	send := func(n int, body string) {
		for range n {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			handler(w, r)
			if w.Code != http.StatusBadRequest {
				t.Fatalf("%s: status %d, want 400", body, w.Code)
			}
		}
	}
	send(2000, `{"id":"evt_1","reject":"signature"}`)
	send(500, `{"id":"evt_1","reject":"timestamp"}`)
	send(500, `not json`)

	type line struct {
		Level      string `json:"level"`
		Reason     string `json:"reason"`
		Sampled    string `json:"sampled"`
		Suppressed int    `json:"suppressed"`
	}
	read := func() map[line]int {
		t.Helper()
		got := map[line]int{}
		for s := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
			if s == "" {
				continue
			}
			var l line
			if err := json.Unmarshal([]byte(s), &l); err != nil {
				t.Fatalf("log line %q: %v", s, err)
			}
			got[l]++
		}
		buf.Reset()
		return got
	}
	want := map[line]int{
		{Level: "WARN", Reason: "signature"}: 10,
		{Level: "WARN", Reason: "timestamp"}: 10,
		{Level: "WARN", Reason: "malformed"}: 10,
	}
	if diff := cmp.Diff(want, read()); diff != "" {
		t.Errorf("log lines during the flood (-want +got):\n%s", diff)
	}
	now = now.Add(logsample.DefaultWindow)
	refusals.Flush(context.Background())
	want = map[line]int{
		{Level: "WARN", Sampled: "webhook rejected stripe signature", Suppressed: 1990}: 1,
		{Level: "WARN", Sampled: "webhook rejected stripe timestamp", Suppressed: 490}:  1,
		{Level: "WARN", Sampled: "webhook rejected stripe malformed", Suppressed: 490}:  1,
	}
	if diff := cmp.Diff(want, read()); diff != "" {
		t.Errorf("summary lines once the window ended (-want +got):\n%s", diff)
	}
	for reason, n := range map[string]float64{"signature": 2000, "timestamp": 500, "malformed": 500} {
		if got := testutil.ToFloat64(flow.metrics.rejections.WithLabelValues("stripe", reason)); got != n {
			t.Errorf("webhook_rejections_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}
}
