package support

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits of the support form. Lengths are in characters (runes), as a
// person typing counts them.
const (
	maxFormBody    = 256 << 10
	maxEmail       = 254 // RFC 5321's limit on a forward path
	maxName        = 200
	maxSubject     = 300
	maxMessage     = 20000
	maxIdemKey     = 255
	headerIdemKey  = "Idempotency-Key"
	contentJSON    = "application/json"
	contentForm    = "application/x-www-form-urlencoded"
	externalKey    = "key:"
	externalRandom = "form:"
)

// form is the support form as posted.
type form struct {
	Email, Name, Subject, Message string
}

// fieldErrors maps a field to what is wrong with it: the 422 body.
type fieldErrors map[string]string

func (e fieldErrors) add(field, problem string) {
	if _, ok := e[field]; !ok { // the first problem found is the one reported
		e[field] = problem
	}
}

// FormHandler answers POST /support/messages: the site's support form,
// queued as a message from source web. Decode, validate, store, respond.
// Wrap it in RateLimit. A nil logger discards.
func FormHandler(q *Queue, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || (ct != contentJSON && ct != contentForm) {
			writeError(w, http.StatusUnsupportedMediaType, "content type must be application/json or application/x-www-form-urlencoded")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFormBody))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeError(w, http.StatusRequestEntityTooLarge, "body too large")
				return
			}
			writeError(w, http.StatusBadRequest, "could not read body")
			return
		}

		errs := fieldErrors{}
		var f form
		if ct == contentJSON {
			f, err = decodeJSON(body, errs)
		} else {
			f, err = decodeForm(body, errs)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		key := idempotencyKey(r.Header, errs)
		f = f.validate(errs)
		if len(errs) > 0 {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]fieldErrors{"errors": errs})
			return
		}

		m := Message{
			Source:      SourceWeb,
			FromAddress: f.Email,
			FromName:    f.Name,
			Subject:     f.Subject,
			TextBody:    f.Message,
			ReceivedAt:  time.Now(),
		}
		if key != "" {
			m.ExternalID = externalKey + key
		} else {
			m.ExternalID = externalRandom + randomHex()
		}
		id, inserted, err := q.Enqueue(r.Context(), m)
		if err != nil {
			logger.ErrorContext(r.Context(), "support form: enqueue failed", "err", err)
			writeError(w, http.StatusInternalServerError, "could not queue the message, try again")
			return
		}
		if !inserted {
			// The key was used before. Answer the first message's id only if
			// this is the same message: a key reused for another message
			// would otherwise be acknowledged and silently dropped (the
			// IETF Idempotency-Key draft answers such a reuse with 422).
			same, err := sameForm(r.Context(), q, id, m)
			if err != nil {
				logger.ErrorContext(r.Context(), "support form: read queued message failed", "id", id, "err", err)
				writeError(w, http.StatusInternalServerError, "could not queue the message, try again")
				return
			}
			if !same {
				writeJSON(w, http.StatusUnprocessableEntity, map[string]fieldErrors{"errors": {headerIdemKey: "was already used for a different message"}})
				return
			}
		}
		logger.InfoContext(r.Context(), "support form: message queued", "id", id, "inserted", inserted, "idempotency_key", key != "")
		writeJSON(w, http.StatusAccepted, map[string]int64{"id": id})
	})
}

// sameForm reports whether the message queued under id is m, as the form
// stores it.
func sameForm(ctx context.Context, q *Queue, id int64, m Message) (bool, error) {
	got, err := q.Get(ctx, id)
	if err != nil {
		return false, err
	}
	return got.FromAddress == m.FromAddress && got.FromName == m.FromName &&
		got.Subject == m.Subject && got.TextBody == m.TextBody, nil
}

// errMalformed is the 400 answer's reason; its text is shown to the client.
var errMalformed = errors.New("malformed body")

// decodeJSON reads the form from a JSON object. Each field is checked for
// valid UTF-8 before it is decoded, because encoding/json silently turns
// invalid bytes into U+FFFD.
func decodeJSON(body []byte, errs fieldErrors) (form, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return form{}, fmt.Errorf("%w: want a JSON object", errMalformed)
	}
	var f form
	for name, dst := range f.fields() {
		v, ok := raw[name]
		if !ok || bytes.Equal(v, []byte("null")) {
			continue
		}
		if !utf8.Valid(v) {
			errs.add(name, "must be valid UTF-8")
			continue
		}
		if err := json.Unmarshal(v, dst); err != nil {
			errs.add(name, "must be a string")
		}
	}
	return f, nil
}

// decodeForm reads the form from an urlencoded body. Only the first value of
// a repeated field counts.
func decodeForm(body []byte, errs fieldErrors) (form, error) {
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return form{}, fmt.Errorf("%w: want an urlencoded form", errMalformed)
	}
	var f form
	for name, dst := range f.fields() {
		v := vals.Get(name)
		if !utf8.ValidString(v) {
			errs.add(name, "must be valid UTF-8")
			continue
		}
		*dst = v
	}
	return f, nil
}

func (f *form) fields() map[string]*string {
	return map[string]*string{"email": &f.Email, "name": &f.Name, "subject": &f.Subject, "message": &f.Message}
}

// validate records every problem with f in errs and returns f as it will be
// stored: each field trimmed of surrounding white space.
func (f form) validate(errs fieldErrors) form {
	for name, v := range f.fields() {
		if strings.ContainsRune(*v, 0) {
			errs.add(name, "must not contain NUL characters")
		}
		if name != "message" && strings.ContainsAny(*v, "\r\n") {
			// These fields may end up in a mail header when support replies.
			errs.add(name, "must not contain line breaks")
		}
		*v = strings.TrimSpace(*v)
	}
	limits := []struct {
		field string
		v     string
		max   int
	}{
		{"email", f.Email, maxEmail},
		{"name", f.Name, maxName},
		{"subject", f.Subject, maxSubject},
		{"message", f.Message, maxMessage},
	}
	for _, l := range limits {
		if utf8.RuneCountInString(l.v) > l.max {
			errs.add(l.field, "must be at most "+strconv.Itoa(l.max)+" characters")
		}
	}
	switch {
	case f.Email == "":
		errs.add("email", "is required")
	case !bareAddress(f.Email):
		errs.add("email", "must be a plain email address, such as name@example.com")
	}
	if f.Message == "" {
		errs.add("message", "is required")
	}
	return f
}

// bareAddress reports whether s is an addr-spec and nothing more: no
// display name, angle brackets or comments.
func bareAddress(s string) bool {
	a, err := mail.ParseAddress(s)
	return err == nil && a.Name == "" && a.Address == s
}

// idempotencyKey returns the Idempotency-Key header, "" when absent, and
// records a problem with it in errs.
func idempotencyKey(h http.Header, errs fieldErrors) string {
	vals, ok := h[http.CanonicalHeaderKey(headerIdemKey)]
	if !ok {
		return ""
	}
	const problem = "must be 1 to 255 printable ASCII characters"
	if len(vals) != 1 || len(vals[0]) < 1 || len(vals[0]) > maxIdemKey {
		errs.add(headerIdemKey, problem)
		return ""
	}
	for _, c := range []byte(vals[0]) {
		if c < 0x20 || c > 0x7e {
			errs.add(headerIdemKey, problem)
			return ""
		}
	}
	return vals[0]
}

// randomHex returns 128 random bits in hex: the external id of a post
// without an idempotency key, which no other post shares.
func randomHex() string {
	var b [16]byte
	rand.Read(b[:]) // never returns an error
	return hex.EncodeToString(b[:])
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only maps of strings and ints reach here
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
