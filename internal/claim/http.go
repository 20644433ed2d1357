package claim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Decode verifies a delivery's raw body against its headers and decodes the
// event. It runs before any claim: its error is a rejection (400, no claim,
// no effect), and should wrap the sentinel that names why.
type Decode func(h http.Header, body []byte) (Event, error)

// Why a delivery is rejected before the claim, each spelled as its
// webhook_rejections_total reason.
var (
	// ErrSignature: the signature is missing, malformed or wrong.
	ErrSignature = errors.New("signature")
	// ErrTimestamp: the signed timestamp is outside the tolerance.
	ErrTimestamp = errors.New("timestamp")
	// ErrMalformed: verified, but not an event this service can read, or
	// one that lacks what its effect needs.
	ErrMalformed = errors.New("malformed")
	// ErrInvalidID: the event id is empty, longer than MaxIDLen bytes, or
	// has bytes outside printable ASCII.
	ErrInvalidID = errors.New("invalid_id")
	// ErrNotJSON rejects a webhook whose Content-Type is not JSON (415).
	// Both providers always send application/json.
	ErrNotJSON = errors.New("media_type")

	// errBodyTimeout: the body did not arrive within the body deadline
	// (408). A slow client, not a forgery: never counted as rejected.
	errBodyTimeout = errors.New("body_timeout")
	// errBodyBudget: bodies being read hold the whole in-flight budget
	// (503 + Retry-After; both providers retry).
	errBodyBudget = errors.New("body_budget")
)

const (
	reasonSignature    = "signature"
	reasonTimestamp    = "timestamp"
	reasonMalformed    = "malformed"
	reasonInvalidID    = "invalid_id"
	reasonMediaType    = "media_type"
	reasonBodyTooLarge = "body_too_large"
	reasonBodyTimeout  = "body_timeout"
	reasonBodyBudget   = "body_budget"
)

var rejectionReasons = []string{reasonSignature, reasonTimestamp, reasonMalformed, reasonInvalidID, reasonMediaType, reasonBodyTooLarge, reasonBodyTimeout, reasonBodyBudget}

// rejection names why err rejected a delivery.
func rejection(err error) string {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return reasonBodyTooLarge
	case errors.Is(err, ErrNotJSON):
		return reasonMediaType
	case errors.Is(err, ErrSignature):
		return reasonSignature
	case errors.Is(err, ErrTimestamp):
		return reasonTimestamp
	case errors.Is(err, ErrInvalidID):
		return reasonInvalidID
	case errors.Is(err, errBodyTimeout):
		return reasonBodyTimeout
	case errors.Is(err, errBodyBudget):
		return reasonBodyBudget
	}
	return reasonMalformed
}

// MaxBody is the largest webhook body accepted; larger ones get 413.
const MaxBody = 1 << 20

// MaxIDLen bounds an event id, which becomes part of a Redis key.
const MaxIDLen = 255

// Handler answers the provider's webhook deliveries: it reads the capped
// body, has decode verify and parse it, then claims, applies, confirms or
// releases, and answers. This is the one intake every provider shares.
//
// It returns the func itself, not an http.Handler, so that a provider can
// give it a type of its own by conversion, at no extra call per delivery.
func (e *Endpoint) Handler(decode Decode) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		b, err := e.flow.intake.read(w, r)
		if err != nil {
			e.answer(w, r, Event{}, verdict{outcome: Rejected, err: err}, start)
			return
		}
		// The buffer is reused once this delivery is answered: decode must
		// copy what it keeps, and the flow only fingerprints the bytes.
		defer b.recycle()
		ev, err := decode(r.Header, b.data)
		if err == nil {
			err = checkID(ev.ID)
		}
		var v verdict
		switch {
		case err != nil:
			v = verdict{outcome: Rejected, err: err}
		case ev.Apply == nil:
			v = verdict{outcome: Ignored}
		default:
			v = e.flow.run(r.Context(), e.provider, b.data, ev)
		}
		e.answer(w, r, ev, v, start)
	}
}

func (e *Endpoint) answer(w http.ResponseWriter, r *http.Request, ev Event, v verdict, start time.Time) {
	respond(w, v)
	e.record(r.Context(), ev, v, start)
}

// checkID refuses an id that would make an absurd Redis key, or one that
// fails every attempt further on (a NUL in it, say): a poison event by
// construction.
func checkID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return ErrInvalidID
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return ErrInvalidID
		}
	}
	return nil
}

// Bodies are read in chunks taken from a pool, so a request costs what it
// has actually sent (rounded up to one chunk), never what it announced, and
// never the doubling of a growing buffer: bytes.Buffer.ReadFrom held 2 MiB
// of backing array for a 1 MiB body, and the 1 MiB it outgrew until the
// next collection. A typical event (3-8 KiB for Stripe, less for Resend)
// fits one chunk and is decoded in place; a larger one is copied once. Each
// delivery in flight holds a chunk, so its size is paid per connection:
// 16 KiB chunks were 1 MiB of live heap at 64 in flight (heap profile under
// make bench), which the collector doubles into its heap goal.
const chunkSize = 8 << 10

// The first freeBodyBytes of every body are read outside the in-flight
// budget: a real delivery is a few KiB and must be served while large
// bodies hold all of it. Only what a body sends beyond them draws on it.
const freeBodyBytes = 64 << 10

// chunkPool and bodyPool are the package's only state besides sentinels: a
// sync.Pool is safe for concurrent use and holds nothing that outlives a
// request.
var (
	chunkPool = sync.Pool{New: func() any { return new([chunkSize]byte) }}
	bodyPool  = sync.Pool{New: func() any { return new(body) }}
)

// intake reads webhook bodies under their own deadline and a memory budget
// shared by every provider.
type intake struct {
	// timeout is the longest a body may take to arrive; 0: no deadline of
	// its own (the server's ReadTimeout still holds).
	timeout time.Duration
	// budget is the bytes bodies may hold beyond their free part at once;
	// 0: no budget.
	budget int64
	inUse  atomic.Int64
}

// take draws n bytes from the budget, or reports that they are not there.
func (in *intake) take(n int64) bool {
	for {
		used := in.inUse.Load()
		if used+n > in.budget {
			return false
		}
		if in.inUse.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// body is one request body: chunks while it is read, then data, the whole
// body, which is the one chunk itself or a copy of all of them.
type body struct {
	in     *intake
	chunks []*[chunkSize]byte
	data   []byte
	held   int64 // drawn from the budget; given back on recycle
}

// read reads r's body: JSON only, at most MaxBody bytes, within the body
// deadline and the budget. The body's data is valid until recycle.
func (in *intake) read(w http.ResponseWriter, r *http.Request) (*body, error) {
	if !isJSON(r.Header.Get("Content-Type")) {
		return nil, ErrNotJSON
	}
	if in.timeout > 0 {
		// The server's ReadTimeout spans headers and body and is long; a
		// body trickled in a byte at a time must not hold its memory that
		// long. A writer without a connection (a test recorder) cannot set
		// a deadline and needs none.
		err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(in.timeout))
		if err != nil && !errors.Is(err, http.ErrNotSupported) {
			return nil, fmt.Errorf("set body deadline: %w", err)
		}
	}
	b := bodyPool.Get().(*body)
	b.in = in
	src := http.MaxBytesReader(w, r.Body, MaxBody)
	var n int
	var free []byte // the unread tail of the last chunk
	for {
		if len(free) == 0 {
			if err := b.grow(); err != nil {
				b.recycle()
				return nil, err
			}
			free = b.chunks[len(b.chunks)-1][:]
		}
		m, err := src.Read(free)
		free, n = free[m:], n+m
		if err == io.EOF {
			break
		}
		if err != nil {
			b.recycle()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w after %s: %w", errBodyTimeout, in.timeout, err)
			}
			return nil, err
		}
	}
	b.join(n)
	return b, nil
}

// grow adds a chunk, drawing it from the budget once the body has used its
// free part.
func (b *body) grow() error {
	if b.in.budget > 0 && len(b.chunks)*chunkSize >= freeBodyBytes {
		if !b.in.take(chunkSize) {
			return errBodyBudget
		}
		b.held += chunkSize
	}
	b.chunks = append(b.chunks, chunkPool.Get().(*[chunkSize]byte))
	return nil
}

// join makes the first n bytes of the chunks one slice. A body of one chunk
// is used in place; a longer one is copied once and its chunks go back to
// the pool (the budget it drew stays held until recycle, as the copy is as
// large).
func (b *body) join(n int) {
	if n <= chunkSize {
		b.data = b.chunks[0][:n]
		return
	}
	b.data = make([]byte, 0, n)
	for _, c := range b.chunks {
		b.data = append(b.data, c[:min(chunkSize, n-len(b.data))]...)
	}
	b.putChunks()
}

func (b *body) putChunks() {
	for i, c := range b.chunks {
		chunkPool.Put(c)
		b.chunks[i] = nil
	}
	b.chunks = b.chunks[:0]
}

// recycle gives back the chunks and the budget; nothing may use the body's
// bytes after.
func (b *body) recycle() {
	b.putChunks()
	if b.held > 0 {
		b.in.inUse.Add(-b.held)
	}
	*b = body{chunks: b.chunks}
	bodyPool.Put(b)
}

func isJSON(contentType string) bool {
	// The providers' exact values first: no allocation on the hot path.
	if contentType == "application/json" || strings.HasPrefix(contentType, "application/json;") {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// HeaderIdempotency says which claim case a webhook answer came from.
const HeaderIdempotency = "Webhook-Idempotency"

// Its values, as the contract spells them on the wire.
const (
	idemFirst      = "first"
	idemDuplicate  = "duplicate"
	idemInProgress = "in-progress"
	idemDegraded   = "degraded"
)

var (
	bodyReceived   = []byte(`{"received":true}`)
	bodySkipped    = []byte(`{"received":true,"skipped":true}`)
	bodyIgnored    = []byte(`{"received":true,"ignored":true}`)
	bodyFailed     = []byte(`{"error":"webhook processing failed"}`)
	bodyInProgress = []byte(`{"error":"delivery in progress, retry later"}`)
	bodyUnavail    = []byte(`{"error":"idempotency store unavailable, retry later"}`)
	bodyTooLarge   = []byte(`{"error":"body too large"}`)
	bodyInvalid    = []byte(`{"error":"invalid webhook"}`)
	bodyMediaType  = []byte(`{"error":"content type must be application/json"}`)
	bodyTimeout    = []byte(`{"error":"body not received in time"}`)
	bodyBusy       = []byte(`{"error":"too many bodies being read, retry later"}`)
)

// respond is the one place a verdict becomes a status code, headers and a
// JSON body (the table in docs/DESIGN.md).
func respond(w http.ResponseWriter, v verdict) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	var status int
	var body []byte
	switch v.outcome {
	case Processed:
		status, body = http.StatusOK, bodyReceived
		h.Set(HeaderIdempotency, idemFirst)
	case Failed:
		status, body = http.StatusInternalServerError, bodyFailed
		h.Set(HeaderIdempotency, idemFirst)
	case Duplicate:
		status, body = http.StatusOK, bodySkipped
		h.Set(HeaderIdempotency, idemDuplicate)
	case InProgress:
		status, body = http.StatusConflict, bodyInProgress
		h.Set(HeaderIdempotency, idemInProgress)
		h.Set("Retry-After", retryAfter(v.retryAfter))
	case Unavailable:
		status, body = http.StatusServiceUnavailable, bodyUnavail
		h.Set(HeaderIdempotency, idemDegraded)
		h.Set("Retry-After", retryAfter(v.retryAfter))
	case Ignored:
		status, body = http.StatusOK, bodyIgnored
	case Rejected:
		status, body = http.StatusBadRequest, bodyInvalid
		switch rejection(v.err) {
		case reasonBodyTooLarge:
			status, body = http.StatusRequestEntityTooLarge, bodyTooLarge
		case reasonMediaType:
			status, body = http.StatusUnsupportedMediaType, bodyMediaType
		case reasonBodyTimeout:
			status, body = http.StatusRequestTimeout, bodyTimeout
		case reasonBodyBudget:
			status, body = http.StatusServiceUnavailable, bodyBusy
			h.Set("Retry-After", retryAfter(budgetRetry))
		}
	default:
		status, body = http.StatusInternalServerError, bodyFailed
	}
	if v.degraded != "" {
		h.Set(HeaderIdempotency, idemDegraded)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// budgetRetry is the Retry-After of a refusal for want of body budget: the
// bodies holding it finish or time out within BODY_READ_TIMEOUT.
const budgetRetry = 5 * time.Second

// retryAfter renders d as whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	return strconv.FormatInt(max(s, 1), 10)
}
