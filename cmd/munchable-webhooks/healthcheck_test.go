package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

func TestHealthzURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ addr, want string }{
		{":8080", "http://127.0.0.1:8080/healthz"},
		{"0.0.0.0:9000", "http://127.0.0.1:9000/healthz"},
		{"[::]:9000", "http://127.0.0.1:9000/healthz"},
		{"127.0.0.1:8081", "http://127.0.0.1:8081/healthz"},
		{"[::1]:8081", "http://[::1]:8081/healthz"},
		{"10.1.2.3:80", "http://10.1.2.3:80/healthz"},
	}
	for _, tt := range tests {
		if got := healthzURL(tt.addr); got != tt.want {
			t.Errorf("healthzURL(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// healthzServer answers /healthz with status on a free port of 127.0.0.1
// and returns the port and a count of the requests it saw.
func healthzServer(t *testing.T, status int) (port string, hits *atomic.Int32) {
	t.Helper()
	hits = &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return port, hits
}

func TestHealthcheck(t *testing.T) {
	t.Parallel()
	healthy, hits := healthzServer(t, http.StatusOK)
	sick, _ := healthzServer(t, http.StatusServiceUnavailable)
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(port)
	tests := []struct {
		name   string
		env    []string
		wantOK bool
	}{
		// Only LISTEN_ADDR is given: the rest of the configuration is not
		// needed, so a container with a broken secret still reports health.
		{"healthy", []string{"LISTEN_ADDR=:" + healthy}, true},
		{"healthy on loopback", []string{"LISTEN_ADDR=127.0.0.1:" + healthy, "HANDLER_TIMEOUT=nonsense"}, true},
		{"not 200", []string{"LISTEN_ADDR=:" + sick}, false},
		{"nothing listening", []string{"LISTEN_ADDR=:" + closed}, false},
		{"bad LISTEN_ADDR", []string{"LISTEN_ADDR=8080"}, false},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := run(t.Context(), []string{"munchable-webhooks", "healthcheck"}, tt.env, &out, &out)
		if gotOK := err == nil; gotOK != tt.wantOK {
			t.Errorf("%s: healthcheck err = %v, want ok=%v", tt.name, err, tt.wantOK)
		}
	}
	if got := hits.Load(); got != 2 {
		t.Errorf("healthy server saw %d checks, want 2", got)
	}
}
