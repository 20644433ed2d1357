package relay_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/relay"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// sent is one POST /emails as the stand-in received it.
type sent struct {
	Key  string
	Auth string
	Body map[string]any
}

// resendStandIn stands in for Resend's POST /emails: it keeps an
// Idempotency-Key as Resend does (the same key answers the first email's
// id, and sends nothing), and answers from a script first when one is set.
type resendStandIn struct {
	srv *httptest.Server

	mu      sync.Mutex
	posts   []sent            // every request
	emails  map[string]string // key -> email id: the emails actually sent
	answers []func(w http.ResponseWriter) bool
}

func newResendStandIn(t *testing.T) *resendStandIn {
	t.Helper()
	s := &resendStandIn{emails: map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *resendStandIn) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/emails" {
		http.NotFound(w, r)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, `{"name":"validation_error","message":"bad json"}`, http.StatusUnprocessableEntity)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.posts = append(s.posts, sent{Key: key, Auth: r.Header.Get("Authorization"), Body: body})
	if len(s.answers) > 0 {
		answer := s.answers[0]
		s.answers = s.answers[1:]
		if answer(w) {
			return
		}
	}
	id, ok := s.emails[key]
	if !ok {
		id = fmt.Sprintf("email_%d", len(s.emails)+1)
		s.emails[key] = id
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// then queues answers for the next requests: status, headers and body.
func (s *resendStandIn) then(status int, header map[string]string, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers = append(s.answers, func(w http.ResponseWriter) bool {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
		return true
	})
}

func (s *resendStandIn) requests() []sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sent(nil), s.posts...)
}

func (s *resendStandIn) sentCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.emails)
}

const (
	team = "team@munchable.test"
	from = "Munchable Support <support-forward@munchable.test>"
)

// forwarding runs a relay with the forward consumer on pool, sending to
// the stand-in, until the test ends, and waits for the consumer to take
// its place (at the end of the feed).
func forwarding(t *testing.T, pool *pgxpool.Pool, resend *resendStandIn, maxBytes int) *relay.Relay {
	t.Helper()
	u, _ := url.Parse(resend.srv.URL)
	r := relay.New(relay.Config{
		Pool: pool,
		Forward: relay.ForwardConfig{To: []string{team}, From: from, Rate: 1000,
			APIURL: u, APIKey: "re_test", MaxBytes: maxBytes},
		Schedule: []time.Duration{time.Millisecond, time.Hour},
		Poll:     10 * time.Millisecond,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the forward consumer's row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM feed_consumers WHERE name = 'forward'`).Scan(&n)
		return n == 1
	})
	return r
}

// enqueue queues m with attachments (name -> content; nil content: not
// stored, too large) and returns its id.
func enqueue(t *testing.T, pool *pgxpool.Pool, m support.Message, files ...file) int64 {
	t.Helper()
	q := support.NewQueue(pool)
	id, _, err := q.EnqueueWith(context.Background(), m, func(ctx context.Context, a *support.Attachments) error {
		for i, f := range files {
			at := support.Attachment{ExternalID: fmt.Sprint("att_", i), Filename: f.name, ContentType: f.contentType,
				ContentID: f.contentID, Size: int64(len(f.content))}
			var r io.Reader
			if f.content == nil {
				at.NoContentReason, at.Size = support.NoContentTooLarge, 50<<20
			} else {
				r = bytes.NewReader(f.content)
			}
			if err := a.Add(ctx, at, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

type file struct {
	name, contentType, contentID string
	content                      []byte
}

func mail(externalID, fromAddr, subject string) support.Message {
	return support.Message{
		Source: support.SourceEmail, ExternalID: externalID, FromAddress: fromAddr, FromName: "Jane Doe",
		ToAddress: "support@munchable.test", Subject: subject, TextBody: "My order never came.",
		MessageID:  "<" + externalID + "@mail.example.com>",
		ReceivedAt: time.Date(2026, 12, 5, 7, 30, 0, 0, time.UTC),
		AuthSPF:    "pass", AuthDKIM: "pass", AuthDMARC: "pass", SenderAuthenticated: ptr(true),
	}
}

func ptr[T any](v T) *T { return &v }

// forwardState waits for the forward of support message id to reach want.
func forwardState(t *testing.T, pool *pgxpool.Pool, id int64, want relay.State) relay.Delivery {
	t.Helper()
	var got relay.Delivery
	waitFor(t, fmt.Sprintf("forward of message %d %s", id, want), func() bool {
		_ = relay.List(context.Background(), pool, relay.ForwardConsumer, "", func(d relay.Delivery) error {
			if d.Subject == fmt.Sprint(id) {
				got = d
			}
			return nil
		})
		return got.State == want
	})
	return got
}

// TestForwardMailAndForm: a mail (with its HTML, attachments and thread)
// and a form post each become one send, as the team should see them.
func TestForwardMailAndForm(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	resend := newResendStandIn(t)
	forwarding(t, pool, resend, 0)

	pdf := []byte("%PDF-1.4 receipt")
	png := []byte("\x89PNG\r\n\x1a\n")
	m1 := mail("first", "jane@example.com", "Where is my order?")
	m1.HTMLBody = `<p>My order never came.</p><img src="cid:logo">`
	m1.ReplyTo = "jane.doe@work.example.com"
	id1 := enqueue(t, pool, m1,
		file{name: "receipt.pdf", contentType: "application/pdf", content: pdf},
		file{name: "logo.png", contentType: "image/png", contentID: "<logo>", content: png},
		file{name: "video.mov", contentType: "video/quicktime"})
	m2 := mail("second", "jane@example.com", "Re: Where is my order?")
	m2.TextBody = "Any news?"
	m2.InReplyTo = m1.MessageID
	id2 := enqueue(t, pool, m2)
	form := support.Message{Source: support.SourceWeb, ExternalID: "form:1", FromAddress: "bob@example.org",
		FromName: "Bob", Subject: "Billing question", TextBody: "Why was I charged twice?",
		ReceivedAt: time.Date(2026, 12, 5, 7, 45, 0, 0, time.UTC)}
	id3 := enqueue(t, pool, form)

	for _, id := range []int64{id1, id2, id3} {
		d := forwardState(t, pool, id, relay.Delivered)
		if d.Result == nil || !strings.HasPrefix(*d.Result, "email_") {
			t.Errorf("message %d: result %v, want Resend's email id", id, d.Result)
		}
	}
	posts := resend.requests()
	if len(posts) != 3 {
		t.Fatalf("%d sends, want 3", len(posts))
	}
	byKey := map[string]sent{}
	for _, p := range posts {
		byKey[p.Key] = p
		if p.Auth != "Bearer re_test" {
			t.Errorf("Authorization %q", p.Auth)
		}
	}
	key := func(id int64) string { return fmt.Sprintf("support-message/%d", id) }
	first := byKey[key(id1)].Body
	if first == nil {
		t.Fatalf("no send with Idempotency-Key %s: %v", key(id1), posts)
	}
	want := map[string]any{
		"from":     from,
		"to":       []any{team},
		"reply_to": "jane.doe@work.example.com",
		"subject":  "Where is my order?",
		"headers":  map[string]any{"Message-ID": fmt.Sprintf("<support-message-%d@munchable.test>", id1)},
		"attachments": []any{
			map[string]any{"filename": "receipt.pdf", "content": base64.StdEncoding.EncodeToString(pdf), "content_type": "application/pdf"},
			map[string]any{"filename": "logo.png", "content": base64.StdEncoding.EncodeToString(png), "content_type": "image/png", "content_id": "logo"},
		},
	}
	got := map[string]any{}
	for k := range want {
		got[k] = first[k]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mail forward (-want +got):\n%s", diff)
	}
	text, _ := first["text"].(string)
	for _, s := range []string{"From: \"Jane Doe\" <jane@example.com>", "Reply-To: jane.doe@work.example.com",
		"Date: Sat, 5 Dec 2026 07:30:00 UTC", "To: support@munchable.test", "DMARC: pass (SPF pass, DKIM pass)",
		"Not attached: video.mov (not stored: too_large)", "My order never came."} {
		if !strings.Contains(text, s) {
			t.Errorf("mail forward's text lacks %q:\n%s", s, text)
		}
	}
	if html, _ := first["html"].(string); !strings.HasSuffix(html, m1.HTMLBody) || !strings.Contains(html, "DMARC: pass") {
		t.Errorf("mail forward's html = %q, want the header block, then the original", html)
	}

	reply := byKey[key(id2)].Body
	wantHeaders := map[string]any{
		"Message-ID":  fmt.Sprintf("<support-message-%d@munchable.test>", id2),
		"In-Reply-To": fmt.Sprintf("<support-message-%d@munchable.test>", id1),
		"References":  fmt.Sprintf("<support-message-%d@munchable.test>", id1),
	}
	if diff := cmp.Diff(wantHeaders, reply["headers"]); diff != "" {
		t.Errorf("the thread's second forward's headers (-want +got):\n%s", diff)
	}

	formSend := byKey[key(id3)].Body
	if formSend["reply_to"] != "bob@example.org" || formSend["subject"] != "Billing question" || formSend["html"] != nil {
		t.Errorf("form forward = %v", formSend)
	}
	if text, _ := formSend["text"].(string); !strings.Contains(text, "To: the support form") || !strings.Contains(text, "Why was I charged twice?") {
		t.Errorf("form forward's text:\n%s", text)
	}
	if testing.Verbose() {
		b, _ := json.MarshalIndent(first, "", "  ")
		t.Logf("the forward of a mail, as sent to POST /emails:\n%s", b)
	}
}

// TestForwardOverResendLimit: an attachment that would take the email
// over Resend's limit is named in the text, not attached.
func TestForwardOverResendLimit(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	resend := newResendStandIn(t)
	forwarding(t, pool, resend, 200<<10) // a 200 KiB limit stands for Resend's 40 MB
	big := bytes.Repeat([]byte("x"), 150<<10)
	small := []byte("small")
	id := enqueue(t, pool, mail("big", "jane@example.com", "Files"),
		file{name: "big.bin", contentType: "application/octet-stream", content: big},
		file{name: "small.txt", contentType: "text/plain", content: small})
	forwardState(t, pool, id, relay.Delivered)
	body := resend.requests()[0].Body
	atts, _ := body["attachments"].([]any)
	if len(atts) != 1 || atts[0].(map[string]any)["filename"] != "small.txt" {
		t.Errorf("attachments = %v, want small.txt alone", atts)
	}
	if text, _ := body["text"].(string); !strings.Contains(text, "Not attached: big.bin (0.1 MB: over Resend's 40 MB per email") {
		t.Errorf("text does not name big.bin:\n%s", text)
	}
}

// TestForwardSkipsLoops: the team's own mail, a forward of ours coming
// back and automatic mail are queued but never forwarded.
func TestForwardSkipsLoops(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	resend := newResendStandIn(t)
	forwarding(t, pool, resend, 0)
	auto := mail("auto", "jane@example.com", "Out of office")
	auto.AutoSubmitted = "auto-replied"
	human := mail("human", "jane@example.com", "Hello")
	human.AutoSubmitted = "no"
	cases := []struct {
		id     int64
		want   relay.State
		reason string
	}{
		{enqueue(t, pool, mail("team", "TEAM@munchable.test", "Re: Where is my order?")), relay.Skipped, "one of SUPPORT_FORWARD_TO"},
		{enqueue(t, pool, mail("self", "support-forward@munchable.test", "Where is my order?")), relay.Skipped, "SUPPORT_FORWARD_FROM"},
		{enqueue(t, pool, auto), relay.Skipped, "Auto-Submitted: auto-replied"},
		{enqueue(t, pool, human), relay.Delivered, ""},
	}
	for _, c := range cases {
		d := forwardState(t, pool, c.id, c.want)
		if c.reason != "" && (d.LastError == nil || !strings.Contains(*d.LastError, c.reason)) {
			t.Errorf("message %d skipped with %v, want the reason %q", c.id, d.LastError, c.reason)
		}
	}
	if posts := resend.requests(); len(posts) != 1 || posts[0].Key != fmt.Sprintf("support-message/%d", cases[3].id) {
		t.Errorf("sends = %v, want the human's message alone", posts)
	}
}

// TestForwardResendAnswers: a 5xx is retried with the same
// Idempotency-Key, a 429 waits for its Retry-After, a 422 is dead at once.
func TestForwardResendAnswers(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	resend := newResendStandIn(t)
	forwarding(t, pool, resend, 0)

	resend.then(http.StatusInternalServerError, nil, `{"name":"internal_server_error","message":"oops"}`)
	retried := enqueue(t, pool, mail("retried", "a@example.com", "1"))
	d := forwardState(t, pool, retried, relay.Delivered)
	if d.Attempts != 2 {
		t.Errorf("after a 500: %d attempts, want 2", d.Attempts)
	}
	if posts := resend.requests(); len(posts) != 2 || posts[0].Key != posts[1].Key {
		t.Errorf("the retry's Idempotency-Key differs: %v", posts)
	}

	resend.then(http.StatusTooManyRequests, map[string]string{"Retry-After": "3600"}, `{"name":"rate_limit_exceeded","message":"Too many requests"}`)
	limited := enqueue(t, pool, mail("limited", "b@example.com", "2"))
	d = forwardState(t, pool, limited, relay.Failed)
	if d.NextAttemptAt == nil || time.Until(*d.NextAttemptAt) < 50*time.Minute {
		t.Errorf("after a 429 with Retry-After 3600: next attempt %v, want an hour from now", d.NextAttemptAt)
	}

	resend.then(http.StatusUnprocessableEntity, nil, `{"name":"validation_error","message":"Invalid to field"}`)
	refused := enqueue(t, pool, mail("refused", "c@example.com", "3"))
	d = forwardState(t, pool, refused, relay.Dead)
	if d.Attempts != 1 || d.LastError == nil || !strings.Contains(*d.LastError, "422 validation_error: Invalid to field") {
		t.Errorf("after a 422: %+v, want dead at once with Resend's answer", d)
	}
	if n := resend.sentCount(); n != 1 {
		t.Errorf("emails sent = %d, want 1", n)
	}
}

// TestForwardThreadOrder: a thread's messages reach the team in order: a
// reply waits while its thread's first message fails; another thread
// does not.
func TestForwardThreadOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	resend := newResendStandIn(t)
	forwarding(t, pool, resend, 0)
	resend.then(http.StatusTooManyRequests, map[string]string{"Retry-After": "1"}, `{"name":"rate_limit_exceeded","message":"Too many requests"}`)
	first := mail("one", "jane@example.com", "Where is my order?")
	id1 := enqueue(t, pool, first)
	reply := mail("two", "jane@example.com", "Re: Where is my order?")
	reply.InReplyTo = first.MessageID
	id2 := enqueue(t, pool, reply)
	forwardState(t, pool, id2, relay.Delivered)
	var keys []string
	for _, p := range resend.requests() {
		keys = append(keys, p.Key)
	}
	want := []string{fmt.Sprintf("support-message/%d", id1), fmt.Sprintf("support-message/%d", id1), fmt.Sprintf("support-message/%d", id2)}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("sends in order (-want +got):\n%s", diff)
	}
}

// TestForwardFigures measures, on this machine, the forwards a second
// under SUPPORT_FORWARD_RATE and the lag from a message's queueing to
// Resend's answer. Figures only (no assertion); set RELAY_FIGURES=1.
func TestForwardFigures(t *testing.T) {
	if os.Getenv("RELAY_FIGURES") == "" {
		t.Skip("figures: set RELAY_FIGURES=1")
	}
	for _, c := range []struct {
		rate     float64
		messages int
	}{{2, 20}, {1000, 500}} {
		t.Run(fmt.Sprint("rate ", c.rate), func(t *testing.T) {
			pool := dbtest.NewPool(t)
			resend := newResendStandIn(t)
			var mu sync.Mutex
			var at []time.Time
			resend.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
				resend.serve(w, r)
			})
			u, _ := url.Parse(resend.srv.URL)
			r := relay.New(relay.Config{Pool: pool, Poll: 100 * time.Millisecond,
				Forward: relay.ForwardConfig{To: []string{team}, From: from, Rate: c.rate, APIURL: u, APIKey: "re_test"}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx, nil) }()
			t.Cleanup(func() { cancel(); <-done })
			waitFor(t, "the consumer", func() bool {
				var n int
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM feed_consumers`).Scan(&n)
				return n == 1
			})
			start := time.Now()
			for i := range c.messages {
				enqueue(t, pool, mail(fmt.Sprint("fig-", i), fmt.Sprintf("c%d@example.com", i), "Figure"))
			}
			queued := time.Since(start)
			deadline := time.Now().Add(5 * time.Minute)
			for resend.sentCount() < c.messages && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			first, last := at[0], at[len(at)-1]
			mu.Unlock()
			var lags []float64
			rows, err := pool.Query(ctx, `SELECT extract(epoch FROM d.delivered_at - m.created_at)
FROM relay_deliveries d JOIN support_messages m ON m.id = d.subject::bigint WHERE d.state = 'delivered'`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var l float64
				_ = rows.Scan(&l)
				lags = append(lags, l)
			}
			rows.Close()
			slices.Sort(lags)
			q := func(p float64) time.Duration {
				return time.Duration(lags[int(p*float64(len(lags)-1))] * float64(time.Second)).Round(time.Millisecond)
			}
			t.Logf("FIGURE rate %v: %d messages queued in %v; %d sends, first to last %v = %.2f forwards/s; lag queued->delivered p50 %v p99 %v max %v",
				c.rate, c.messages, queued.Round(time.Millisecond), resend.sentCount(), last.Sub(first).Round(time.Millisecond),
				float64(len(at)-1)/last.Sub(first).Seconds(), q(.5), q(.99), q(1))
		})
	}
}
