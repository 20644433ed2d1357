package faulttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"
)

// Secrets and addresses of the harness's service. The values are for
// throwaway services only.
const (
	StripeSecret   = "whsec_faulttest_stripe_secret"
	ResendSecret   = "whsec_ZmF1bHR0ZXN0LXJlc2VuZC1zaWduaW5nLWtleQ==" // base64("faulttest-resend-signing-key")
	ResendAPIKey   = "re_faulttest_api_key"
	SupportAddress = "support@munchable.app"
	// SupportDomain is the whole-domain entry of SUPPORT_INBOUND_ADDRESSES.
	SupportDomain = "inbound.munchable.app"
)

// BaseEnv is a complete environment for the service but for the servers'
// URLs (DATABASE_URL, REDIS_URL, RESEND_API_URL), which the caller adds.
func BaseEnv() map[string]string {
	return map[string]string{
		"STRIPE_WEBHOOK_SECRET":     StripeSecret,
		"RESEND_WEBHOOK_SECRET":     ResendSecret,
		"RESEND_API_KEY":            ResendAPIKey,
		"SUPPORT_INBOUND_ADDRESSES": SupportAddress + ",@" + SupportDomain,
		"LOG_LEVEL":                 "info",
		// The fault tests decide what each provider delivers and when; a
		// sweep would queue what a test withholds. Tests of the sweep
		// turn it on.
		"SWEEP_INTERVAL": "0",
	}
}

// DurableCommits makes every new session on the database at url commit
// synchronously. dbtest's throwaway servers run with
// synchronous_commit=off, so a kill -9 of the postmaster may lose the last
// few hundred milliseconds of acknowledged commits: a loss the service could
// neither see nor prevent, which would read as a lost event. A per-database
// setting overrides the server's command line for every later session.
func DurableCommits(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("durable commits: %w", err)
	}
	defer conn.Close(context.Background())
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return fmt.Errorf("durable commits: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET synchronous_commit = on"); err != nil {
		return fmt.Errorf("durable commits: %w", err)
	}
	return nil
}

// StripeEvent is a customer.subscription.* event, rendered at API version
// 2025-03-31 (current_period_end on the items).
type StripeEvent struct {
	ID      string
	Type    string // customer.subscription.created, .updated, .deleted, ...
	Created int64  // Stripe's created, unix seconds

	SubscriptionID    string
	CustomerID        string
	Status            string
	PreviousStatus    string // data.previous_attributes.status; "" when the status did not change
	PriceID           string
	PeriodEnd         int64
	CancelAtPeriodEnd bool
	// Metadata is the subscription's metadata (Stripe allows 50 keys of
	// values up to 500 characters); nil renders as {}.
	Metadata map[string]string
}

// JSON renders the event as Stripe sends it (the fields the service reads,
// and a few it does not).
func (e StripeEvent) JSON() []byte {
	type price struct {
		ID     string `json:"id"`
		Object string `json:"object"`
	}
	type item struct {
		ID               string `json:"id"`
		Object           string `json:"object"`
		Price            price  `json:"price"`
		CurrentPeriodEnd int64  `json:"current_period_end"`
		Quantity         int    `json:"quantity"`
	}
	items := []item{}
	if e.PriceID != "" {
		items = append(items, item{ID: "si_" + e.SubscriptionID, Object: "subscription_item",
			Price: price{ID: e.PriceID, Object: "price"}, CurrentPeriodEnd: e.PeriodEnd, Quantity: 1})
	}
	metadata := e.Metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	data := map[string]any{
		"object": map[string]any{
			"id":                   e.SubscriptionID,
			"object":               "subscription",
			"customer":             e.CustomerID,
			"status":               e.Status,
			"cancel_at_period_end": e.CancelAtPeriodEnd,
			"items":                map[string]any{"object": "list", "data": items, "has_more": false},
			"livemode":             false,
			"metadata":             metadata,
		},
	}
	if e.PreviousStatus != "" {
		data["previous_attributes"] = map[string]any{"status": e.PreviousStatus}
	}
	b, err := json.Marshal(map[string]any{
		"id":               e.ID,
		"object":           "event",
		"api_version":      "2025-03-31.basil",
		"created":          e.Created,
		"type":             e.Type,
		"data":             data,
		"livemode":         false,
		"pending_webhooks": 1,
	})
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return b
}

// StripeRequest is one Stripe delivery attempt of body, signed at now.
// Stripe signs every attempt afresh, so a retry never meets the 300 s
// tolerance.
func StripeRequest(ctx context.Context, baseURL string, body []byte, now time.Time) (*http.Request, error) {
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: StripeSecret, Timestamp: now})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/webhooks/stripe", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", signed.Header)
	return req, nil
}

// Email is one inbound mail: the email.received event Resend sends for it,
// under the Svix message id that stays the same across Svix's retries, and
// the body the Resend API answers for it.
type Email struct {
	SvixID    string
	EmailID   string
	MessageID string // RFC 5322 Message-ID, with the angle brackets
	From      string
	To        string
	Subject   string
	Text      string
	Created   time.Time

	// Cc and ReceivedFor are the event's cc and envelope recipients
	// (received_for); nil sends an empty list.
	Cc, ReceivedFor []string
	// InReplyTo and DMARC are the mail's In-Reply-To header and Resend's
	// DMARC verdict ("" for none: no header, no authentication).
	InReplyTo, DMARC string
	// PartBytes, when set, makes the API answer text and HTML parts of
	// that many bytes each (ResendAPI streams them, see WriteAPIJSON).
	PartBytes int
	// Attachments are listed in the answer and by the attachments API.
	Attachments []Attachment
}

func orEmpty(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// EventJSON is the email.received webhook body.
func (m Email) EventJSON() []byte {
	created := m.Created.UTC().Format("2006-01-02T15:04:05.000Z")
	b, err := json.Marshal(map[string]any{
		"type":       "email.received",
		"created_at": created,
		"data": map[string]any{
			"email_id":     m.EmailID,
			"created_at":   created,
			"from":         m.From,
			"to":           []string{m.To},
			"cc":           orEmpty(m.Cc),
			"bcc":          []string{},
			"received_for": orEmpty(m.ReceivedFor),
			"message_id":   m.MessageID,
			"subject":      m.Subject,
			"attachments":  []any{},
		},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// APIJSON is what GET /emails/receiving/{email_id} answers (parts of
// PartBytes are not in it: WriteAPIJSON adds them).
func (m Email) APIJSON() []byte {
	headers := map[string]string{"mime-version": "1.0"}
	if m.InReplyTo != "" {
		headers["in-reply-to"] = m.InReplyTo
	}
	answer := map[string]any{
		"object":     "email",
		"id":         m.EmailID,
		"to":         []string{m.To},
		"from":       m.From,
		"created_at": m.Created.UTC().Format("2006-01-02T15:04:05.000000+00:00"),
		"subject":    m.Subject,
		"html":       "<p>" + m.Text + "</p>",
		"text":       m.Text,
		"bcc":        []string{},
		"cc":         []string{},
		"reply_to":   []string{},
		"headers":    headers,
		"message_id": m.MessageID,
	}
	listed := []any{}
	for _, at := range m.Attachments {
		listed = append(listed, map[string]any{"id": at.ID, "filename": at.Filename, "size": at.Size})
	}
	answer["attachments"] = listed
	if m.DMARC != "" {
		answer["authentication"] = map[string]string{"spf": "pass", "dkim": "pass", "dmarc": m.DMARC}
	}
	if m.PartBytes > 0 {
		delete(answer, "html")
		delete(answer, "text")
	}
	b, err := json.Marshal(answer)
	if err != nil {
		panic(err)
	}
	return b
}

// WriteAPIJSON writes what GET /emails/receiving/{email_id} answers, with
// text and HTML parts of PartBytes each streamed in 64 KiB pieces, so that
// a test can serve giant mails without holding them.
func (m Email) WriteAPIJSON(w io.Writer) error {
	b := m.APIJSON()
	if m.PartBytes <= 0 {
		_, err := w.Write(b)
		return err
	}
	if _, err := w.Write(b[:len(b)-1]); err != nil { // without the closing brace
		return err
	}
	for _, part := range []struct{ name, open, line string }{
		{"html", "<p>", "<p>" + m.Text + "</p> "},
		{"text", "", m.Text + " "},
	} {
		if _, err := io.WriteString(w, `,"`+part.name+`":"`+part.open); err != nil {
			return err
		}
		piece := []byte(strings.Repeat(part.line, (64<<10)/len(part.line)+1)[:64<<10])
		for left := m.PartBytes - len(part.open); left > 0; left -= len(piece) {
			if _, err := w.Write(piece[:min(left, len(piece))]); err != nil {
				return err
			}
		}
		if _, err := io.WriteString(w, `"`); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "}")
	return err
}

// ResendRequest is one Svix delivery attempt of m, signed at now. Svix signs
// every attempt afresh (5 minute tolerance) under the same svix-id.
func ResendRequest(ctx context.Context, baseURL string, m Email, now time.Time) (*http.Request, error) {
	wh, err := svix.NewWebhook(ResendSecret)
	if err != nil {
		return nil, err
	}
	body := m.EventJSON()
	sig, err := wh.Sign(m.SvixID, now, body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/webhooks/resend", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("svix-id", m.SvixID)
	req.Header.Set("svix-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("svix-signature", sig)
	return req, nil
}

// Answer is what a provider saw of one delivery attempt.
type Answer struct {
	Status      int    // 0: no answer (connection refused or reset, timeout)
	Idempotency string // Webhook-Idempotency
	RetryAfter  string
	Body        string
	Err         error
	Sent, Done  time.Time
}

// OK reports a 2xx: the provider stops retrying.
func (a Answer) OK() bool { return a.Status >= 200 && a.Status < 300 }

// RetryAfterSeconds is the Retry-After header as a number, or -1.
func (a Answer) RetryAfterSeconds() int {
	n, err := strconv.Atoi(a.RetryAfter)
	if err != nil {
		return -1
	}
	return n
}

func (a Answer) String() string {
	if a.Err != nil {
		return fmt.Sprintf("no answer (%v)", a.Err)
	}
	return fmt.Sprintf("%d %s Retry-After=%q %s", a.Status, a.Idempotency, a.RetryAfter, a.Body)
}

// Do sends one attempt and records the answer.
func Do(client *http.Client, req *http.Request) Answer {
	a := Answer{Sent: time.Now()}
	resp, err := client.Do(req)
	if err != nil {
		a.Err, a.Done = err, time.Now()
		return a
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	a.Done = time.Now()
	a.Status = resp.StatusCode
	a.Idempotency = resp.Header.Get("Webhook-Idempotency")
	a.RetryAfter = resp.Header.Get("Retry-After")
	a.Body = string(body)
	if err != nil {
		a.Err = err
	}
	return a
}

// Backoff is the wait before retry attempt n (1-based) of a provider whose
// schedule is compressed in time: exponential from base, capped. Stripe
// (hours apart, for 3 days) and Svix (5 s, 5 min, 30 min, 2 h, ...) have the
// same shape; jitter in [0, 1) spreads the retries of a burst.
func Backoff(n int, base, limit time.Duration, jitter float64) time.Duration {
	d := float64(base) * math.Pow(2, float64(n-1))
	d = math.Min(d, float64(limit))
	return time.Duration(d * (0.75 + 0.5*jitter))
}
