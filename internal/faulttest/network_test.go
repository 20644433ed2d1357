package faulttest_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// The probes of a hostile network (issue 21): header stuffing, many
// connections each holding part of a body, slow form bodies, idle
// connections on the metrics listener. Each starts the binary, sends the
// probe from loopback, measures, and stops by itself.

// raiseFDLimit lets this process (and the service it starts, which
// inherits the limit) hold n descriptors, within the hard limit.
func raiseFDLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d, the probe needs %d", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
}

// peakRSS samples the service's VmRSS every 50 ms for d and returns the
// largest; during is called once, a third of the way in.
func peakRSS(t *testing.T, svc *faulttest.Service, d time.Duration, during func()) int64 {
	t.Helper()
	var peak int64
	called := false
	start := time.Now()
	for time.Since(start) < d {
		peak = max(peak, vmRSS(t, svc.PID()))
		if !called && time.Since(start) > d/3 {
			called = true
			during()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return peak
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// stuffHeader opens a connection and sends a request line and an
// unfinished header line of size bytes, then holds the connection until
// the returned func closes it. Writes fail once the service refuses it.
func stuffHeader(t *testing.T, addr string, size int) func() {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		head := "POST /webhooks/stripe HTTP/1.1\r\nHost: " + addr + "\r\nX-Stuffing: "
		if _, err := io.WriteString(c, head); err != nil {
			return
		}
		pad := bytes.Repeat([]byte("a"), 32<<10)
		for sent := 0; sent < size; sent += len(pad) {
			if _, err := c.Write(pad[:min(len(pad), size-sent)]); err != nil {
				return
			}
		}
	})
	wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
	return func() {
		c.Close()
		wg.Wait()
	}
}

// A header block is bounded at 32 KiB: 100 connections each sending an
// unfinished 1 MiB header line cost a few MiB, not 1.9 MiB each (192 MiB
// before), a too-large header is answered 431, and a signed delivery is
// served meanwhile.
func TestHeaderStuffingBoundedMemory(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(nil)
	const (
		conns   = 100
		line    = 1 << 20
		holdFor = 3 * time.Second // under the 5 s header timeout
		limit   = 48 << 20
	)
	idle := vmRSS(t, svc.PID())
	closers := make([]func(), conns)
	for i := range closers {
		closers[i] = stuffHeader(t, svc.Addr(), line)
	}
	t.Cleanup(func() {
		for _, c := range closers {
			c()
		}
	})
	var delivery faulttest.Answer
	peak := peakRSS(t, svc, holdFor, func() { delivery = r.stripe(svc, padded(1)) })

	big := http.Header{"Content-Type": {"application/json"}, "X-Big": {strings.Repeat("b", 40<<10)}}
	tooLarge := rawPost(t, svc.Addr(), "/webhooks/stripe", big, []byte(`{}`))
	figure(t, "%d connections each sending an unfinished %d KiB header line, held %v: VmRSS %.1f MiB idle, peak %.1f MiB (+%.1f); a signed delivery meanwhile %d in %v; a 40 KiB header: %d",
		conns, line>>10, holdFor, mib(idle), mib(peak), mib(peak-idle), delivery.Status, delivery.Done.Sub(delivery.Sent).Round(time.Millisecond), tooLarge)

	if peak-idle >= limit {
		t.Errorf("VmRSS grew %.1f MiB under header stuffing, want under %d MiB", mib(peak-idle), limit>>20)
	}
	if !delivery.OK() {
		t.Errorf("a signed delivery during header stuffing: %v, want 200", delivery)
	}
	if tooLarge != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 40 KiB header: status %d, want 431", tooLarge)
	}
}

// Every body byte held counts against MAX_INFLIGHT_BODY_BYTES, the first
// ones too: 1,000 connections each holding 60 KiB of a webhook body stay
// within the budget (3,000 took 263 MiB before, each one's first 64 KiB
// outside it), and a small signed delivery is answered within 3 s.
func TestManyConnectionsHoldingBodies(t *testing.T) {
	t.Parallel()
	raiseFDLimit(t, 4096)
	r := newRig(t)
	svc := r.service(nil) // BODY_READ_TIMEOUT 10s, 32 MiB budget, 1024 connections
	const (
		conns   = 1000
		sent    = 60 << 10
		holdFor = 5 * time.Second // under BODY_READ_TIMEOUT
		limit   = 64 << 20
		answer  = 3 * time.Second
	)
	idle := vmRSS(t, svc.PID())
	body := bytes.Repeat([]byte(" "), sent)
	held := make([]*heldRequest, 0, conns)
	t.Cleanup(func() {
		for _, h := range held {
			h.release()
		}
	})
	for range conns {
		held = append(held, hold(t, svc.Addr(), "/webhooks/stripe", 100<<10, body))
	}
	var delivery faulttest.Answer
	peak := peakRSS(t, svc, holdFor, func() { delivery = r.stripe(svc, padded(1)) })
	answers := map[int]int{}
	for _, h := range held {
		answers[h.status()]++
	}
	took := delivery.Done.Sub(delivery.Sent)
	figure(t, "%d connections each holding %d KiB of a body, %v: VmRSS %.1f MiB idle, peak %.1f MiB (+%.1f); answers while held %v (0: none yet); a signed %d-byte delivery meanwhile: %d in %v",
		conns, sent>>10, holdFor, mib(idle), mib(peak), mib(peak-idle), answers, len(padded(1).JSON()), delivery.Status, took.Round(time.Millisecond))

	if peak-idle >= limit {
		t.Errorf("VmRSS grew %.1f MiB with %d held bodies, want under %d MiB", mib(peak-idle), conns, limit>>20)
	}
	if !delivery.OK() || took > answer {
		t.Errorf("a signed delivery while bodies were held: %v in %v, want 200 within %v", delivery, took, answer)
	}
}

// formPost opens a connection and posts the support form announcing
// announced bytes, of which it sends len(body), then holds.
func formPost(t *testing.T, addr string, announced int, body []byte) *heldRequest {
	t.Helper()
	return holdHead(t, addr, fmt.Sprintf("POST /support/messages HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nAccept: application/json\r\nContent-Length: %d\r\n\r\n", addr, announced), body)
}

// The form's body goes through the webhooks' intake: 200 posts stalling
// near its 256 KiB limit hold no more than the body budget, and each is
// answered 408 at BODY_READ_TIMEOUT (or 503 when the budget is spent),
// where they held +118 MiB for 30 s and got 400 before.
func TestSlowFormBodies(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{
		"BODY_READ_TIMEOUT": "2s",
		"SUPPORT_FORM_RATE": "100000", // the probe is about bodies, not the rate limit
	})
	const (
		posts = 200
		size  = 256 << 10
		sent  = size - 1<<10
		wait  = 45 * time.Second // generous: before the intake, 400 came at 30 s
	)
	idle := vmRSS(t, svc.PID())
	body := append([]byte("message="), bytes.Repeat([]byte("x"), sent-len("message="))...)
	held := make([]*heldRequest, posts)
	start := time.Now()
	for i := range held {
		held[i] = formPost(t, svc.Addr(), size, body)
	}
	t.Cleanup(func() {
		for _, h := range held {
			h.release()
		}
	})
	var peak int64
	answers := map[int]int{}
	var last time.Duration
	pending := posts
	for pending > 0 && time.Since(start) < wait {
		peak = max(peak, vmRSS(t, svc.PID()))
		pending = 0
		for _, h := range held {
			if h.answered() == nil {
				pending++
			}
		}
		if pending > 0 {
			last = time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, h := range held {
		answers[h.status()]++
	}
	figure(t, "%d form posts announcing %d KiB, stalled after %d KiB: VmRSS %.1f MiB idle, peak %.1f MiB (+%.1f); answers %v (0: none in %v), the last after about %v (BODY_READ_TIMEOUT=2s)",
		posts, size>>10, sent>>10, mib(idle), mib(peak), mib(peak-idle), answers, wait, last.Round(100*time.Millisecond))

	if answers[0] > 0 {
		t.Fatalf("%d slow form posts unanswered after %v", answers[0], wait)
	}
	if n := answers[http.StatusRequestTimeout]; n == 0 || n+answers[http.StatusServiceUnavailable] != posts {
		t.Errorf("answers %v, want every post 408 (or 503 for want of budget)", answers)
	}
	if peak-idle >= 64<<20 {
		t.Errorf("VmRSS grew %.1f MiB with slow form bodies, want under 64 MiB", mib(peak-idle))
	}

	// One slow post alone: 408 at the body deadline, counted nowhere as a
	// rejected webhook.
	h := formPost(t, svc.Addr(), 3000, []byte("email=a%40b.example"))
	one := time.Now()
	select {
	case got := <-h.answer:
		if got == nil || got.StatusCode != http.StatusRequestTimeout {
			t.Errorf("one slow form post answered %v, want 408", got)
		}
		figure(t, "one form post stalled after 19 of 3000 bytes: answered after %v", time.Since(one).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Errorf("one slow form post not answered in 20s (BODY_READ_TIMEOUT 2s)")
	}
	h.release()
}

// The metrics listener has the main one's limits: it closes a kept-alive
// connection once idle, and refuses a header block over 32 KiB with 431.
func TestMetricsListenerLimits(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	r.service(map[string]string{"METRICS_ADDR": addr})

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const bound = 90 * time.Second
	_ = c.SetDeadline(time.Now().Add(bound))
	br := bufio.NewReader(c)
	if _, err := fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	idleSince := time.Now()
	_, err = br.ReadByte() // blocks until the service closes the connection
	idleFor := time.Since(idleSince)
	closed := err == io.EOF || (err != nil && !isTimeout(err))
	figure(t, "a kept-alive connection to the metrics listener, idle after one scrape: closed %v after %v (err %v)", closed, idleFor.Round(100*time.Millisecond), err)
	if !closed {
		t.Errorf("the metrics listener kept an idle connection open for %v", bound)
	}

	big := http.Header{"X-Big": {strings.Repeat("b", 40<<10)}}
	if got := rawGet(t, addr, "/metrics", big); got != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("metrics listener, a 40 KiB header: status %d, want 431", got)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// rawGet sends a GET with header, byte for byte, and returns the answer's
// status (0: none).
func rawGet(t *testing.T, addr, path string, header http.Header) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	var req bytes.Buffer
	fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", path, addr)
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&req, "%s: %s\r\n", k, v)
		}
	}
	req.WriteString("\r\n")
	if _, err := c.Write(req.Bytes()); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// At most MAX_CONNECTIONS connections are served at once: with all of them
// held, a new connection waits in the kernel's queue unanswered, and is
// served as soon as one ends.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	const max = 20
	// No minimum body rate: it would cut the held bodies 2 s in, and the
	// limit alone is under test (TestTricklingClientCannotTakeEverySlot
	// has both).
	svc := r.service(map[string]string{"MAX_CONNECTIONS": strconv.Itoa(max), "BODY_MIN_RATE": "0"})
	// The readiness poll's connection may linger a moment; give it time to
	// go before counting on every slot.
	time.Sleep(200 * time.Millisecond)
	held := make([]*heldRequest, max)
	for i := range held {
		held[i] = hold(t, svc.Addr(), "/webhooks/stripe", 3000, []byte(`{"type":`))
	}
	t.Cleanup(func() {
		for _, h := range held {
			h.release()
		}
	})
	time.Sleep(500 * time.Millisecond) // let the service accept them all

	c, err := net.Dial("tcp", svc.Addr())
	if err != nil {
		t.Fatalf("dial with %d connections held: %v (want it queued by the kernel)", max, err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", svc.Addr()); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
	br := bufio.NewReader(c)
	if _, err := br.Peek(1); err == nil || !isTimeout(err) {
		t.Fatalf("connection %d answered while %d were held (err %v), want it to wait", max+1, max, err)
	}
	released := time.Now()
	held[0].release()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("connection %d after one held was released: %v", max+1, err)
	}
	resp.Body.Close()
	figure(t, "MAX_CONNECTIONS=%d, %d held: connection %d unanswered for 1.5 s, then %d %v after one was released",
		max, max, max+1, resp.StatusCode, time.Since(released).Round(time.Millisecond))
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz on the queued connection: %d, want 200", resp.StatusCode)
	}
}
