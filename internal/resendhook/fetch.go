package resendhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/mail"
	"net/url"
	"strings"
	"time"

	"github.com/resend/resend-go/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/support"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// errNotFound is the Resend API's 404. For a received email Resend has just
// announced, it means this service asks the wrong API (RESEND_API_URL) or
// with another team's key (RESEND_API_KEY): never that the mail is gone.
var errNotFound = errors.New("resend API answered 404 (check RESEND_API_URL, and that RESEND_API_KEY is of the team that receives the mail)")

// errNotTheEmail is an API answer that is not the email asked for: no id,
// or another one.
var errNotTheEmail = errors.New("resend API answered with something other than the announced email")

// errAnswerRead ends the copy of an answer that readAnswer has done with.
var errAnswerRead = errors.New("answer read")

// notFoundTransport turns a 404 from the Resend API into errNotFound.
// resend-go folds every error status but 429 into a bare error string, so
// by the time Perform returns, a 404 cannot be told from a 500; only the
// transport still sees the status. http.Client wraps the transport's error
// in a *url.Error, which unwraps, so errors.Is finds the sentinel.
type notFoundTransport struct {
	base http.RoundTripper
}

func (t notFoundTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusNotFound {
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil, errNotFound
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// resend-go decodes an error's body whole: only its first bytes
		// are its to read.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, maxErrorBytes), resp.Body}
	}
	return resp, nil
}

// maxErrorBytes is the most of an error answer's body read: Resend's
// errors are a line of JSON.
const maxErrorBytes = 64 << 10

// newClient returns a Resend client on apiURL. The request's context (the
// delivery's, under the handler deadline) bounds each call, so the
// http.Client needs no timeout of its own.
func newClient(apiURL *url.URL, apiKey string, tp trace.TracerProvider) *resend.Client {
	hc := &http.Client{
		Transport:     notFoundTransport{base: tracing.Transport(tp, http.DefaultTransport)},
		CheckRedirect: apiRedirects(apiURL),
	}
	c := resend.NewCustomClient(hc, apiKey)
	c.BaseURL = apiBase(apiURL)
	return c
}

// apiBase gives the API's base URL a trailing slash: resend-go resolves
// "emails/receiving/{id}" against it, and without the slash a base with a
// path ("http://proxy/resend") would lose its last segment.
func apiBase(apiURL *url.URL) *url.URL {
	u := *apiURL
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
		u.RawPath = ""
	}
	return &u
}

// receivedEmail is what GET /emails/receiving/{id} answers
// (https://resend.com/docs/api-reference/emails/retrieve-received-email),
// decoded into what the service keeps. It is local because resend-go v3.1.1's
// ReceivedEmail has no authentication, no attachment sizes, and reads
// headers as strings only (a header Resend sends as a list would fail the
// whole answer).
type receivedEmail struct {
	ID        string `json:"id"`
	From      string `json:"from"`
	CreatedAt string `json:"created_at"`
	Subject   string `json:"subject"`
	// HTML and Text are read by readAnswer, within bounds.
	HTML string `json:"-"`
	Text string `json:"-"`
	// ReplyTo is a list of addresses (firstAddress reads it).
	ReplyTo   json.RawMessage `json:"reply_to"`
	Headers   headers         `json:"headers"`
	MessageID string          `json:"message_id"`
	// Authentication is null for mail Resend received before it had it.
	Authentication *struct {
		SPF   string `json:"spf"`
		DKIM  string `json:"dkim"`
		DMARC string `json:"dmarc"`
	} `json:"authentication"`
	// Attachments is nil when the answer has none listed at all (then the
	// attachments API is asked), empty when the mail has none.
	Attachments *[]struct {
		ID   string `json:"id"`
		Size *int64 `json:"size"`
	} `json:"attachments"`
}

// fetchEmail retrieves the received email id, with inline images as cid:
// references and attachments (html_format=cid) rather than base64 data
// URIs in the HTML. The answer is read within its caps (readAnswer) and
// drawn from the mail budget as it arrives (h); once read, h keeps what
// the email holds.
func fetchEmail(ctx context.Context, c *resend.Client, id string, h *hold) (answer, error) {
	req, err := c.NewRequest(ctx, http.MethodGet, "emails/receiving/"+id+"?html_format=cid", nil)
	if err != nil {
		return answer{}, fmt.Errorf("build request: %w", err)
	}
	var a answer
	err = perform(c, req, func(r io.Reader) error {
		a, err = readAnswer(&meteredReader{ctx: ctx, r: r, h: h, factor: 2, limit: answerShare})
		return err
	})
	if err != nil {
		return answer{}, err
	}
	// What the email keeps, twice over for the copies the message is made
	// of (toMessage, the text made of the HTML).
	h.shrink(2 * a.kept)
	if a.email.ID != id {
		return answer{}, fmt.Errorf("%w: id %q", errNotTheEmail, a.email.ID)
	}
	return a, nil
}

// perform runs req with resend-go, which sends it (auth, the API's errors,
// 429) and copies the answer into a pipe, from which read takes it as a
// stream: no answer is decoded whole by the SDK. Closing the pipe after
// read ends the copy where read stopped. The API's own error (404, 429,
// 5xx, network) wins over read's.
func perform(c *resend.Client, req *http.Request, read func(io.Reader) error) error {
	pr, pw := io.Pipe()
	performed := make(chan error, 1)
	go func() {
		_, err := c.Perform(req, pw)
		pw.CloseWithError(err) // nil: the reader sees io.EOF
		performed <- err
	}()
	err := read(pr)
	pr.CloseWithError(errAnswerRead)
	if performErr := <-performed; err != nil && performErr != nil && !errors.Is(performErr, errAnswerRead) {
		return performErr
	}
	return err
}

// headers are the mail's headers as Resend lists them: names in any case,
// values a string or a list of strings.
type headers map[string]json.RawMessage

// get returns the named header, a list joined by spaces, "" when absent.
func (h headers) get(name string) string {
	for k, raw := range h {
		if !strings.EqualFold(k, name) {
			continue
		}
		if s := rawString(raw); s != "" {
			return strings.TrimSpace(s)
		}
		var list []string
		if json.Unmarshal(raw, &list) == nil {
			return strings.TrimSpace(strings.Join(list, " "))
		}
	}
	return ""
}

// toMessage maps a fetched email onto a support message. to is the support
// recipient the event matched; now is the last fallback for the receive
// time.
func toMessage(d receivedData, a *answer, to string, now time.Time) support.Message {
	e := &a.email
	addr, name := sender(firstNonEmpty(e.From, d.From), e.Headers.get("from"))
	text := e.Text
	if strings.TrimSpace(text) == "" && e.HTML != "" {
		text = htmlToText(e.HTML)
	}
	m := support.Message{
		Source:      support.SourceEmail,
		ExternalID:  d.EmailID,
		FromAddress: addr,
		FromName:    name,
		ToAddress:   to,
		Subject:     firstNonEmpty(e.Subject, d.Subject),
		TextBody:    text,
		HTMLBody:    e.HTML,
		MessageID:   firstNonEmpty(strings.TrimSpace(e.MessageID), strings.TrimSpace(d.MessageID)),
		ReceivedAt:  receivedAt(now, e.CreatedAt, rawString(d.CreatedAt), d.EventCreatedAt),
		ReplyTo:     firstAddress(e.ReplyTo, e.Headers.get("reply-to")),
		InReplyTo:   e.Headers.get("in-reply-to"),
		References:  support.MessageIDs(e.Headers.get("references")),
		// The forward to the team skips automatic mail (RFC 3834).
		AutoSubmitted: e.Headers.get("auto-submitted"),
	}
	for _, f := range []*string{&m.FromAddress, &m.FromName, &m.ToAddress, &m.Subject, &m.ReplyTo, &m.MessageID, &m.InReplyTo, &m.AutoSubmitted} {
		*f = support.OneLine(*f)
	}
	for i, r := range m.References {
		m.References[i] = support.OneLine(r)
	}
	// Verdicts skipped for the answer's bounds are not known, which is not
	// the same as none: the queue threads the mail as it would a fail.
	// (A copy kept of an authentication sent twice is not trusted either.)
	m.AuthSkipped = a.skippedField("authentication")
	if v := e.Authentication; v != nil && !m.AuthSkipped {
		m.AuthSPF, m.AuthDKIM, m.AuthDMARC = v.SPF, v.DKIM, v.DMARC
		switch v.DMARC {
		case "pass":
			m.SenderAuthenticated = ptr(true)
		case "fail":
			m.SenderAuthenticated = ptr(false)
		}
	}
	return m
}

// sender returns the sender's bare address and display name. For received
// mail Resend's from is the bare address, and the name is only in the From
// header: it is taken from there when the header names the same address.
func sender(from, header string) (addr, name string) {
	addr, name = splitAddress(from)
	if name != "" || header == "" {
		return addr, name
	}
	h, err := mail.ParseAddress(header)
	if err != nil {
		return addr, name
	}
	if addr == "" {
		return h.Address, h.Name
	}
	if strings.EqualFold(h.Address, addr) {
		return addr, h.Name
	}
	return addr, name
}

// firstAddress returns the first address of a Reply-To list (a JSON list or
// string), else of the Reply-To header, as written; "" when there is none.
func firstAddress(list json.RawMessage, header string) string {
	var values []string
	if s := rawString(list); s != "" {
		values = []string{s}
	} else if json.Unmarshal(list, &values) != nil {
		values = nil
	}
	for _, v := range append(values, header) {
		if as, err := mail.ParseAddressList(v); err == nil && len(as) > 0 {
			return as[0].Address
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// splitAddress returns the bare address and display name of a From value,
// or the raw value and no name when it does not parse (the mail is kept
// either way).
func splitAddress(from string) (addr, name string) {
	a, err := mail.ParseAddress(from)
	if err != nil {
		return strings.TrimSpace(from), ""
	}
	return a.Address, a.Name
}

// receivedAt returns the first of candidates that parses, else now.
func receivedAt(now time.Time, candidates ...string) time.Time {
	for _, c := range candidates {
		if t, ok := parseTime(c); ok {
			return t
		}
	}
	return now
}

// parseTime reads the forms Resend writes times in: RFC 3339
// ("2023-04-03T22:13:42.674981+00:00", "2024-02-22T23:41:12.126Z") and
// Postgres's text form, with a space and a short offset
// ("2023-04-03 22:13:42.674981+00").
func parseTime(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, false
	}
	layouts := []string{
		time.RFC3339Nano,
		"2006-01-02T15:04:05.999999999Z07",
		"2006-01-02 15:04:05.999999999Z07:00",
		"2006-01-02 15:04:05.999999999Z07",
	}
	for _, layout := range layouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if strings.TrimSpace(s) != "" {
			return s
		}
	}
	return ""
}
