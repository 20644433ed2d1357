package faulttest_test

import (
	"net"
	"sync"
	"testing"
)

// tcpProxy relays TCP connections to a target and can stall them: while
// stalled it forwards nothing in either direction, and on resume it
// forwards what it kept. That is a hung server (a stopped process, a
// saturated disk or network): what a client gave up on still reaches the
// server, late.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed on resume
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func startTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

func (p *tcpProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

func (p *tcpProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client, true)
		p.track(server, true)
		p.wg.Add(2)
		go p.relay(client, server)
		go p.relay(server, client)
	}
}

// relay copies from src to dst, holding each chunk while stalled, until
// either side closes.
func (p *tcpProxy) relay(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.track(src, false)
		p.track(dst, false)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			if stalled != nil {
				<-stalled
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tcpProxy) close() {
	p.resume()
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
