package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/munchable/munchable-webhooks/internal/logsample"
)

// dialFrom opens a connection to addr from the loopback address from
// (any of 127.0.0.0/8 is local on Linux), closed at the test's end.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("dial from %s: %v (needs 127.0.0.0/8 on loopback)", from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// getConn sends a GET on c and returns its answer's status and Retry-After.
func getConn(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// TestPerClientCap: one address holds at most its share of a listener's
// connections; the next from it is answered 503 with Retry-After and
// counted, while another address is served, and a slot freed is usable
// again. Addresses in TRUSTED_PROXIES (a load balancer) are not capped.
func TestPerClientCap(t *testing.T) {
	t.Parallel()
	const share = 3
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		want    int // the answer to one connection more than the share
	}{
		{"untrusted peer capped", nil, http.StatusServiceUnavailable},
		{"trusted proxy not capped", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"})
			sampler := logsample.New(slog.New(slog.NewJSONHandler(&logs, nil)), logsample.Config{})
			ln, err := listen("127.0.0.1:0", 16, clientCap{perClient: share, trusted: tc.trusted, listener: "main", refused: refused, refusals: sampler})
			if err != nil {
				t.Fatal(err)
			}
			ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
			srv := limitedServer(ok, log.New(io.Discard, "", 0), 10*time.Second, 10*time.Second, 120*time.Second, 16)
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })
			addr := ln.Addr().String()

			held := make([]net.Conn, share)
			for i := range held {
				held[i] = dialFrom(t, "127.0.0.1", addr)
				// An unfinished request: the connection is held, as a
				// trickling client holds it.
				if _, err := io.WriteString(held[i], "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
					t.Fatal(err)
				}
			}
			status, retry := getConn(t, dialFrom(t, "127.0.0.1", addr))
			if status != tc.want {
				t.Fatalf("connection %d from one address: %d, want %d", share+1, status, tc.want)
			}
			if tc.want == http.StatusOK {
				if n := testutil.ToFloat64(refused); n != 0 {
					t.Errorf("refused = %v, want 0", n)
				}
				return
			}
			if retry == "" {
				t.Errorf("503 without Retry-After")
			}
			if status, _ := getConn(t, dialFrom(t, "127.0.0.2", addr)); status != http.StatusOK {
				t.Errorf("another address while the first holds its share: %d, want 200", status)
			}
			held[0].Close()
			// The slot is given back once the server sees the close.
			deadline := time.Now().Add(10 * time.Second)
			for {
				c := dialFrom(t, "127.0.0.1", addr)
				status, _ := getConn(t, c)
				if status == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("a connection after one of the share closed: still %d", status)
				}
				c.Close()
				time.Sleep(20 * time.Millisecond)
			}
			if n := testutil.ToFloat64(refused); n < 1 {
				t.Errorf("refused = %v, want at least 1", n)
			}
			var line struct {
				Msg    string `json:"msg"`
				Client string `json:"client"`
			}
			first, _, _ := strings.Cut(logs.String(), "\n")
			if err := json.Unmarshal([]byte(first), &line); err != nil || line.Client != "127.0.0.1" {
				t.Errorf("log line %q (%v), want the refusal naming the client", first, err)
			}
		})
	}
}
