package faulttest_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// redisProxy stands between the service and redis-server. It forwards every
// command byte for byte, except the ones its hold function picks: those it
// swallows, neither forwarding nor answering them, and reports on held. The
// service then waits on a reply that never comes, exactly as it would on a
// Redis whose reply was lost; a test can kill the service in that window.
//
// While stalled it forwards nothing; on resume it forwards what it kept, in
// order. That is a hung Redis (a long fork, a stopped process, a saturated
// network): the commands a client gave up on still run, late.
type redisProxy struct {
	ln     net.Listener
	target string
	held   chan []string

	mu      sync.Mutex
	hold    func(args []string) bool
	stalled chan struct{} // non-nil while stalled; closed on resume
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func startRedisProxy(t *testing.T, target string) *redisProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &redisProxy{ln: ln, target: target, held: make(chan []string, 16), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *redisProxy) URL() string { return "redis://" + p.ln.Addr().String() }

// setHold installs the function that picks the commands to swallow (nil:
// forward everything).
func (p *redisProxy) setHold(hold func(args []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = hold
}

// stall stops forwarding until resume.
func (p *redisProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// resume forwards what stall kept, and everything after it.
func (p *redisProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

func (p *redisProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.pipe(c)
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		}()
	}
}

// pipe relays one client connection until either side closes it.
func (p *redisProxy) pipe(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(client, server)
		client.Close()
	}()
	br := bufio.NewReader(client)
	for {
		raw, args, err := readCommand(br)
		if err != nil {
			return
		}
		p.mu.Lock()
		hold, stalled := p.hold, p.stalled
		p.mu.Unlock()
		if stalled != nil {
			<-stalled
		}
		if hold != nil && hold(args) {
			select {
			case p.held <- args:
			default:
			}
			// Swallowed: nothing more goes through this connection; wait
			// for the client to give up on it or die.
			_, _ = io.Copy(io.Discard, br)
			return
		}
		if _, err := server.Write(raw); err != nil {
			return
		}
	}
}

func (p *redisProxy) close() {
	p.resume()
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// readCommand reads one client command in RESP (an array of bulk strings,
// which is all go-redis sends) or inline form, and returns its bytes and
// its arguments.
func readCommand(br *bufio.Reader) (raw []byte, args []string, err error) {
	line, err := br.ReadBytes('\n')
	if err != nil {
		return nil, nil, err
	}
	raw = append(raw, line...)
	if line[0] != '*' {
		return raw, strings.Fields(string(line)), nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(line[1:])))
	if err != nil {
		return nil, nil, fmt.Errorf("resp array header %q: %w", line, err)
	}
	for range n {
		hdr, err := br.ReadBytes('\n')
		if err != nil {
			return nil, nil, err
		}
		raw = append(raw, hdr...)
		if hdr[0] != '$' {
			return nil, nil, errors.New("resp: want a bulk string")
		}
		size, err := strconv.Atoi(strings.TrimSpace(string(hdr[1:])))
		if err != nil || size < 0 {
			return nil, nil, fmt.Errorf("resp bulk header %q", hdr)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return nil, nil, err
		}
		raw = append(raw, buf...)
		args = append(args, string(buf[:size]))
	}
	return raw, args, nil
}

// isConfirm reports a confirm: the plain SET that writes a done marker
// (internal/claim's Store.Confirm). The claim's own SET NX runs inside the
// Lua script and is never seen here as a SET.
func isConfirm(args []string) bool {
	return len(args) >= 3 && strings.EqualFold(args[0], "set") && strings.HasPrefix(args[2], "done|")
}
