package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/logsample"
)

// clientCap is the per-client share of a listener's MAX_CONNECTIONS: one
// address may hold at most perClient connections at once
// (MAX_CONNECTIONS_PER_CLIENT), so that it cannot take every slot. The
// probe of issue 34 held all 1,024 slots with about 1,100 connections
// trickling a body byte a second from one address (2 KB/s in all), and
// providers and probes waited in the kernel's queue.
//
// Peers inside trusted (TRUSTED_PROXIES) are not capped: a load balancer
// in front of the service is one address, or a few, for every client, the
// providers included, and must be let through; its own limits and the
// minimum body rate (BODY_MIN_RATE) are what stand behind it. IPv6 peers
// are counted by their /64, which one subscriber typically holds whole.
type clientCap struct {
	perClient int // 0: no cap
	trusted   []netip.Prefix
	listener  string // "main" or "metrics", for the metric and the log
	refused   prometheus.Counter
	refusals  *logsample.Sampler
}

// refusedConnections is webhook_connections_refused_total: connections
// answered 503 and closed because their address held its share already.
func refusedConnections(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "webhook_connections_refused_total",
		Help: "Connections refused (503, closed) because their client address held MAX_CONNECTIONS_PER_CLIENT already, by listener.",
	}, []string{"listener"})
	c.WithLabelValues("main")
	c.WithLabelValues("metrics")
	reg.MustRegister(c)
	return c
}

// refusalAnswers bounds the refused connections being answered at once;
// beyond it one is closed unanswered. Each answer ends within
// refusalLinger.
const (
	refusalAnswers = 64
	refusalLinger  = 250 * time.Millisecond
)

// refusalResponse is written to a refused connection before its request is
// read: 503 with Retry-After, as the body budget answers (both providers
// retry a 503), and the connection closed.
var refusalResponse = func() []byte {
	body := `{"error":"too many connections from this address, retry later"}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\n" +
		"Content-Type: application/json\r\n" +
		"Retry-After: 5\r\n" +
		"Connection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// wrap caps ln per client; with no cap it returns ln.
func (c clientCap) wrap(ln net.Listener) net.Listener {
	if c.perClient <= 0 {
		return ln
	}
	return &clientLimitListener{Listener: ln, cap: c, open: map[netip.Addr]int{}, answering: make(chan struct{}, refusalAnswers)}
}

// clientLimitListener admits a connection while its client holds fewer
// than perClient, and answers the others 503 and closes them. It sits
// under netutil.LimitListener, so a refused connection never takes one of
// MAX_CONNECTIONS.
type clientLimitListener struct {
	net.Listener
	cap       clientCap
	answering chan struct{}

	mu   sync.Mutex
	open map[netip.Addr]int
}

func (l *clientLimitListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client, ok := l.client(conn.RemoteAddr())
		if !ok {
			return conn, nil
		}
		l.mu.Lock()
		if l.open[client] >= l.cap.perClient {
			l.mu.Unlock()
			l.refuse(conn, client)
			continue
		}
		l.open[client]++
		l.mu.Unlock()
		return &clientConn{Conn: conn, release: func() { l.release(client) }}, nil
	}
}

// client is the address conn counts against, and whether it is capped at
// all (a trusted proxy is not).
func (l *clientLimitListener) client(addr net.Addr) (netip.Addr, bool) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(tcp.IP)
	if !ok {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	for _, p := range l.cap.trusted {
		if p.Contains(a) {
			return netip.Addr{}, false
		}
	}
	if a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return a, true
}

func (l *clientLimitListener) release(client netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[client]--; l.open[client] <= 0 {
		delete(l.open, client)
	}
}

// refuse counts and logs (sampled) a refused connection, and answers it in
// a goroutine of its own that ends within refusalLinger: the answer is
// written, the sending side shut, and what the client sent read away
// briefly, so that closing does not reset the connection before the
// client has read the answer. Past refusalAnswers at once, it is closed
// unanswered.
func (l *clientLimitListener) refuse(conn net.Conn, client netip.Addr) {
	l.cap.refused.Inc()
	l.cap.refusals.Log(context.Background(), slog.LevelWarn, "connection refused "+l.cap.listener,
		"connection refused: its client address holds MAX_CONNECTIONS_PER_CLIENT already, answered 503",
		slog.String("listener", l.cap.listener), slog.String("client", client.String()),
		slog.Int("max_connections_per_client", l.cap.perClient))
	select {
	case l.answering <- struct{}{}:
	default:
		_ = conn.Close()
		return
	}
	go func() {
		defer func() { <-l.answering }()
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(refusalLinger))
		if _, err := conn.Write(refusalResponse); err != nil {
			return
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(conn, 64<<10))
	}()
}

// clientConn gives its client's slot back when it closes, once.
type clientConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *clientConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
