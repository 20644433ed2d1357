package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// TestPublicMetricsSaid: with METRICS_ADDR empty /metrics stays on the
// public listener (the contract) and startup says so; with it set, the
// public listener has none and says nothing.
func TestPublicMetricsSaid(t *testing.T) {
	metrics := http.NotFoundHandler()
	for _, addr := range []string{"", ":9090"} {
		var logs bytes.Buffer
		got := publicMetrics(config{MetricsAddr: addr}, metrics, slog.New(slog.NewJSONHandler(&logs, nil)))
		said := strings.Contains(logs.String(), "METRICS_ADDR is empty")
		if (got != nil) != (addr == "") || said != (addr == "") {
			t.Errorf("METRICS_ADDR=%q: public /metrics %v, logged %v; want both %v", addr, got != nil, said, addr == "")
		}
	}
}
