package main

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serveLimited serves ok on a loopback listener holding at most maxConns
// connections, with the service's limits, and returns its address.
func serveLimited(t *testing.T, maxConns int) string {
	t.Helper()
	ln, err := listen("127.0.0.1:0", maxConns, clientCap{})
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := limitedServer(ok, log.New(io.Discard, "", 0), 10*time.Second, 10*time.Second, 120*time.Second, maxConns)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// getOn sends one GET on c with an extra header of n bytes and returns the
// status, leaving the connection open (kept alive).
func getOn(t *testing.T, c net.Conn, r *bufio.Reader, n int) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", n)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestIdleConnectionsLeaveSlots: connections kept alive after one request
// each, as many as the listener holds, do not keep the next client out:
// idle ones are closed once the listener is half full.
func TestIdleConnectionsLeaveSlots(t *testing.T) {
	t.Parallel()
	const slots = 4
	addr := serveLimited(t, slots)
	for range slots {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := getOn(t, c, bufio.NewReader(c), 0); got != http.StatusOK {
			t.Fatalf("GET on a fresh connection: %d", got)
		}
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("a new client while %d connections sat idle: %v", slots, err)
	}
	resp.Body.Close()
}

// TestHeaderBlockBound: a header block up to 32 KiB is read, a larger one
// answered 431 (net/http reads 4 KiB past MaxHeaderBytes).
func TestHeaderBlockBound(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, 16)
	for _, tc := range []struct {
		n    int
		want int
	}{{31 << 10, http.StatusOK}, {33 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := getOn(t, c, bufio.NewReader(c), tc.n); got != tc.want {
			t.Errorf("a %d KiB header: %d, want %d", tc.n>>10, got, tc.want)
		}
		c.Close()
	}
}
