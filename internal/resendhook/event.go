package resendhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/mail"
	"net/url"
	"strings"
)

const typeReceived = "email.received"

var errInvalidEvent = errors.New("invalid event")

// event is the part of a Resend event this service reads. Only the type is
// needed of every event; data is decoded only for email.received, whose
// shape is the one we know (other types carry other objects).
type event struct {
	Type      string          `json:"type"`
	CreatedAt json.RawMessage `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// receivedData is the data of an email.received event
// (https://resend.com/docs/webhooks/emails/received): the email's metadata,
// without its body, which is fetched from the API.
type receivedData struct {
	EmailID   string          `json:"email_id"`
	CreatedAt json.RawMessage `json:"created_at"`
	From      string          `json:"from"`
	To        addrList        `json:"to"`
	Cc        addrList        `json:"cc"`
	Bcc       addrList        `json:"bcc"`
	// ReceivedFor are the envelope recipients where Resend sends them (a
	// list of addresses, https://resend.com/docs/webhooks/emails/received):
	// the only trace of the support address on mail that reached us as
	// Bcc, and the only recipients that cannot be forged in a header.
	ReceivedFor addrList `json:"received_for"`
	MessageID   string   `json:"message_id"`
	Subject     string   `json:"subject"`
	// EventCreatedAt is the event's own created_at, copied from the
	// envelope: the last fallback for when the mail was received.
	EventCreatedAt string `json:"-"`
}

// decode parses a verified body. Any event needs a type; email.received
// also needs an email id that is safe to put in the API's URL path.
func decode(body []byte) (event, error) {
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		return event{}, fmt.Errorf("%w: %w", errInvalidEvent, err)
	}
	if ev.Type == "" {
		return event{}, fmt.Errorf("%w: missing type", errInvalidEvent)
	}
	return ev, nil
}

// mail decodes the data of an email.received event.
func (ev event) mail() (receivedData, error) {
	var d receivedData
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		return receivedData{}, fmt.Errorf("%w: %s data: %w", errInvalidEvent, ev.Type, err)
	}
	if !validEmailID(d.EmailID) {
		return receivedData{}, fmt.Errorf("%w: %s has no usable email_id", errInvalidEvent, ev.Type)
	}
	d.EventCreatedAt = rawString(ev.CreatedAt)
	return d, nil
}

// validEmailID reports whether id is one URL path segment that needs no
// escaping. resend-go appends the id to the path unescaped, so an id with
// "/", "?", "#" or a dot segment would fetch some other resource with our
// API key. Resend's ids are UUIDs.
func validEmailID(id string) bool {
	return id != "" && len(id) <= 256 && id != "." && id != ".." && url.PathEscape(id) == id
}

// recipients lists the addresses that decide whether the mail is for
// support. When Resend names the envelope recipients (received_for, the
// RCPT TO addresses its server accepted), they alone decide: To and Cc are
// whatever the sender wrote, so a mail to sales@ with a forged "Cc:
// support@" must not reach the support queue. Without received_for (null
// or empty, as in mail received before Resend sent it), To, Cc and Bcc
// decide.
func (d receivedData) recipients() []string {
	if len(d.ReceivedFor) > 0 {
		return d.ReceivedFor
	}
	var all []string
	for _, l := range []addrList{d.To, d.Cc, d.Bcc} {
		all = append(all, l...)
	}
	return all
}

// addrList is a list of recipients, read defensively: a JSON array of
// strings, one string (possibly "a@x, B <b@y>"), or null. Each entry is
// reduced to its bare address, lower-cased. Anything else decodes as no
// recipients rather than failing the event: it then matches no support
// address and is ignored, and counted.
type addrList []string

func (l *addrList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = bareAddresses(one)
		return nil
	}
	var many []json.RawMessage
	if err := json.Unmarshal(b, &many); err != nil {
		*l = nil
		return nil
	}
	var out []string
	for _, raw := range many {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out = append(out, bareAddresses(s)...)
		}
	}
	*l = out
	return nil
}

// bareAddresses returns the addresses in a header-style list, lower-cased,
// or the trimmed string itself when it does not parse.
func bareAddresses(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	list, err := mail.ParseAddressList(s)
	if err != nil {
		return []string{strings.ToLower(strings.Trim(s, "<>"))}
	}
	out := make([]string, 0, len(list))
	for _, a := range list {
		out = append(out, strings.ToLower(a.Address))
	}
	return out
}

// Inbound is SUPPORT_INBOUND_ADDRESSES: whole addresses and whole domains,
// lower-cased.
type Inbound struct {
	addresses map[string]bool
	domains   map[string]bool
}

// ParseInbound reads the entries ("support@munchable.app" or
// "@inbound.munchable.app", case-insensitive) and returns those it could
// not read, each as given.
func ParseInbound(entries []string) (in Inbound, bad []string) {
	in = Inbound{addresses: map[string]bool{}, domains: map[string]bool{}}
	for _, raw := range entries {
		e := strings.ToLower(strings.TrimSpace(raw))
		local, domain, ok := strings.Cut(e, "@")
		switch {
		case !ok || domain == "" || strings.ContainsAny(domain, "@ ") || strings.Contains(local, " "):
			bad = append(bad, raw)
		case local == "":
			in.domains[domain] = true
		default:
			in.addresses[e] = true
		}
	}
	return in, bad
}

// match returns the first recipient that is a support address. Recipients
// are already lower-cased bare addresses.
func (in Inbound) match(recipients []string) (string, bool) {
	for _, r := range recipients {
		if in.addresses[r] {
			return r, true
		}
		if i := strings.LastIndexByte(r, '@'); i >= 0 && in.domains[r[i+1:]] {
			return r, true
		}
	}
	return "", false
}

// rawString returns a JSON string's value, or "" for anything else.
func rawString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
