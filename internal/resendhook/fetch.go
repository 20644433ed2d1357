package resendhook

import (
	"errors"
	"io"
	"net/http"
	"net/mail"
	"net/url"
	"strings"
	"time"

	"github.com/resend/resend-go/v3"

	"github.com/munchable/munchable-webhooks/internal/support"
)

// errEmailNotFound is the Resend API's 404 for a received email.
var errEmailNotFound = errors.New("received email not found")

// notFoundTransport turns a 404 from the Resend API into errEmailNotFound.
// resend-go folds every error status but 429 into a bare error string, so
// by the time GetWithContext returns, a 404 (acknowledge: the email is gone
// and no retry will bring it back) cannot be told from a 500 (fail: the
// retry may succeed). Only the transport still sees the status. http.Client
// wraps the transport's error in a *url.Error, which unwraps, so errors.Is
// finds the sentinel.
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
		return nil, errEmailNotFound
	}
	return resp, nil
}

// newClient returns a Resend client on apiURL. The request's context (the
// delivery's, under the handler deadline) bounds each call, so the
// http.Client needs no timeout of its own.
func newClient(apiURL *url.URL, apiKey string) *resend.Client {
	hc := &http.Client{Transport: notFoundTransport{base: http.DefaultTransport}}
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

// toMessage maps a fetched email onto a support message. to is the support
// recipient the event matched; now is the last fallback for the receive
// time.
func toMessage(d receivedData, e *resend.ReceivedEmail, to string, now time.Time) support.Message {
	from := firstNonEmpty(e.From, d.From)
	addr, name := splitAddress(from)
	text := e.Text
	if strings.TrimSpace(text) == "" && e.Html != "" {
		text = htmlToText(e.Html)
	}
	return support.Message{
		Source:      support.SourceEmail,
		ExternalID:  d.EmailID,
		FromAddress: addr,
		FromName:    name,
		ToAddress:   to,
		Subject:     firstNonEmpty(e.Subject, d.Subject),
		TextBody:    text,
		HTMLBody:    e.Html,
		MessageID:   firstNonEmpty(strings.TrimSpace(e.MessageId), strings.TrimSpace(d.MessageID)),
		ReceivedAt:  receivedAt(now, e.CreatedAt, rawString(d.CreatedAt), d.EventCreatedAt),
	}
}

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
