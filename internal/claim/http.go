package claim

import (
	"errors"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/munchable/munchable-webhooks/internal/intake"
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
	case errors.Is(err, intake.ErrTimeout):
		// A slow client, not a forgery: never counted as rejected.
		return reasonBodyTimeout
	case errors.Is(err, intake.ErrBudget):
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
// With tracing on, the func is otelhttp's around it (the route's span).
func (e *Endpoint) Handler(decode Decode) http.HandlerFunc {
	return e.traced(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if !isJSON(r.Header.Get("Content-Type")) {
			e.answer(w, r, Event{}, verdict{outcome: Rejected, err: ErrNotJSON}, start)
			return
		}
		b, err := e.flow.intake.Read(w, r, MaxBody)
		if err != nil {
			e.answer(w, r, Event{}, verdict{outcome: Rejected, err: err}, start)
			return
		}
		// The buffer is reused once this delivery is answered: decode must
		// copy what it keeps, and the flow only fingerprints the bytes.
		defer b.Release()
		_, span := e.flow.span(r.Context(), spanVerify)
		ev, err := decode(r.Header, b.Bytes())
		if err == nil {
			err = checkID(ev.ID)
		}
		endSpan(span, err)
		var v verdict
		switch {
		case err != nil:
			v = verdict{outcome: Rejected, err: err}
		case ev.Apply == nil:
			v = verdict{outcome: Ignored}
		default:
			v = e.flow.run(r.Context(), e.provider, b.Bytes(), ev)
		}
		e.answer(w, r, ev, v, start)
	})
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
	bodyBusyEffect = []byte(`{"error":"too much mail in flight, retry later"}`)
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
		if v.busy {
			body = bodyBusyEffect
			h.Set(HeaderIdempotency, idemFirst)
		}
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
			h.Set("Retry-After", retryAfter(intake.RetryAfter))
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

// retryAfter renders d as whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	return strconv.FormatInt(max(s, 1), 10)
}
