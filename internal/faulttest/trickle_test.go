package faulttest_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// Item 4 of issue 34: about 1,100 connections trickling a body byte a
// second from one client address (2 KB/s in all) held every one of
// MAX_CONNECTIONS, and providers waited in the kernel's queue. Two
// defences, one test each way the service is reached:
//   - exposed directly (the attacker's address is not a trusted proxy):
//     MAX_CONNECTIONS_PER_CLIENT leaves the attacker its share and refuses
//     the rest, so a provider's delivery from another address is served
//     at once;
//   - behind a load balancer (every peer a trusted proxy, so no address
//     is capped): BODY_MIN_RATE cuts each trickling body 2 s in, so slots
//     turn over and the delivery gets one within seconds.
//
// BODY_READ_TIMEOUT is 60 s here, so that without either defence the
// delivery would wait about that long for a slot. CI runs 100 connections
// against MAX_CONNECTIONS=64 (and a share of 16); FAULTTEST_TRICKLE_SCALE=full
// runs the 1,100 against the defaults (1,024, a share of 64).
func TestTricklingClientCannotTakeEverySlot(t *testing.T) {
	t.Parallel()
	conns, maxConns, share := 100, 64, 16
	if os.Getenv("FAULTTEST_TRICKLE_SCALE") == "full" {
		conns, maxConns, share = 1100, 1024, 64
		raiseFDLimit(t, 4096)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"direct client capped", map[string]string{"TRUSTED_PROXIES": ""}},
		// Loopback is in the default TRUSTED_PROXIES: every peer is "the
		// load balancer", uncapped.
		{"behind a balancer, bodies too slow", map[string]string{"MAX_CONNECTIONS_PER_CLIENT": "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			port, err := dbtest.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			env := map[string]string{
				"METRICS_ADDR":               metricsAddr,
				"MAX_CONNECTIONS":            strconv.Itoa(maxConns),
				"MAX_CONNECTIONS_PER_CLIENT": strconv.Itoa(share),
				"BODY_READ_TIMEOUT":          "60s",
			}
			for k, v := range tc.env {
				env[k] = v
			}
			svc := r.service(env)
			logStart := logSize(t, svc)

			flood := trickle(t, svc.Addr(), "127.0.0.1", conns)
			// Let the flood take what it can before the provider comes.
			time.Sleep(3 * time.Second)

			provider := clientFrom("127.0.0.2")
			ev := padded(1)
			req, err := faulttest.StripeRequest(context.Background(), svc.URL(), ev.JSON(), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			answer := faulttest.Do(provider, req)
			delivered := time.Since(start)

			probe := &http.Client{Timeout: 20 * time.Second}
			start = time.Now()
			ready := 0
			if resp, err := probe.Get("http://" + metricsAddr + "/readyz"); err == nil {
				ready = resp.StatusCode
				resp.Body.Close()
			}
			readyIn := time.Since(start)
			// The public listener too, from a third address: a figure only
			// (the manifests probe METRICS_ADDR).
			start = time.Now()
			healthy := 0
			if resp, err := clientFrom("127.0.0.3").Get(svc.URL() + "/healthz"); err == nil {
				healthy = resp.StatusCode
				resp.Body.Close()
			}
			healthyIn := time.Since(start)

			counts := flood.stop()
			warns := warnLines(t, svc, logStart)
			refused := scrapeSum(t, metricsAddr, "webhook_connections_refused_total")
			cut := scrapeSum(t, metricsAddr, "webhook_rejections_total", "reason", "body_timeout")
			figure(t, "%d connections trickling a byte a second from one address, MAX_CONNECTIONS=%d, share %d: "+
				"a signed delivery from another address %d in %v; /readyz on METRICS_ADDR %d in %v, /healthz on the public listener %d in %v; "+
				"flood answers %v; %v connections refused, %v bodies cut (408); %d WARN lines in the service log",
				conns, maxConns, share, answer.Status, delivered.Round(time.Millisecond), ready, readyIn.Round(time.Millisecond), healthy, healthyIn.Round(time.Millisecond),
				counts, refused, cut, warns)
			if answer.Status != http.StatusOK {
				t.Errorf("the signed delivery during the flood: %v, want 200", answer)
			}
			if ready != http.StatusOK {
				t.Errorf("/readyz on METRICS_ADDR during the flood: %d, want 200", ready)
			}
			if got := r.count(`SELECT count(*) FROM entitlements WHERE stripe_subscription_id = $1`, ev.SubscriptionID); got != 1 {
				t.Errorf("entitlement rows for the delivery: %d, want 1", got)
			}
			if refused+cut == 0 {
				t.Errorf("neither a refused connection nor a cut body: the flood was never turned away")
			}
			// Sampled: some tens of lines, however long the flood.
			if warns > 60 {
				t.Errorf("%d WARN lines during the flood, want them sampled (at most some tens)", warns)
			}
		})
	}
}

// flood is a client holding many connections, each sending a request
// that announces a 1,000-byte body and then trickles it a byte a second;
// a connection the service ends is opened again after a short pause.
type flood struct {
	stopped atomic.Bool
	wg      sync.WaitGroup

	mu      sync.Mutex
	answers map[string]int // by status, or "closed" for none
	open    []net.Conn
}

func trickle(t *testing.T, addr, from string, n int) *flood {
	t.Helper()
	f := &flood{answers: map[string]int{}}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	for range n {
		f.wg.Go(func() {
			for !f.stopped.Load() {
				f.hold(d, addr)
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	t.Cleanup(func() { f.stop() })
	return f
}

// hold opens one connection and trickles its body until the service
// answers or closes it, or the flood stops.
func (f *flood) hold(d net.Dialer, addr string) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return
	}
	f.mu.Lock()
	if f.stopped.Load() {
		f.mu.Unlock()
		c.Close()
		return
	}
	f.open = append(f.open, c)
	f.mu.Unlock()
	answered := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- "closed"
			return
		}
		resp.Body.Close()
		answered <- strconv.Itoa(resp.StatusCode)
	}()
	head := fmt.Sprintf("POST /webhooks/stripe HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", addr)
	_, err = io.WriteString(c, head)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var got string
	for err == nil && got == "" {
		select {
		case got = <-answered:
		case <-tick.C:
			_, err = c.Write([]byte{'{'})
		}
	}
	c.Close()
	if got == "" {
		got = <-answered
	}
	f.mu.Lock()
	f.answers[got]++
	f.mu.Unlock()
}

// stop ends the flood, closing every connection, and returns the answers
// it got by status.
func (f *flood) stop() map[string]int {
	if !f.stopped.Swap(true) {
		f.mu.Lock()
		for _, c := range f.open {
			c.Close()
		}
		f.mu.Unlock()
	}
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.answers
}

// clientFrom is a provider's client whose connections come from the
// loopback address from. It gives up after 20 s, a third of the test's
// BODY_READ_TIMEOUT: an answer must come while the flood holds its
// connections, not once their bodies time out (57 s on the build before).
func clientFrom(from string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 20 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

func logSize(t *testing.T, svc *faulttest.Service) int64 {
	t.Helper()
	fi, err := os.Stat(svc.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// warnLines counts the WARN lines of the service's log after offset.
func warnLines(t *testing.T, svc *faulttest.Service, offset int64) int {
	t.Helper()
	b, err := os.ReadFile(svc.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b[min(offset, int64(len(b))):], []byte(`"level":"WARN"`))
}

// scrapeSum reads a metric's samples matching match from the metrics
// listener at addr, added up.
func scrapeSum(t *testing.T, addr, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, err := faulttest.ParseMetrics(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m.Sum(name, match...)
}
