package claim

import (
	"bytes"
	"errors"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxBody is the largest webhook body accepted; larger ones get 413.
const MaxBody = 1 << 20

// ReadBody reads the request body, capped at MaxBody. A body over the cap
// returns an error that Reject answers with 413.
func ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	if err := readBody(w, r, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Body is a request body read by ReadPooledBody into a buffer that is
// reused once released. A webhook body lives only as long as its request,
// so reusing the buffer saves every delivery an allocation the size of its
// body (3 KiB for a Stripe event, a third of all it allocates), and the
// garbage collection that goes with it.
type Body struct {
	buf bytes.Buffer
}

// maxPresize bounds the buffer allocated from Content-Length alone.
const maxPresize = 64 << 10

// maxPooledBody is the largest buffer kept for reuse: one that a rare big
// body grew is left to the garbage collector rather than pinned.
const maxPooledBody = 64 << 10

var bodyPool = sync.Pool{New: func() any { return new(Body) }}

// ReadPooledBody is ReadBody into a pooled buffer. The caller must call
// Release exactly once, when nothing uses the bytes any more (after the
// delivery is answered), and must keep nothing that aliases them.
func ReadPooledBody(w http.ResponseWriter, r *http.Request) (*Body, error) {
	b := bodyPool.Get().(*Body)
	if err := readBody(w, r, &b.buf); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

// Bytes returns the body; they are valid until Release.
func (b *Body) Bytes() []byte { return b.buf.Bytes() }

// Release hands the buffer back for reuse.
func (b *Body) Release() {
	if b.buf.Cap() > maxPooledBody {
		return
	}
	b.buf.Reset()
	bodyPool.Put(b)
}

func readBody(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer) error {
	if !isJSON(r.Header.Get("Content-Type")) {
		return ErrNotJSON
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
	// Trust Content-Length for a presize only up to a typical event's size:
	// an unauthenticated client claiming 1 MiB must not make us allocate it
	// before sending a byte.
	if n := r.ContentLength; n > 0 && n <= maxPresize {
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(r.Body)
	return err
}

// ErrNotJSON rejects a webhook whose Content-Type is not JSON (415). Both
// providers always send application/json; anything else is not theirs.
var ErrNotJSON = errors.New("content type is not application/json")

func isJSON(contentType string) bool {
	// The providers' exact values first: no allocation on the hot path.
	if contentType == "application/json" || strings.HasPrefix(contentType, "application/json;") {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// Idempotency header values.
const (
	HeaderIdempotency = "Webhook-Idempotency"
	idemFirst         = "first"
	idemDuplicate     = "duplicate"
	idemInProgress    = "in-progress"
	idemDegraded      = "degraded"
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
)

// respond is the one place an Outcome becomes a status code, headers and a
// JSON body (the table in DESIGN.md).
func respond(w http.ResponseWriter, o Outcome) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	var status int
	var body []byte
	switch o.Result {
	case Processed:
		status, body = http.StatusOK, bodyReceived
		h.Set(HeaderIdempotency, idemFirst)
	case Failed:
		status, body = http.StatusInternalServerError, bodyFailed
		h.Set(HeaderIdempotency, idemFirst)
	case Duplicate:
		status, body = http.StatusOK, bodySkipped
		h.Set(HeaderIdempotency, idemDuplicate)
	case Progressing:
		status, body = http.StatusConflict, bodyInProgress
		h.Set(HeaderIdempotency, idemInProgress)
		h.Set("Retry-After", retryAfter(o.RetryAfter))
	case Unavailable:
		status, body = http.StatusServiceUnavailable, bodyUnavail
		h.Set(HeaderIdempotency, idemDegraded)
		h.Set("Retry-After", retryAfter(o.RetryAfter))
	case Ignored:
		status, body = http.StatusOK, bodyIgnored
	case Rejected:
		status, body = http.StatusBadRequest, bodyInvalid
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(o.Err, &tooLarge):
			status, body = http.StatusRequestEntityTooLarge, bodyTooLarge
		case errors.Is(o.Err, ErrNotJSON):
			status, body = http.StatusUnsupportedMediaType, bodyMediaType
		}
	default:
		status, body = http.StatusInternalServerError, bodyFailed
	}
	if o.Degraded != "" {
		h.Set(HeaderIdempotency, idemDegraded)
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// retryAfter renders d as whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	return strconv.FormatInt(max(s, 1), 10)
}
