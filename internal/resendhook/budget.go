package resendhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

// Anyone can mail support, and Resend delivers mail concurrently: the
// caps on one mail (its answer, its attachment list, each download) say
// nothing of forty at once. The budget bounds their sum: every byte a
// mail delivery or a sweep holds of the API's answers, attachment lists
// and downloads, in memory or in a temporary file, is drawn from one
// MAIL_INFLIGHT_BYTES budget before it is held.
const (
	// budgetWait is the longest one delivery waits, in all, for its
	// share; then it gives up with claim.ErrBusy (503 + Retry-After, the
	// claim given back, nothing stored) and the provider retries.
	budgetWait = 5 * time.Second
	// answerShare is the most one email's answer costs while it is read
	// at the caps (answer.go): each part kept (2 MiB) and the buffer it
	// was decoded in, the other fields as raw JSON and decoded, the read
	// buffer. A smaller answer draws twice the bytes read, as they arrive.
	answerShare = 2*(2*maxPartBytes+maxPartBytes/2) + 2*(maxFieldsBytes+6*maxDecisionBytes) + 64<<10
)

// MinMailInflightBytes is the smallest budget in which one mail at the
// caps can be read alone: its answer, a page of its attachment list and
// one attachment of attachmentMax bytes.
func MinMailInflightBytes(attachmentMax int64) int64 {
	return answerShare + attachmentPageShare + attachmentMax + inMemoryBytes
}

// errOverBudget is a share larger than what the budget can ever give one
// delivery: waiting would not help.
var errOverBudget = errors.New("more than the whole mail budget")

// mailBudget is the one budget for all mail in flight.
//
// Mail draws its bytes as it goes (an answer as it streams, a download as
// it arrives), so two mails that each hold part of the budget and wait for
// more would wait on each other. The budget breaks that as databases do
// ("wait-die" by age): the oldest hold that holds bytes may wait, on its
// delivery's deadline, and is served first; any younger hold that holds
// bytes and cannot draw at once gives up (claim.ErrBusy, 503), giving its
// bytes back. A hold that holds nothing yet (a mail arriving) waits up to
// budgetWait, behind them. So the oldest mail always finishes, and every
// other either finishes or is retried by its provider.
type mailBudget struct {
	size int64
	wait time.Duration

	mu      sync.Mutex
	used    int64
	seq     uint64
	holders map[*hold]bool // holds with bytes
	waiters []*waiter      // by priority: holders by age, then arrivals
	// inUse mirrors used, for the gauge, without the lock.
	inUse atomic.Int64
	busy  prometheus.Counter
	gauge prometheus.GaugeFunc
}

// waiter is a draw waiting for the budget; ready receives nil when it is
// granted, claim.ErrBusy when an older hold needs its room.
type waiter struct {
	h     *hold
	n     int64
	ready chan error
}

// newMailBudget returns a budget of size bytes; 0 means none (every draw
// succeeds at once).
func newMailBudget(size int64) *mailBudget {
	b := &mailBudget{size: size, wait: budgetWait, holders: map[*hold]bool{}}
	b.busy = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "support_mail_busy_total",
		Help: "Mail deliveries and sweep pages turned away (503 + Retry-After) because the mail in flight held MAIL_INFLIGHT_BYTES.",
	})
	b.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "support_mail_inflight_bytes",
		Help: "Bytes of inbound mail (API answers, attachment lists, downloads in memory and on disk) held now, out of MAIL_INFLIGHT_BYTES.",
	}, func() float64 { return float64(b.inUse.Load()) })
	return b
}

// hold is what one delivery (or one sweep page) holds of the budget. A
// hold is used by one goroutine at a time.
type hold struct {
	b   *mailBudget
	n   int64
	age uint64 // lower is older
	// waited is how long this hold has waited as an arrival so far.
	waited time.Duration
}

func (b *mailBudget) hold() *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	return &hold{b: b, age: b.seq}
}

// before reports whether w is served before v: holders by age, then
// arrivals by age.
func (w *waiter) before(v *waiter) bool {
	if (w.h.n > 0) != (v.h.n > 0) {
		return w.h.n > 0
	}
	return w.h.age < v.h.age
}

// oldest reports whether h is the oldest hold that holds bytes.
func (b *mailBudget) oldest(h *hold) bool {
	for o := range b.holders {
		if o.age < h.age {
			return false
		}
	}
	return true
}

// take gives h n bytes; b.mu is held.
func (b *mailBudget) take(h *hold, n int64) {
	h.n += n
	b.used += n
	b.inUse.Store(b.used)
	b.holders[h] = true
}

// serve grants waiters in priority order while the first one fits; b.mu
// is held.
func (b *mailBudget) serve() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.size {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.take(w.h, w.n)
		w.ready <- nil
	}
}

// grow draws n more bytes, waiting as the rules above say; claim.ErrBusy
// when it may not wait, or waited as long as it may. A share the budget
// could never give (the hold would pass all of it) is errOverBudget.
func (h *hold) grow(ctx context.Context, n int64) error {
	b := h.b
	if b.size <= 0 || n <= 0 {
		return nil
	}
	if h.n+n > b.size {
		return fmt.Errorf("%w: %d bytes held, %d more wanted, budget %d", errOverBudget, h.n, n, b.size)
	}
	w := &waiter{h: h, n: n, ready: make(chan error, 1)}
	b.mu.Lock()
	if (len(b.waiters) == 0 || w.before(b.waiters[0])) && b.used+n <= b.size {
		b.take(h, n)
		b.mu.Unlock()
		return nil
	}
	holder := h.n > 0
	if holder && !b.oldest(h) {
		b.mu.Unlock()
		return h.busy("an older mail needs the room")
	}
	if holder {
		// The oldest holder: younger holders waiting give way.
		kept := b.waiters[:0]
		for _, v := range b.waiters {
			if v.h.n > 0 {
				v.ready <- claim.ErrBusy
				continue
			}
			kept = append(kept, v)
		}
		b.waiters = kept
	}
	i := 0
	for i < len(b.waiters) && b.waiters[i].before(w) {
		i++
	}
	b.waiters = append(b.waiters[:i], append([]*waiter{w}, b.waiters[i:]...)...)
	b.serve()
	b.mu.Unlock()

	var timeout <-chan time.Time
	if !holder {
		t := time.NewTimer(max(b.wait-h.waited, 0))
		defer t.Stop()
		timeout = t.C
	}
	start := time.Now()
	var err error
	select {
	case err = <-w.ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = claim.ErrBusy
	}
	if !holder {
		h.waited += time.Since(start)
	}
	if err != nil {
		b.mu.Lock()
		removed := false
		for i, v := range b.waiters {
			if v == w {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				removed = true
				break
			}
		}
		b.serve()
		b.mu.Unlock()
		if !removed && len(w.ready) > 0 && <-w.ready == nil {
			return nil // granted as it gave up: keep it, the caller goes on
		}
	}
	if errors.Is(err, claim.ErrBusy) {
		return h.busy("waited " + b.wait.String())
	}
	return err
}

// busy counts a draw turned away and says why.
func (h *hold) busy(why string) error {
	h.b.busy.Inc()
	return fmt.Errorf("mail budget of %d bytes held by other mail (%s): %w", h.b.size, why, claim.ErrBusy)
}

// shrink gives back what the hold has over to bytes.
func (h *hold) shrink(to int64) {
	b := h.b
	to = max(to, 0)
	if b.size <= 0 || to >= h.n {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= h.n - to
	h.n = to
	b.inUse.Store(b.used)
	if h.n == 0 {
		delete(b.holders, h)
	}
	b.serve()
}

// release gives back the whole hold.
func (h *hold) release() { h.shrink(0) }

// meteredReader draws from a hold, before each read, factor times the
// bytes it may read, until limit bytes are drawn: what a stream costs
// grows with what it delivers up to its caps, and no further.
type meteredReader struct {
	ctx    context.Context
	r      io.Reader
	h      *hold
	factor int64
	limit  int64
	drawn  int64
}

func (m *meteredReader) Read(p []byte) (int, error) {
	if left := m.limit - m.drawn; left > 0 {
		want := min(int64(len(p))*m.factor, left)
		if err := m.h.grow(m.ctx, want); err != nil {
			return 0, err
		}
		m.drawn += want
	}
	return m.r.Read(p)
}

// meteredWriter draws from a hold each byte written before writing it: a
// download's content, in memory or in a file.
type meteredWriter struct {
	ctx context.Context
	w   io.Writer
	h   *hold
}

func (m meteredWriter) Write(p []byte) (int, error) {
	if err := m.h.grow(m.ctx, int64(len(p))); err != nil {
		return 0, err
	}
	return m.w.Write(p)
}
