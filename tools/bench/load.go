package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator is a minimal HTTP/1.1 keep-alive client: each worker
// owns one connection, writes a pre-rendered request and reads the answer's
// status line, headers and Content-Length body. It costs far less CPU per
// request than net/http's client, which matters on a machine where the
// generator shares two cores with everything it measures (wrk is no
// cheaper, and would be one more binary to install).

// feed hands out requests: the next pre-generated one, or the same one over
// and over.
type feed struct {
	reqs  [][]byte
	cycle bool
	next  atomic.Int64
}

func newFeed(reqs [][]byte, cycle bool) *feed { return &feed{reqs: reqs, cycle: cycle} }

func (f *feed) take() ([]byte, bool) {
	i := int(f.next.Add(1) - 1)
	if f.cycle {
		return f.reqs[i%len(f.reqs)], true
	}
	if i >= len(f.reqs) {
		return nil, false
	}
	return f.reqs[i], true
}

// client is one keep-alive connection.
type client struct {
	addr string
	conn net.Conn
	r    *bufio.Reader
}

func (c *client) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// do sends req and returns the answer's status code.
func (c *client) do(req []byte) (int, error) {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return 0, err
		}
		c.conn = conn
		if c.r == nil {
			c.r = bufio.NewReaderSize(conn, 4096)
		} else {
			c.r.Reset(conn)
		}
	}
	if err := c.conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		c.close()
		return 0, err
	}
	if _, err := c.conn.Write(req); err != nil {
		c.close()
		return 0, err
	}
	status, keep, err := readResponse(c.r)
	if err != nil || !keep {
		c.close()
	}
	return status, err
}

var (
	hdrContentLength = []byte("content-length:")
	hdrConnection    = []byte("connection:")
)

// readResponse reads one response; keep reports whether the connection
// may be reused.
func readResponse(r *bufio.Reader) (status int, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	length, keep := -1, true
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return status, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		switch {
		case hasPrefixFold(line, hdrContentLength):
			length, err = strconv.Atoi(string(bytes.TrimSpace(line[len(hdrContentLength):])))
			if err != nil {
				return status, false, fmt.Errorf("bad Content-Length %q", line)
			}
		case hasPrefixFold(line, hdrConnection):
			keep = !bytes.EqualFold(bytes.TrimSpace(line[len(hdrConnection):]), []byte("close"))
		}
	}
	if length < 0 {
		return status, false, errors.New("answer without Content-Length")
	}
	if _, err := r.Discard(length); err != nil {
		return status, false, err
	}
	return status, keep, nil
}

func hasPrefixFold(s, prefix []byte) bool {
	return len(s) >= len(prefix) && bytes.EqualFold(s[:len(prefix)], prefix)
}

// loadResult is what one load run saw.
type loadResult struct {
	requests int
	elapsed  time.Duration
	statuses map[int]int
	errors   int
	firstErr error
	lat      []time.Duration // sorted
}

func (r loadResult) throughput() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.requests) / r.elapsed.Seconds()
}

// percentile returns the q-quantile (0 < q <= 1) of the latencies.
func (r loadResult) percentile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(float64(len(r.lat))*q+0.5) - 1
	return r.lat[min(max(i, 0), len(r.lat)-1)]
}

// unexpected counts answers other than want, and transport errors.
func (r loadResult) unexpected(want int) int {
	n := r.errors
	for code, c := range r.statuses {
		if code != want {
			n += c
		}
	}
	return n
}

// worker tallies one goroutine's share, merged at the end.
type worker struct {
	client   client
	lat      []time.Duration
	statuses map[int]int
	errors   int
	firstErr error
}

func (w *worker) record(status int, err error, lat time.Duration) {
	if err != nil {
		w.errors++
		if w.firstErr == nil {
			w.firstErr = err
		}
		return
	}
	w.statuses[status]++
	w.lat = append(w.lat, lat)
}

func merge(workers []*worker, elapsed time.Duration) loadResult {
	res := loadResult{elapsed: elapsed, statuses: map[int]int{}}
	for _, w := range workers {
		w.client.close()
		res.lat = append(res.lat, w.lat...)
		for code, n := range w.statuses {
			res.statuses[code] += n
			res.requests += n
		}
		res.errors += w.errors
		res.requests += w.errors
		if res.firstErr == nil {
			res.firstErr = w.firstErr
		}
	}
	slices.Sort(res.lat)
	return res
}

// saturate runs conc closed-loop workers against addr for d, or until the
// feed runs dry: the throughput the target sustains at that concurrency.
func saturate(ctx context.Context, addr string, f *feed, conc int, d time.Duration) loadResult {
	workers := make([]*worker, conc)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{client: client{addr: addr}, statuses: map[int]int{}, lat: make([]time.Duration, 0, 4096)}
		workers[i] = w
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				req, ok := f.take()
				if !ok {
					return
				}
				status, err := w.client.do(req)
				w.record(status, err, time.Since(t0))
			}
		})
	}
	wg.Wait()
	return merge(workers, time.Since(start))
}

// fixedRate sends rate requests a second for d, spread evenly, on up to
// conns connections. A request's latency runs from the moment the schedule
// released it to the end of its answer: a request that waits for a free
// connection counts that wait, so a stall shows in full (no coordinated
// omission). It is not measured from the ideal send time, because Go's
// timers sleep in whole milliseconds of epoll_wait and the release slips by
// up to a millisecond; the schedule catches up, so the rate holds.
func fixedRate(ctx context.Context, addr string, f *feed, conns, rate int, d time.Duration) loadResult {
	n := int(d.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	released := make(chan time.Time, n)
	workers := make([]*worker, conns)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{client: client{addr: addr}, statuses: map[int]int{}, lat: make([]time.Duration, 0, n/conns+64)}
		workers[i] = w
		wg.Go(func() {
			for t := range released {
				req, ok := f.take()
				if !ok {
					return
				}
				status, err := w.client.do(req)
				w.record(status, err, time.Since(t))
			}
		})
	}
	start := time.Now().Add(5 * time.Millisecond)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		due := start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		released <- time.Now()
	}
	close(released)
	wg.Wait()
	return merge(workers, time.Since(start))
}
