package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"
)

// maxHeaderBytes bounds a request's header block on every listener at
// 32 KiB; over it net/http answers 431. Go's default is 1 MiB, and the
// server reads a header line whole before judging it: 100 connections each
// sending an unfinished 1 MiB line held 194 MiB until the header timeout. A
// provider's headers are a few hundred bytes, a browser's a few KiB.
// net/http reads 4 KiB beyond MaxHeaderBytes before it refuses, so the
// setting is that much under the bound.
const maxHeaderBytes = 32<<10 - 4<<10

// Timeouts of the metrics listener: a scrape is one small GET answered from
// memory. The idle timeout is short because a kept-alive scraper
// connection costs as much as any other, and the next scrape may open a
// new one.
const (
	metricsReadTimeout  = 10 * time.Second
	metricsWriteTimeout = 30 * time.Second
	metricsIdleTimeout  = 30 * time.Second
)

// headerTimeout is the longest a client may take to send its headers, on
// every listener.
const headerTimeout = 5 * time.Second

// limitedServer is an http.Server with every limit a listener open to
// untrusted clients needs: header size, and read-header, read, write and
// idle timeouts; and, for a listener holding at most maxConns connections,
// idle ones closed while it is half full (idleCloser).
func limitedServer(handler http.Handler, errorLog *log.Logger, read, write, idle time.Duration, maxConns int) *http.Server {
	return &http.Server{
		Handler:           handler,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: headerTimeout,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       idle,
		ErrorLog:          errorLog,
		ConnState:         newIdleCloser(max(1, maxConns/2)).connState,
	}
}

// idleCloser closes kept-alive connections that sit idle while at least
// high connections are open. A connection keeps its slot of
// MAX_CONNECTIONS until it closes, and the idle timeout is long (a load
// balancer's pooled connections must outlive its own idle timeout, or it
// meets closed ones): without this, a client that opened MAX_CONNECTIONS
// connections and sent one request on each held every slot for the idle
// timeout at a few requests a second, and providers and probes waited in
// the kernel's queue. Under half full, nothing changes.
type idleCloser struct {
	high int

	mu   sync.Mutex
	open int
	idle map[net.Conn]struct{}
}

func newIdleCloser(high int) *idleCloser {
	return &idleCloser{high: high, idle: map[net.Conn]struct{}{}}
}

// connState is the server's ConnState hook: net/http calls it as each
// connection changes state, from that connection's goroutine or the accept
// loop.
func (c *idleCloser) connState(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch state {
	case http.StateNew:
		c.open++
		if c.open >= c.high {
			for idle := range c.idle {
				_ = idle.Close() // its StateClosed follows
				delete(c.idle, idle)
			}
		}
	case http.StateIdle:
		if c.open >= c.high {
			_ = conn.Close()
			return
		}
		c.idle[conn] = struct{}{}
	case http.StateActive:
		delete(c.idle, conn)
	case http.StateClosed, http.StateHijacked:
		c.open--
		delete(c.idle, conn)
	}
}

// listen opens addr holding at most maxConns connections at once, and at
// most perClient's share from one client address (clientCap). Go's
// server keeps a goroutine, buffers and the parsed request per connection,
// and the body budget is sized by this limit (a first chunk per
// connection): beyond it, a new connection waits in the kernel's accept
// queue until one ends, rather than being served. netutil.LimitListener
// releases a slot when the connection closes, and unblocks on Close.
func listen(addr string, maxConns int, perClient clientCap) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return netutil.LimitListener(perClient.wrap(ln), maxConns), nil
}
