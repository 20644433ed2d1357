package relay

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/resend/resend-go/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// ForwardConsumer is the consumer that forwards support messages to the
// team's mailbox.
const ForwardConsumer = "forward"

// ForwardConfig is the forward's far side (SUPPORT_FORWARD_*, RESEND_*).
type ForwardConfig struct {
	// To is SUPPORT_FORWARD_TO: the team's addresses (empty: off).
	To []string
	// From is SUPPORT_FORWARD_FROM, on a domain verified in Resend.
	From string
	// Rate is SUPPORT_FORWARD_RATE, sends a second (0: 2).
	Rate   float64
	APIURL *url.URL
	APIKey string
	// Timeout caps one send (0: 60 s: up to 40 MB go up).
	Timeout time.Duration
	// MaxBytes is Resend's limit on one email (0: MaxEmailBytes); tests
	// lower it.
	MaxBytes int
	// tracer is Config.Tracer: each send is a client span, and its request
	// carries traceparent.
	tracer trace.TracerProvider
}

// MaxEmailBytes is Resend's limit on one email, attachments included,
// counted here as sent (base64).
const MaxEmailBytes = 40 << 20

// Forward is the forward consumer's Destination: a support message, mail
// or form post alike, becomes one POST {RESEND_API_URL}/emails to the team
// with Idempotency-Key support-message/<id> (Resend keeps a key 24 h), so
// a retry after a crash between the send and its record is answered with
// the first send's email, not a second one.
type Forward struct {
	pool     *pgxpool.Pool
	client   *resend.Client
	http     *http.Client
	from     string
	fromAddr string
	domain   string
	to       []string
	timeout  time.Duration
	maxBytes int
	limit    *limiter
}

// NewForward returns the forward on pool (where the queue is).
func NewForward(pool *pgxpool.Pool, cfg ForwardConfig) *Forward {
	// The API key goes to RESEND_API_URL alone: a redirect is not
	// followed (a send is never moved elsewhere by Resend).
	hc := &http.Client{
		Transport:     tracing.Transport(cfg.tracer, nil),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	c := resend.NewCustomClient(hc, cfg.APIKey)
	if cfg.APIURL != nil {
		u := *cfg.APIURL
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
			u.RawPath = ""
		}
		c.BaseURL = &u
	}
	f := &Forward{pool: pool, client: c, http: hc, from: cfg.From, to: cfg.To,
		timeout: cfg.Timeout, maxBytes: cfg.MaxBytes, limit: newLimiter(cfg.Rate)}
	if a, err := mail.ParseAddress(cfg.From); err == nil {
		f.fromAddr = a.Address
	} else {
		f.fromAddr = strings.TrimSpace(cfg.From)
	}
	if i := strings.LastIndexByte(f.fromAddr, '@'); i >= 0 {
		f.domain = f.fromAddr[i+1:]
	}
	if f.timeout <= 0 {
		f.timeout = 60 * time.Second
	}
	if f.maxBytes <= 0 {
		f.maxBytes = MaxEmailBytes
	}
	return f
}

// threadOf is the forward's order key: the support message's thread, as
// the change's after holds it (the queued row), so that a thread's
// messages reach the team in order and a failing one holds back only its
// own thread.
func threadOf(ch ledger.Change) string {
	var row struct {
		ThreadID *int64 `json:"thread_id"`
	}
	if json.Unmarshal(ch.After, &row) != nil || row.ThreadID == nil {
		return ""
	}
	return "thread/" + strconv.FormatInt(*row.ThreadID, 10)
}

// message is what the forward reads of a support message.
type message struct {
	id, thread                       int64
	source                           string
	fromAddress, fromName, toAddress string
	subject, text, html, replyTo     string
	spf, dkim, dmarc, autoSubmitted  string
	receivedAt                       time.Time
	earlier                          []int64 // the thread's earlier messages, oldest first
	attachments                      []attachment
}

type attachment struct {
	id                               int64
	filename, contentType, contentID string
	size                             int64
	noContentReason                  string
	content                          []byte // loaded only for those that fit
}

const (
	messageSQL = `
SELECT id, coalesce(thread_id, id), source, from_address, coalesce(from_name, ''),
       coalesce(to_address, ''), coalesce(subject, ''), coalesce(text_body, ''),
       coalesce(html_body, ''), coalesce(reply_to, ''), coalesce(auth_spf, ''),
       coalesce(auth_dkim, ''), coalesce(auth_dmarc, ''), coalesce(auto_submitted, ''),
       received_at,
       ARRAY(SELECT e.id FROM support_messages e
             WHERE e.thread_id = coalesce(m.thread_id, m.id) AND e.id < m.id ORDER BY e.id)
FROM support_messages m WHERE id = $1`
	// The content is read apart, only for the attachments that fit.
	attachmentsSQL = `
SELECT id, coalesce(filename, ''), coalesce(content_type, ''), coalesce(content_id, ''),
       coalesce(octet_length(content), size, -1), coalesce(no_content_reason, '')
FROM support_attachments WHERE support_message_id = $1 ORDER BY id`
	contentSQL = `SELECT id, content FROM support_attachments WHERE id = ANY($1::bigint[])`
)

// errGone: the change names a message no longer in the queue.
var errGone = errors.New("the support message is no longer in the queue")

// load reads the message id, its thread's earlier messages and its
// attachments, with the content of those that fit in budget bytes (as
// base64); the connection is given back before anything is sent.
func (f *Forward) load(ctx context.Context, id int64, budget int) (message, error) {
	var m message
	err := f.pool.QueryRow(ctx, messageSQL, id).Scan(&m.id, &m.thread, &m.source, &m.fromAddress,
		&m.fromName, &m.toAddress, &m.subject, &m.text, &m.html, &m.replyTo, &m.spf, &m.dkim,
		&m.dmarc, &m.autoSubmitted, &m.receivedAt, &m.earlier)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, errGone
	}
	if err != nil {
		return m, fmt.Errorf("read support message %d: %w", id, err)
	}
	rows, err := f.pool.Query(ctx, attachmentsSQL, id)
	if err != nil {
		return m, fmt.Errorf("read attachments of %d: %w", id, err)
	}
	m.attachments, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (attachment, error) {
		var a attachment
		err := row.Scan(&a.id, &a.filename, &a.contentType, &a.contentID, &a.size, &a.noContentReason)
		return a, err
	})
	if err != nil {
		return m, fmt.Errorf("read attachments of %d: %w", id, err)
	}
	// Attachments go in their order while they fit; one that does not is
	// named in the text, and a smaller one after it may still go.
	byID := map[int64]*attachment{}
	var fit []int64
	left := budget - base64.StdEncoding.EncodedLen(len(m.text)+len(m.html)) - 64<<10 // the header block, JSON, headers
	for i := range m.attachments {
		a := &m.attachments[i]
		if a.noContentReason != "" || a.size < 0 {
			continue
		}
		if n := base64.StdEncoding.EncodedLen(int(a.size)); n <= left {
			left -= n
			fit = append(fit, a.id)
			byID[a.id] = a
		}
	}
	if len(fit) == 0 {
		return m, nil
	}
	rows, err = f.pool.Query(ctx, contentSQL, fit)
	if err != nil {
		return m, fmt.Errorf("read attachment content of %d: %w", id, err)
	}
	var aid int64
	var content []byte
	_, err = pgx.ForEachRow(rows, []any{&aid, &content}, func() error {
		byID[aid].content = content
		return nil
	})
	if err != nil {
		return m, fmt.Errorf("read attachment content of %d: %w", id, err)
	}
	return m, nil
}

// Deliver forwards the support message ch announces.
func (f *Forward) Deliver(ctx context.Context, ch ledger.Change) (string, error) {
	if ch.Kind != ledger.KindSupportMessage {
		return "", fmt.Errorf("%w: a %s change, not a support message", ErrSkip, ch.Kind)
	}
	if len(ch.Before) > 0 && string(ch.Before) != "null" {
		return "", fmt.Errorf("%w: a change to a queued message, not a new one", ErrSkip)
	}
	id, err := strconv.ParseInt(ch.Subject, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: subject %q is not a support message id", ErrPermanent, ch.Subject)
	}
	m, err := f.load(ctx, id, f.maxBytes)
	if errors.Is(err, errGone) {
		return "", fmt.Errorf("%w: %w", ErrSkip, err)
	}
	if err != nil {
		return "", err
	}
	if reason := f.loop(m); reason != "" {
		return "", fmt.Errorf("%w: %s", ErrSkip, reason)
	}
	if err := f.limit.wait(ctx); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	return f.send(ctx, f.email(m), "support-message/"+strconv.FormatInt(id, 10))
}

// loop says why m must not be forwarded ("" when it may): the team's own
// mail (a forward coming back, a reply sent to support) and automatic
// mail (an auto-reply, a bounce) would go round between two mailboxes.
func (f *Forward) loop(m message) string {
	from := strings.ToLower(strings.TrimSpace(m.fromAddress))
	if f.fromAddr != "" && from == strings.ToLower(f.fromAddr) {
		return "from SUPPORT_FORWARD_FROM's address (a forward of ours)"
	}
	for _, to := range f.to {
		if from == strings.ToLower(strings.TrimSpace(to)) {
			return "from " + to + ", one of SUPPORT_FORWARD_TO (the team's own mail)"
		}
	}
	if a := strings.ToLower(strings.TrimSpace(m.autoSubmitted)); a != "" && a != "no" {
		return "Auto-Submitted: " + m.autoSubmitted + " (an automatic message)"
	}
	return ""
}

// sendEmail is the body of POST /emails
// (https://resend.com/docs/api-reference/emails/send-email). It is local
// because resend-go v3.1.1's SendEmailRequest sends an attachment's
// content as a JSON array of numbers (four to five bytes a byte: a 30 MB
// attachment would cross the 40 MB limit) where the API takes base64.
type sendEmail struct {
	From        string            `json:"from"`
	To          []string          `json:"to"`
	Subject     string            `json:"subject"`
	ReplyTo     string            `json:"reply_to,omitempty"`
	Text        string            `json:"text"`
	HTML        string            `json:"html,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Attachments []sendAttachment  `json:"attachments,omitempty"`
}

type sendAttachment struct {
	Filename    string `json:"filename"`
	Content     string `json:"content"`
	ContentType string `json:"content_type,omitempty"`
	// ContentID makes an inline image that the HTML shows by cid:.
	ContentID string `json:"content_id,omitempty"`
}

// email builds the forward of m.
func (f *Forward) email(m message) sendEmail {
	e := sendEmail{
		From:    f.from,
		To:      f.to,
		Subject: m.subject,
		ReplyTo: m.replyTo,
		Headers: f.threading(m),
	}
	if e.ReplyTo == "" {
		e.ReplyTo = m.fromAddress
	}
	if strings.TrimSpace(e.Subject) == "" {
		e.Subject = fmt.Sprintf("Support message #%d", m.id)
	}
	var left []string // attachments named, not attached
	for _, a := range m.attachments {
		if a.content == nil {
			left = append(left, leftOut(a))
			continue
		}
		e.Attachments = append(e.Attachments, sendAttachment{
			Filename:    a.filename,
			Content:     base64.StdEncoding.EncodeToString(a.content),
			ContentType: a.contentType,
			ContentID:   strings.Trim(a.contentID, "<>"),
		})
	}
	header := headerBlock(m, left)
	e.Text = header + "\n" + strings.Repeat("-", 60) + "\n\n" + m.text
	if m.html != "" {
		e.HTML = `<div style="font-family:monospace;white-space:pre-wrap;border-bottom:1px solid #ccc;padding-bottom:8px;margin-bottom:12px">` +
			html.EscapeString(header) + "</div>\n" + m.html
	}
	return e
}

// headerBlock says who wrote, when, to which address, and whether the
// sender is authenticated (DMARC), for the team at the top of the forward.
func headerBlock(m message, left []string) string {
	var b strings.Builder
	from := m.fromAddress
	if m.fromName != "" {
		from = (&mail.Address{Name: m.fromName, Address: m.fromAddress}).String()
	}
	fmt.Fprintf(&b, "From: %s\n", from)
	if m.replyTo != "" && !strings.EqualFold(m.replyTo, m.fromAddress) {
		fmt.Fprintf(&b, "Reply-To: %s\n", m.replyTo)
	}
	fmt.Fprintf(&b, "Date: %s\n", m.receivedAt.UTC().Format("Mon, 2 Jan 2006 15:04:05 MST"))
	switch {
	case m.source == "web":
		b.WriteString("To: the support form (the address is as typed: not verified)\n")
	default:
		fmt.Fprintf(&b, "To: %s\n", m.toAddress)
		fmt.Fprintf(&b, "DMARC: %s (SPF %s, DKIM %s)\n", orUnknown(m.dmarc), orUnknown(m.spf), orUnknown(m.dkim))
	}
	fmt.Fprintf(&b, "Support message: #%d", m.id)
	if m.thread != m.id {
		fmt.Fprintf(&b, " (thread #%d)", m.thread)
	}
	b.WriteString("\n")
	for _, l := range left {
		fmt.Fprintf(&b, "Not attached: %s\n", l)
	}
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// leftOut names an attachment that is not attached, and why.
func leftOut(a attachment) string {
	name := a.filename
	if name == "" {
		name = "(no name)"
	}
	switch {
	case a.noContentReason != "":
		return fmt.Sprintf("%s (not stored: %s)", name, a.noContentReason)
	case a.size >= 0:
		return fmt.Sprintf("%s (%.1f MB: over Resend's 40 MB per email; kept in the queue)", name, float64(a.size)/(1<<20))
	}
	return name
}

// threading gives the forward a Message-ID of its own and, for a message
// that joins a thread, In-Reply-To and References naming the thread's
// earlier forwards (their Message-IDs are made the same way from their
// ids), so the team's mail client shows one thread as one thread.
func (f *Forward) threading(m message) map[string]string {
	h := map[string]string{"Message-ID": f.messageID(m.id)}
	if len(m.earlier) == 0 {
		return h
	}
	// RFC 5322 keeps the first and the latest when References grows long.
	refs := m.earlier
	if len(refs) > 20 {
		refs = append([]int64{refs[0]}, refs[len(refs)-19:]...)
	}
	ids := make([]string, len(refs))
	for i, id := range refs {
		ids[i] = f.messageID(id)
	}
	h["In-Reply-To"] = ids[len(ids)-1]
	h["References"] = strings.Join(ids, " ")
	return h
}

func (f *Forward) messageID(id int64) string {
	domain := f.domain
	if domain == "" {
		domain = "munchable-webhooks.invalid"
	}
	return fmt.Sprintf("<support-message-%d@%s>", id, domain)
}

// send performs POST /emails. resend-go builds the request (base URL,
// Authorization, User-Agent, Idempotency-Key); the answer is read here,
// because resend-go's Perform reduces every failure but a 429 to a
// message, and the relay needs the status (a 4xx is dead, a 5xx is
// retried) and a 503's Retry-After as well as a 429's.
func (f *Forward) send(ctx context.Context, e sendEmail, key string) (string, error) {
	req, err := f.client.NewRequestWithOptions(ctx, http.MethodPost, "emails", e, &resend.SendEmailOptions{IdempotencyKey: key})
	if err != nil {
		return "", fmt.Errorf("%w: build request: %w", ErrPermanent, err)
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("send to Resend: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("send to Resend: read answer: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		var sent resend.SendEmailResponse
		if err := json.Unmarshal(body, &sent); err != nil || sent.Id == "" {
			return "", fmt.Errorf("send to Resend: answer %d without an email id: %.200q", resp.StatusCode, body)
		}
		return sent.Id, nil
	}
	return "", answerError(resp, body)
}

// answerError classifies a failed send: 429 and 503 come back after their
// Retry-After; 408, 5xx and a 409 for a concurrent request with the same
// key (the first send still running) are retried on the schedule; any
// other 4xx (a refused sender, a bad address) is dead at once, with
// Resend's message.
func answerError(resp *http.Response, body []byte) error {
	var answer struct {
		Name    string `json:"name"`
		Message string `json:"message"`
	}
	_ = json.Unmarshal(body, &answer)
	msg := answer.Message
	if msg == "" {
		msg = strings.TrimSpace(string(body[:min(len(body), 200)]))
	}
	err := fmt.Errorf("resend answered %d %s: %s", resp.StatusCode, answer.Name, msg)
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if after, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return &RetryAfterError{After: after, Err: err}
		}
		return err
	case code == http.StatusRequestTimeout || code >= 500:
		return err
	case code == http.StatusConflict && answer.Name == "concurrent_idempotent_requests":
		return err
	case code >= 400:
		return fmt.Errorf("%w: %w", ErrPermanent, err)
	}
	return err // 1xx, 3xx: not an answer the API gives
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// limiter spaces sends 1/rate apart (SUPPORT_FORWARD_RATE), under
// Resend's per-team rate limit; a 429 that comes all the same is retried
// after its Retry-After.
type limiter struct {
	mu    sync.Mutex
	every time.Duration
	next  time.Time
}

func newLimiter(rate float64) *limiter {
	if rate <= 0 {
		rate = 2
	}
	return &limiter{every: time.Duration(float64(time.Second) / rate)}
}

// wait returns when the caller may send, or when ctx ends.
func (l *limiter) wait(ctx context.Context) error {
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) {
		at = now
	}
	l.next = at.Add(l.every)
	l.mu.Unlock()
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
