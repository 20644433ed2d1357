package intake

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A body trickled under the minimum rate is cut once the grace has passed,
// long before BODY_READ_TIMEOUT, while one that arrives at a modest pace
// over longer than the grace is read whole.
func TestMinRate(t *testing.T) {
	t.Parallel()
	in := New(Config{Timeout: time.Minute, MinRate: 100, MinRateGrace: 300 * time.Millisecond, Budget: 1 << 20})
	type result struct {
		n   int
		err error
	}
	results := make(chan result, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := in.Read(w, r, 1<<20)
		res := result{err: err}
		if err == nil {
			res.n = len(b.Bytes())
			b.Release()
		}
		results <- res
	}))
	t.Cleanup(srv.Close)

	// send posts a 1,000-byte body in pieces of piece bytes, every
	// interval, until the service stops reading.
	send := func(piece int, interval time.Duration) (result, time.Duration) {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
		done := make(chan struct{})
		go func() {
			defer close(done)
			for sent := 0; sent < 1000; sent += piece {
				if _, err := c.Write([]byte(strings.Repeat("a", piece))); err != nil {
					return
				}
				time.Sleep(interval)
			}
		}()
		select {
		case res := <-results:
			took := time.Since(start)
			_, _ = http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
			<-done
			return res, took
		case <-time.After(30 * time.Second):
			t.Fatal("no result in 30 s")
			return result{}, 0
		}
	}

	// 10 bytes a second, a tenth of the minimum.
	res, took := send(1, 100*time.Millisecond)
	if !errors.Is(res.err, ErrTimeout) || !strings.Contains(res.err.Error(), "under 100 bytes a second") {
		t.Errorf("a body at 10 bytes a second: %v, want ErrTimeout for the minimum rate", res.err)
	}
	if took > 20*time.Second {
		t.Errorf("a body at 10 bytes a second cut after %v, want it cut by the rate, not the 1 min timeout", took)
	}
	// About 2,000 bytes a second, over about half a second.
	res, _ = send(100, 50*time.Millisecond)
	if res.err != nil || res.n != 1000 {
		t.Errorf("a body at 2,000 bytes a second: %d bytes, %v; want 1000, nil", res.n, res.err)
	}
}
