package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// maxHeaderBytes bounds a request's header block on every listener; over
// it net/http answers 431. Go's default is 1 MiB, and the server reads a
// header line whole before judging it: 100 connections each sending an
// unfinished 1 MiB line held 194 MiB until the header timeout. A provider's
// headers are a few hundred bytes, a browser's a few KiB.
const maxHeaderBytes = 32 << 10

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
// idle timeouts.
func limitedServer(handler http.Handler, errorLog *log.Logger, read, write, idle time.Duration) *http.Server {
	return &http.Server{
		Handler:           handler,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: headerTimeout,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       idle,
		ErrorLog:          errorLog,
	}
}

// listen opens addr holding at most maxConns connections at once. Go's
// server keeps a goroutine, buffers and the parsed request per connection,
// and the body budget is sized by this limit (a first chunk per
// connection): beyond it, a new connection waits in the kernel's accept
// queue until one ends, rather than being served. netutil.LimitListener
// releases a slot when the connection closes, and unblocks on Close.
func listen(addr string, maxConns int) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return netutil.LimitListener(ln, maxConns), nil
}
