package main

import (
	"bufio"
	"bytes"
	"cmp"
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
		c.conn, c.r = conn, bufio.NewReaderSize(conn, 4096)
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
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, fmt.Errorf("bad status line %q", line)
	}
	length, keep := -1, true
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return status, false, err
		}
		name, value, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(":"))
		if len(name) == 0 {
			break
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return status, false, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Connection")):
			keep = !bytes.EqualFold(value, []byte("close"))
		}
	}
	if length < 0 {
		return status, false, errors.New("answer without Content-Length")
	}
	_, err = r.Discard(length)
	return status, keep && err == nil, err
}

// result is what one load run measured, or the sum of the slices of the
// same load in interleaved rounds: the load generator's view, and the
// counters the harness read before and after.
type result struct {
	requests int
	elapsed  time.Duration
	statuses map[int]int // 0 counts transport errors
	firstErr error
	lat      []time.Duration // sorted by sort
	c        counters
	relay    relayRun // with -app-webhook, on the service that sends it
}

// relayRun is what the relay did for a run: the webhooks it sent for the
// run's requests, how many of them after the load, and what that catch-up
// cost (counters over the catch-up alone).
type relayRun struct {
	sent, caughtUp int
	catchUp        counters
}

func (r *result) record(status int, err error, lat time.Duration) {
	r.requests++
	if err != nil {
		r.statuses[0]++
		r.firstErr = cmp.Or(r.firstErr, err)
		return
	}
	r.statuses[status]++
	r.lat = append(r.lat, lat)
}

// add folds q, another share of the same load, into r; sort sorts the
// latencies once every share is in.
func (r *result) add(q result) {
	if r.statuses == nil {
		r.statuses, r.c = map[int]int{}, counters{}
	}
	r.requests += q.requests
	r.elapsed += q.elapsed
	r.firstErr = cmp.Or(r.firstErr, q.firstErr)
	for code, n := range q.statuses {
		r.statuses[code] += n
	}
	r.lat = append(r.lat, q.lat...)
	for k, v := range q.c {
		r.c[k] += v
	}
	if r.relay.catchUp == nil {
		r.relay.catchUp = counters{}
	}
	r.relay.sent += q.relay.sent
	r.relay.caughtUp += q.relay.caughtUp
	for k, v := range q.relay.catchUp {
		r.relay.catchUp[k] += v
	}
}

func (r *result) sort() { slices.Sort(r.lat) }

// per is counter key per request.
func (r *result) per(key string) float64 { return r.c[key] / float64(max(r.requests, 1)) }

func (r *result) throughput() float64 {
	return float64(r.requests) / max(r.elapsed.Seconds(), 1e-9)
}

// percentile returns the q-quantile (0 < q <= 1) of the latencies.
func (r *result) percentile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(float64(len(r.lat))*q+0.5) - 1
	return r.lat[min(max(i, 0), len(r.lat)-1)]
}

// drive runs conns workers against addr, each on its own connection, until
// next tells it to stop. next blocks until the worker may send, and returns
// the moment its request's latency counts from.
func drive(addr string, f *feed, conns, latCap int, next func() (time.Time, bool)) result {
	res := make([]result, conns)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range res {
		res[i] = result{statuses: map[int]int{}, lat: make([]time.Duration, 0, latCap)}
		wg.Go(func() {
			c := client{addr: addr}
			defer c.close()
			for t, ok := next(); ok; t, ok = next() {
				req, ok := f.take()
				if !ok {
					return
				}
				status, err := c.do(req)
				res[i].record(status, err, time.Since(t))
			}
		})
	}
	wg.Wait()
	var total result
	for _, r := range res {
		total.add(r)
	}
	total.elapsed = time.Since(start)
	total.sort()
	return total
}

// saturate runs conc closed-loop workers against addr for d, or until the
// feed runs dry: the throughput the target sustains at that concurrency.
func saturate(ctx context.Context, addr string, f *feed, conc int, d time.Duration) result {
	deadline := time.Now().Add(d)
	return drive(addr, f, conc, 4096, func() (time.Time, bool) {
		now := time.Now()
		return now, now.Before(deadline) && ctx.Err() == nil
	})
}

// fixedRate sends rate requests a second for d, spread evenly, on up to
// conns connections. A request's latency runs from the moment the schedule
// released it to the end of its answer: a request that waits for a free
// connection counts that wait, so a stall shows in full (no coordinated
// omission). It is not measured from the ideal send time, because Go's
// timers sleep in whole milliseconds of epoll_wait and the release slips by
// up to a millisecond; the schedule catches up, so the rate holds.
func fixedRate(ctx context.Context, addr string, f *feed, conns, rate int, d time.Duration) result {
	n := int(d.Seconds() * float64(rate))
	released := make(chan time.Time, n)
	done := make(chan result)
	go func() {
		done <- drive(addr, f, conns, n/conns+64, func() (time.Time, bool) {
			t, ok := <-released
			return t, ok
		})
	}()
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		released <- time.Now()
	}
	close(released)
	return <-done
}
