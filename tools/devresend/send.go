package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// outbox stands in for Resend's Send Email
// (https://resend.com/docs/api-reference/emails/send-email): it sends
// nothing, and prints what it would have sent, so that make dev shows the
// forward the team would receive. It keeps Resend's idempotency rule
// (https://resend.com/docs/dashboard/emails/idempotency-keys): a request
// with an Idempotency-Key already used, and the same body, is answered
// with the first email's id and sends nothing; with another body it is a
// 409 invalid_idempotent_request. (Resend keeps a key 24 hours; the
// stand-in, until it stops.)
type outbox struct {
	log io.Writer

	mu   sync.Mutex
	keys map[string]sentEmail
	n    int
}

type sentEmail struct {
	id   string
	hash [sha256.Size]byte
}

func newOutbox(log io.Writer) *outbox {
	return &outbox{log: log, keys: map[string]sentEmail{}}
}

// email is the part of the send body the stand-in checks and prints.
type email struct {
	From        string            `json:"from"`
	To          json.RawMessage   `json:"to"`
	Subject     string            `json:"subject"`
	ReplyTo     json.RawMessage   `json:"reply_to"`
	Text        string            `json:"text"`
	HTML        string            `json:"html"`
	Headers     map[string]string `json:"headers"`
	Attachments []struct {
		Filename    string `json:"filename"`
		Content     string `json:"content"`
		ContentType string `json:"content_type"`
	} `json:"attachments"`
}

// maxSendBody is Resend's 40 MB per email, with room for the JSON.
const maxSendBody = 41 << 20

func (o *outbox) send(apiKey string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r, apiKey) {
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSendBody))
		if err != nil {
			apiError(w, http.StatusRequestEntityTooLarge, "validation_error", "The email is over 40 MB.")
			return
		}
		var e email
		if err := json.Unmarshal(body, &e); err != nil {
			apiError(w, http.StatusUnprocessableEntity, "validation_error", "The body is not valid JSON: "+err.Error())
			return
		}
		if problem := e.problem(); problem != "" {
			apiError(w, http.StatusUnprocessableEntity, "validation_error", problem)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		hash := sha256.Sum256(body)
		o.mu.Lock()
		prev, seen := o.keys[key]
		if key == "" || !seen {
			o.n++
			prev = sentEmail{id: fmt.Sprintf("dev-email-%06d", o.n), hash: hash}
			if key != "" {
				o.keys[key] = prev
			}
		}
		o.mu.Unlock()
		switch {
		case seen && prev.hash != hash:
			apiError(w, http.StatusConflict, "invalid_idempotent_request",
				"Same idempotency key used with a different request payload. Change your idempotency key or payload.")
			return
		case seen:
			fmt.Fprintf(o.log, "devresend: POST /emails with Idempotency-Key %s again: the same email (%s), not sent twice\n", key, prev.id)
		default:
			o.print(prev.id, key, e)
		}
		writeJSON(w, http.StatusOK, map[string]string{"id": prev.id})
	}
}

// problem is what Resend would refuse in e ("" when nothing).
func (e email) problem() string {
	switch {
	case strings.TrimSpace(e.From) == "":
		return "Missing `from` field."
	case len(e.To) == 0 || string(e.To) == "null" || string(e.To) == "[]" || string(e.To) == `""`:
		return "Missing `to` field."
	case strings.TrimSpace(e.Subject) == "":
		return "Missing `subject` field."
	case e.Text == "" && e.HTML == "":
		return "Missing `html` or `text` field."
	}
	for _, a := range e.Attachments {
		if _, err := base64.StdEncoding.DecodeString(a.Content); err != nil {
			return fmt.Sprintf("Attachment %q: content is not base64.", a.Filename)
		}
	}
	return ""
}

// print writes the email as the recipient would see it, more or less.
func (o *outbox) print(id, key string, e email) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "devresend: POST /emails: would have sent %s (Idempotency-Key %q):\n", id, key)
	fmt.Fprintf(&b, "  From:     %s\n  To:       %s\n", e.From, plain(e.To))
	if len(e.ReplyTo) > 0 {
		fmt.Fprintf(&b, "  Reply-To: %s\n", plain(e.ReplyTo))
	}
	fmt.Fprintf(&b, "  Subject:  %s\n", e.Subject)
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Fprintf(&b, "  %s: %s\n", k, e.Headers[k])
	}
	for _, a := range e.Attachments {
		content, _ := base64.StdEncoding.DecodeString(a.Content) // checked by problem
		fmt.Fprintf(&b, "  Attached: %s (%s, %d bytes)\n", a.Filename, a.ContentType, len(content))
	}
	if e.HTML != "" {
		fmt.Fprintf(&b, "  (and an HTML part of %d bytes)\n", len(e.HTML))
	}
	b.WriteString("\n")
	for line := range strings.SplitSeq(strings.TrimRight(e.Text, "\n"), "\n") {
		fmt.Fprintf(&b, "  | %s\n", line)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.log.Write(b.Bytes())
}

// plain prints a JSON string or list of strings without the JSON.
func plain(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return strings.Join(list, ", ")
	}
	return string(raw)
}
