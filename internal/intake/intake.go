// Package intake reads request bodies for every route that takes one (both
// webhooks and the support form): in pooled chunks, under a deadline of
// their own, and within one memory budget that counts every body byte held.
package intake

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrTimeout: the body did not arrive within the body deadline (408).
	// A slow client, not a forgery.
	ErrTimeout = errors.New("body not received in time")
	// ErrBudget: bodies being read hold the budget this body would need
	// (503 + Retry-After; both providers retry).
	ErrBudget = errors.New("body budget spent")
)

// DefaultMinRateGrace is how long a body may arrive at any pace before
// the minimum rate applies: a provider's event or a form post arrives in
// one or two packets, well within it, on any link that can load a page.
const DefaultMinRateGrace = 2 * time.Second

// RetryAfter is how long a body refused for want of budget should wait:
// the bodies holding it finish or time out within BODY_READ_TIMEOUT.
const RetryAfter = 5 * time.Second

// Bodies are read in chunks taken from a pool, so a request costs what it
// has actually sent (rounded up to one chunk), never what it announced, and
// never the doubling of a growing buffer: bytes.Buffer.ReadFrom held 2 MiB
// of backing array for a 1 MiB body, and the 1 MiB it outgrew until the
// next collection. A typical event (3-8 KiB for Stripe, less for Resend)
// fits one chunk and is used in place; a larger body is copied once. Each
// body being read holds at least a chunk, so its size is paid per
// connection: 16 KiB chunks were 1 MiB of live heap at 64 in flight (heap
// profile under make bench), which the collector doubles into its heap
// goal.
const ChunkSize = 8 << 10

// chunkPool and bodyPool are the package's only state besides sentinels: a
// sync.Pool is safe for concurrent use and holds nothing that outlives a
// request.
var (
	chunkPool = sync.Pool{New: func() any { return new([ChunkSize]byte) }}
	bodyPool  = sync.Pool{New: func() any { return new(Body) }}
)

// Config configures an Intake. The zero Config reads bodies with no
// deadline or budget of their own.
type Config struct {
	// Timeout is the longest a body may take to arrive (BODY_READ_TIMEOUT);
	// 0: no deadline of its own (the server's ReadTimeout still holds).
	Timeout time.Duration
	// MinRate is the slowest, in bytes a second on average since the body
	// began, that a body may arrive once MinRateGrace has passed
	// (BODY_MIN_RATE); slower, it is cut as if its deadline had passed
	// (ErrTimeout). 0: no minimum.
	MinRate int64
	// MinRateGrace is how long a body may take before MinRate applies;
	// 0: DefaultMinRateGrace.
	MinRateGrace time.Duration
	// Budget is the bytes all bodies being read may hold at once
	// (MAX_INFLIGHT_BODY_BYTES), every byte counted; 0: no budget.
	Budget int64
	// MaxConnections is how many connections the server holds at once
	// (MAX_CONNECTIONS): it sizes the reserve kept for first chunks.
	// 0: the reserve is half the budget.
	MaxConnections int
}

// Intake reads bodies within one budget. Every chunk a body holds is drawn
// from it, the first one too, so the bodies of any number of connections
// hold at most Budget bytes.
//
// Counting every byte alone would let a few large bodies spend the budget
// and starve a small signed delivery, which must still be answered. So
// the budget has a reserve that only a body's first chunk may draw on:
// the chunks after it (a body over 8 KiB growing) are refused once taking
// one would leave less than the reserve free. A server holds at most
// MaxConnections connections, each reading at most one body (HTTP/1.1), so
// a reserve of MaxConnections chunks means a first chunk always finds
// room: a delivery that fits one chunk (a typical event) is never refused
// for want of budget, however the rest is spent. The reserve is at most
// half the budget, so a body of up to half the budget is always read once
// the budget is free (hence MAX_INFLIGHT_BODY_BYTES of at least twice the
// webhooks' 1 MiB cap); with more connections than a capped reserve
// covers, first chunks may be refused too (503), but the memory bound
// holds either way.
type Intake struct {
	timeout time.Duration
	minRate int64
	grace   time.Duration
	budget  int64
	// reserve is the part of the budget only first chunks may use.
	reserve int64
	inUse   atomic.Int64
}

// New returns an Intake configured by cfg.
func New(cfg Config) *Intake {
	in := &Intake{timeout: cfg.Timeout, minRate: cfg.MinRate, grace: cfg.MinRateGrace, budget: cfg.Budget}
	if in.grace <= 0 {
		in.grace = DefaultMinRateGrace
	}
	in.reserve = cfg.Budget / 2
	if cfg.MaxConnections > 0 {
		in.reserve = min(in.reserve, int64(cfg.MaxConnections)*ChunkSize)
	}
	return in
}

// InUse is the bytes bodies being read hold now.
func (in *Intake) InUse() int64 { return in.inUse.Load() }

// Reserve is the part of the budget kept for bodies' first chunks.
func (in *Intake) Reserve() int64 { return in.reserve }

// take draws a chunk from the budget, if taking it leaves at least keep
// bytes free; it reports whether it did.
func (in *Intake) take(keep int64) bool {
	for {
		used := in.inUse.Load()
		if used+ChunkSize > in.budget-keep {
			return false
		}
		if in.inUse.CompareAndSwap(used, used+ChunkSize) {
			return true
		}
	}
}

// Body is one request body: chunks while it is read, then data, the whole
// body, which is the one chunk itself or a copy of all of them.
type Body struct {
	in     *Intake
	chunks []*[ChunkSize]byte
	data   []byte
	held   int64 // drawn from the budget; given back by Release
}

// Bytes is the whole body, valid until Release.
func (b *Body) Bytes() []byte { return b.data }

// Read reads r's body, at most limit bytes (over it, an
// *http.MaxBytesError), within the body deadline (ErrTimeout) and the
// budget (ErrBudget). The caller checks the content type first, and calls
// Release once it no longer uses the body's bytes.
func (in *Intake) Read(w http.ResponseWriter, r *http.Request, limit int64) (*Body, error) {
	// The server's ReadTimeout spans headers and body and is long; a body
	// trickled in a byte at a time must not hold its memory, or its
	// connection, that long. A writer without a connection (a test
	// recorder) cannot set a deadline and needs none.
	dl := deadlines{in: in, w: w, start: time.Now()}
	if err := dl.set(0); err != nil {
		return nil, fmt.Errorf("set body deadline: %w", err)
	}
	b := bodyPool.Get().(*Body)
	b.in = in
	src := http.MaxBytesReader(w, r.Body, limit)
	var n int
	var free []byte // the unread tail of the last chunk
	for {
		if len(free) == 0 {
			if len(b.chunks) > 0 && r.ContentLength >= 0 && int64(n) >= r.ContentLength {
				// The server's body ends at its Content-Length: a body
				// that fills its chunks exactly needs no chunk more just
				// to read the end.
				break
			}
			if err := b.grow(); err != nil {
				b.Release()
				// The server would read what is left of a refused body (up
				// to 256 KiB) before answering, to reuse the connection: a
				// stalled client would hold the answer and the connection
				// until the body deadline. A deadline that has passed makes
				// that read fail at once, and the connection close.
				_ = http.NewResponseController(w).SetReadDeadline(time.Now())
				return nil, err
			}
			free = b.chunks[len(b.chunks)-1][:]
		}
		m, err := src.Read(free)
		free, n = free[m:], n+m
		if err == io.EOF {
			break
		}
		if err == nil && m > 0 && (r.ContentLength < 0 || int64(n) < r.ContentLength) {
			// More to come: the minimum rate moves the deadline on.
			err = dl.set(n)
		}
		if err != nil {
			b.Release()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = dl.exceeded(n, err)
			}
			return nil, err
		}
	}
	b.join(n)
	return b, nil
}

// deadlines is one body's read deadline: BODY_READ_TIMEOUT after the body
// began, or sooner while the body arrives under the minimum rate, which
// moves the deadline on as bytes arrive: a body holding n bytes must have
// more by grace + n/minRate after it began.
type deadlines struct {
	in    *Intake
	w     http.ResponseWriter
	start time.Time
	at    time.Time // the deadline set, zero for none
	rated bool      // at is the minimum rate's, not the timeout's
}

// set moves the deadline for a body holding n bytes, if it changes.
func (d *deadlines) set(n int) error {
	var at time.Time
	rated := false
	if d.in.timeout > 0 {
		at = d.start.Add(d.in.timeout)
	}
	if d.in.minRate > 0 {
		byRate := d.start.Add(d.in.grace + time.Duration(float64(n)/float64(d.in.minRate)*float64(time.Second)))
		if at.IsZero() || byRate.Before(at) {
			at, rated = byRate, true
		}
	}
	if at.Equal(d.at) {
		return nil
	}
	d.at, d.rated = at, rated
	err := http.NewResponseController(d.w).SetReadDeadline(at)
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}

// exceeded is the error of a body whose deadline passed with n bytes read.
func (d *deadlines) exceeded(n int, err error) error {
	if d.rated {
		return fmt.Errorf("%w: %d bytes in %s, under %d bytes a second: %w",
			ErrTimeout, n, time.Since(d.start).Round(time.Millisecond), d.in.minRate, err)
	}
	return fmt.Errorf("%w after %s: %w", ErrTimeout, d.in.timeout, err)
}

// grow adds a chunk drawn from the budget: the first from all of it, the
// others only while the reserve stays free.
func (b *Body) grow() error {
	if b.in.budget > 0 {
		keep := b.in.reserve
		if len(b.chunks) == 0 {
			keep = 0
		}
		if !b.in.take(keep) {
			return ErrBudget
		}
		b.held += ChunkSize
	}
	b.chunks = append(b.chunks, chunkPool.Get().(*[ChunkSize]byte))
	return nil
}

// join makes the first n bytes of the chunks one slice. A body of one chunk
// is used in place; a longer one is copied once and its chunks go back to
// the pool (the budget it drew stays held until Release, as the copy is as
// large).
func (b *Body) join(n int) {
	if n <= ChunkSize {
		b.data = b.chunks[0][:n]
		return
	}
	b.data = make([]byte, 0, n)
	for _, c := range b.chunks {
		b.data = append(b.data, c[:min(ChunkSize, n-len(b.data))]...)
	}
	b.putChunks()
}

func (b *Body) putChunks() {
	for i, c := range b.chunks {
		chunkPool.Put(c)
		b.chunks[i] = nil
	}
	b.chunks = b.chunks[:0]
}

// Release gives back the chunks and the budget; nothing may use the body's
// bytes after.
func (b *Body) Release() {
	b.putChunks()
	if b.held > 0 {
		b.in.inUse.Add(-b.held)
	}
	*b = Body{chunks: b.chunks}
	bodyPool.Put(b)
}
