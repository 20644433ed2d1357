package resendhook_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/support"
)

const emailID = "4ef9a417-02e9-4d39-ad75-9611e0fcc33c"

// fixtureRow is the row the fixture email becomes, delivered to support@.
func fixtureRow(externalID string) row {
	return row{
		Source:      "email",
		ExternalID:  externalID,
		FromAddress: "ada@example.com",
		FromName:    "Ada Lovelace",
		ToAddress:   "support@munchable.app",
		Subject:     "Where is my order?",
		TextBody:    "Hello,\n\norder #42 has not arrived & it's been a week.\n",
		HTMLBody:    "<html><head><style>p { color: red; }</style></head><body><p>Hello,</p><p>order <b>#42</b> has not arrived &amp; it&#39;s been a week.</p></body></html>",
		MessageID:   "<CAF=4x2eJ7Q@mail.example.com>",
		ReceivedAt:  time.Date(2026, 2, 22, 23, 41, 11, 894719000, time.UTC),
		Thread:      externalID,
		AuthSPF:     "pass", AuthDKIM: "pass", AuthDMARC: "pass",
		SenderAuthenticated: ptr(true),
	}
}

func ptr[T any](v T) *T { return &v }

func checkAnswer(t *testing.T, what string, got, want answer) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: answer (-want +got):\n%s", what, diff)
	}
}

func checkRows(t *testing.T, h *harness, want []row) {
	t.Helper()
	checkTable(t, "support_messages", want, h.rows(t))
}

func checkTable[R any](t *testing.T, table string, want, got []R) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", table, diff)
	}
}

func TestFirstDelivery(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)

	w := h.deliver(t, "msg_first", receivedEvent(t, emailID, nil))

	checkAnswer(t, "first delivery", answerOf(t, w), processed)
	checkRows(t, h, []row{fixtureRow(emailID)})
	if got := h.api.fetchCount(emailID); got != 1 {
		t.Errorf("fetches = %d, want 1", got)
	}
	if got := h.claimState(t, "msg_first"); got != claim.Done {
		t.Errorf("claim state = %q, want done", got)
	}
}

func TestRedeliverySkipsFetch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)

	checkAnswer(t, "first delivery", answerOf(t, h.deliver(t, "msg_1", body)), processed)
	checkAnswer(t, "redelivery", answerOf(t, h.deliver(t, "msg_1", body)), duplicate)

	if got := h.api.fetchCount(emailID); got != 1 {
		t.Errorf("fetches = %d, want 1: a done claim must not fetch again", got)
	}
	checkRows(t, h, []row{fixtureRow(emailID)})
}

// TestSameEmailTwoMessages: a second Svix message for one email (a replay
// from the dashboard, say) passes the claim, and the store keeps one row.
func TestSameEmailTwoMessages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)

	checkAnswer(t, "first message", answerOf(t, h.deliver(t, "msg_1", body)), processed)
	checkAnswer(t, "second message", answerOf(t, h.deliver(t, "msg_2", body)), processed)

	if got := h.api.fetchCount(emailID); got != 2 {
		t.Errorf("fetches = %d, want 2", got)
	}
	checkRows(t, h, []row{fixtureRow(emailID)})
}

func TestMessageIDDedupe(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	// The same mail, received twice by Resend (two recipients, a resend):
	// two email ids, one Message-ID, the same content.
	h.api.addEmail(t, "email-a", nil)
	h.api.addEmail(t, "email-b", nil)
	// A different mail whose sender reused the Message-ID.
	h.api.addEmail(t, "email-c", func(e map[string]any) { e["text"] = "A different question." })

	for i, id := range []string{"email-a", "email-b", "email-c"} {
		w := h.deliver(t, "msg_"+strconv.Itoa(i), receivedEvent(t, id, nil))
		checkAnswer(t, id, answerOf(t, w), processed)
	}

	other := fixtureRow("email-c")
	other.TextBody = "A different question."
	checkRows(t, h, []row{fixtureRow("email-a"), other})
}

func TestNotForSupport(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, func(d map[string]any) {
		d["to"] = []string{"billing@munchable.app", "support@munchable.app.evil.example"}
		d["cc"] = []string{"Support <support@elsewhere.example>"}
	})

	checkAnswer(t, "mail for someone else", answerOf(t, h.deliver(t, "msg_other", body)), ignored)

	if got := h.api.totalFetches(); got != 0 {
		t.Errorf("fetches = %d, want 0", got)
	}
	if got := h.counter(t, "resend_inbound_ignored_total"); got != 1 {
		t.Errorf("resend_inbound_ignored_total = %v, want 1", got)
	}
	if keys := h.claimKeys(t); len(keys) != 0 {
		t.Errorf("claim keys = %v, want none", keys)
	}
	checkRows(t, h, nil)
}

func TestRecipientMatching(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	tests := []struct {
		name   string
		change func(d map[string]any)
		wantTo string
	}{
		{"to, exact", nil, "support@munchable.app"},
		{"to, other case and display name", func(d map[string]any) {
			d["to"] = []string{"Munchable Support <SUPPORT@munchable.APP>"}
		}, "support@munchable.app"},
		{"cc", func(d map[string]any) {
			d["to"] = []string{"friend@example.com"}
			d["cc"] = []string{"support@munchable.app"}
		}, "support@munchable.app"},
		{"received_for as a list", func(d map[string]any) {
			d["to"] = []string{"friend@example.com"}
			d["received_for"] = []string{"support@munchable.app"}
		}, "support@munchable.app"},
		{"received_for as a string", func(d map[string]any) {
			d["to"] = []string{"friend@example.com"}
			d["received_for"] = "support@munchable.app"
		}, "support@munchable.app"},
		{"received_for of an unexpected shape is no recipient, to still counts", func(d map[string]any) {
			d["received_for"] = map[string]any{"weird": true}
		}, "support@munchable.app"},
		{"domain entry, any case", func(d map[string]any) {
			d["to"] = []string{"Help@INBOUND.munchable.app"}
		}, "help@inbound.munchable.app"},
		{"to as one comma-separated string", func(d map[string]any) {
			d["to"] = "friend@example.com, Team <team@inbound.munchable.app>"
		}, "team@inbound.munchable.app"},
		{"envelope recipient is preferred as the one stored", func(d map[string]any) {
			d["to"] = []string{"support@munchable.app"}
			d["received_for"] = []string{"desk@inbound.munchable.app"}
		}, "desk@inbound.munchable.app"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := "email-" + strconv.Itoa(i)
			h.api.addEmail(t, id, func(e map[string]any) {
				e["text"] = "case " + id // its own content, so each case is its own row
			})
			w := h.deliver(t, "msg_"+id, receivedEvent(t, id, tc.change))
			checkAnswer(t, tc.name, answerOf(t, w), processed)
			var got []string
			for _, r := range h.rows(t) {
				if r.ExternalID == id {
					got = append(got, r.ToAddress)
				}
			}
			if diff := cmp.Diff([]string{tc.wantTo}, got); diff != "" {
				t.Errorf("to_address (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOtherEventTypes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	tests := []struct {
		typ  string
		data any
	}{
		{"email.sent", map[string]any{"email_id": emailID, "to": []string{"support@munchable.app"}, "subject": "x"}},
		{"email.delivered", map[string]any{"email_id": emailID, "to": []string{"support@munchable.app"}}},
		{"contact.created", map[string]any{"id": "c1", "email": "ada@example.com", "unsubscribed": false}},
		{"domain.updated", []any{"an", "unexpected", "shape"}},
	}
	for i, tc := range tests {
		w := h.deliver(t, "msg_"+strconv.Itoa(i), event(t, tc.typ, tc.data))
		checkAnswer(t, tc.typ, answerOf(t, w), ignored)
	}
	if got := h.api.totalFetches(); got != 0 {
		t.Errorf("fetches = %d, want 0", got)
	}
	if keys := h.claimKeys(t); len(keys) != 0 {
		t.Errorf("claim keys = %v, want none", keys)
	}
	if got := h.counter(t, "resend_inbound_ignored_total"); got != 0 {
		t.Errorf("resend_inbound_ignored_total = %v, want 0 (it counts only mail for others)", got)
	}
	checkRows(t, h, nil)
}

// TestAPIFailureReleasesClaim: a failed fetch fails the delivery and frees
// its claim, so Svix's retry is a first delivery and succeeds.
func TestAPIFailureReleasesClaim(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusTooManyRequests, http.StatusUnauthorized} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, options{})
			h.api.addEmail(t, emailID, nil)
			h.api.failWith(emailID, status)
			body := receivedEvent(t, emailID, nil)

			checkAnswer(t, "while the API fails", answerOf(t, h.deliver(t, "msg_1", body)), failed)
			if keys := h.claimKeys(t); len(keys) != 0 {
				t.Errorf("claim keys after the failure = %v, want none (released)", keys)
			}
			checkRows(t, h, nil)

			h.api.failWith(emailID, 0)
			checkAnswer(t, "retry", answerOf(t, h.deliver(t, "msg_1", body)), processed)
			checkRows(t, h, []row{fixtureRow(emailID)})
			if got := h.api.fetchCount(emailID); got != 2 {
				t.Errorf("fetches = %d, want 2", got)
			}
		})
	}
}

func TestAPIHangsPastDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{handlerTimeout: 300 * time.Millisecond})
	h.api.addEmail(t, emailID, nil)
	h.api.hangOn(emailID, true)
	body := receivedEvent(t, emailID, nil)

	start := time.Now()
	w := h.deliver(t, "msg_1", body)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("delivery took %v, want about the 300ms deadline", took)
	}
	checkAnswer(t, "hung API", answerOf(t, w), failed)
	if keys := h.claimKeys(t); len(keys) != 0 {
		t.Errorf("claim keys = %v, want none (released)", keys)
	}
	checkRows(t, h, nil)

	h.api.hangOn(emailID, false)
	checkAnswer(t, "retry", answerOf(t, h.deliver(t, "msg_1", body)), processed)
	checkRows(t, h, []row{fixtureRow(emailID)})
}

// TestEmailNotFound: Resend just announced the email, so a 404 means the
// service asks the wrong API or with another team's key. The delivery fails
// (and is counted) so that Svix retries until the configuration is fixed.
func TestEmailNotFound(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := receivedEvent(t, emailID, nil) // the fake API does not know it yet

	checkAnswer(t, "404 for the email", answerOf(t, h.deliver(t, "msg_1", body)), failed)
	checkRows(t, h, nil)
	if got := h.counter(t, "resend_emails_unfetchable_total"); got != 1 {
		t.Errorf("resend_emails_unfetchable_total = %v, want 1", got)
	}
	if keys := h.claimKeys(t); len(keys) != 0 {
		t.Errorf("claim keys = %v, want none (released)", keys)
	}

	// The configuration is fixed: Svix's retry lands the mail.
	h.api.addEmail(t, emailID, nil)
	checkAnswer(t, "retry", answerOf(t, h.deliver(t, "msg_1", body)), processed)
	checkRows(t, h, []row{fixtureRow(emailID)})
}

// TestAnswerNotTheEmail: an answer without the announced id ({}, another
// email) fails the delivery rather than queueing an empty message.
func TestAnswerNotTheEmail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(e map[string]any)
	}{
		{"{}", func(e map[string]any) { clear(e) }},
		{"no id", func(e map[string]any) { delete(e, "id") }},
		{"another email", func(e map[string]any) { e["id"] = "b7e2c1d0-0000-4000-8000-000000000002" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, options{})
			h.api.addEmail(t, emailID, tc.change)
			body := receivedEvent(t, emailID, nil)

			checkAnswer(t, tc.name, answerOf(t, h.deliver(t, "msg_1", body)), failed)
			checkRows(t, h, nil)
			if got := h.counter(t, "resend_emails_unfetchable_total"); got != 1 {
				t.Errorf("resend_emails_unfetchable_total = %v, want 1", got)
			}
			if got := h.claimState(t, "msg_1"); got != "" {
				t.Errorf("claim state = %q, want none (released)", got)
			}
		})
	}
}

func TestRejected(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)
	otherKey := make([]byte, 24)
	rand.Read(otherKey)
	stranger, err := svix.NewWebhook("whsec_" + base64.StdEncoding.EncodeToString(otherKey))
	if err != nil {
		t.Fatal(err)
	}
	signedHeader := func(wh *svix.Webhook, id string, ts time.Time, payload []byte) http.Header {
		sig, err := wh.Sign(id, ts, payload)
		if err != nil {
			t.Fatal(err)
		}
		return http.Header{"Svix-Id": {id}, "Svix-Timestamp": {strconv.FormatInt(ts.Unix(), 10)}, "Svix-Signature": {sig}}
	}
	now := time.Now()
	tests := []struct {
		name   string
		body   []byte
		header http.Header
	}{
		{"signed with another secret", body, signedHeader(stranger, "msg_1", now, body)},
		{"no signature headers", body, http.Header{}},
		{"signature without id", body, func() http.Header {
			hd := signedHeader(h.wh, "msg_1", now, body)
			hd.Del("Svix-Id")
			return hd
		}()},
		{"timestamp 10 minutes old", body, signedHeader(h.wh, "msg_1", now.Add(-10*time.Minute), body)},
		{"timestamp 10 minutes ahead", body, signedHeader(h.wh, "msg_1", now.Add(10*time.Minute), body)},
		{"body changed after signing", bytes.Replace(body, []byte("Where"), []byte("Whence"), 1), signedHeader(h.wh, "msg_1", now, body)},
		{"signed under another id", body, func() http.Header {
			hd := signedHeader(h.wh, "msg_2", now, body)
			hd.Set("Svix-Id", "msg_1")
			return hd
		}()},
		{"signed but not JSON", []byte("not json"), signedHeader(h.wh, "msg_1", now, []byte("not json"))},
		{"signed but no type", []byte(`{"data":{}}`), signedHeader(h.wh, "msg_1", now, []byte(`{"data":{}}`))},
		{"email.received without email_id", receivedEvent(t, "", nil), signedHeader(h.wh, "msg_1", now, receivedEvent(t, "", nil))},
		{"email_id that would leave the API path", receivedEvent(t, "../../domains", nil), signedHeader(h.wh, "msg_1", now, receivedEvent(t, "../../domains", nil))},
	}
	for _, tc := range tests {
		checkAnswer(t, tc.name, answerOf(t, h.serve(tc.body, tc.header)), rejected)
	}
	if keys := h.claimKeys(t); len(keys) != 0 {
		t.Errorf("claim keys = %v, want none", keys)
	}
	if got := h.api.totalFetches(); got != 0 {
		t.Errorf("fetches = %d, want 0", got)
	}
	checkRows(t, h, nil)
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := receivedEvent(t, emailID, func(d map[string]any) { d["subject"] = strings.Repeat("x", claim.MaxBody) })
	w := h.deliver(t, "msg_1", body)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", w.Code)
	}
	if keys := h.claimKeys(t); len(keys) != 0 {
		t.Errorf("claim keys = %v, want none", keys)
	}
}

// TestWebhookHeaders: svix also accepts the Standard Webhooks header names;
// the claim is then keyed by webhook-id, the id that was signed.
func TestWebhookHeaders(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)
	now := time.Now()
	sig, err := h.wh.Sign("msg_std", now, body)
	if err != nil {
		t.Fatal(err)
	}
	header := http.Header{
		"Webhook-Id":        {"msg_std"},
		"Webhook-Timestamp": {strconv.FormatInt(now.Unix(), 10)},
		"Webhook-Signature": {sig},
		// An incomplete svix-* set makes svix verify the webhook-* one; an
		// unsigned svix-id must not become the claim key.
		"Svix-Id": {"msg_victim"},
	}
	checkAnswer(t, "webhook-* headers", answerOf(t, h.serve(body, header)), processed)
	if got := h.claimState(t, "msg_std"); got != claim.Done {
		t.Errorf("claim under webhook-id = %q, want done", got)
	}
	if got := h.claimState(t, "msg_victim"); got != "" {
		t.Errorf("claim under the unsigned svix-id = %q, want none", got)
	}
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{noRedis: true})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)

	checkAnswer(t, "first delivery", answerOf(t, h.deliver(t, "msg_1", body)), degradedOK)
	checkRows(t, h, []row{fixtureRow(emailID)})
	// Without Redis nothing remembers the first delivery: the store must.
	checkAnswer(t, "redelivery", answerOf(t, h.deliver(t, "msg_1", body)), degradedOK)
	checkRows(t, h, []row{fixtureRow(emailID)})
	if got := h.api.fetchCount(emailID); got != 2 {
		t.Errorf("fetches = %d, want 2", got)
	}
}

func TestTextFromHTML(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, func(e map[string]any) { e["text"] = nil })

	checkAnswer(t, "html-only mail", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)

	want := fixtureRow(emailID)
	want.TextBody = "Hello,\n\norder #42 has not arrived & it's been a week."
	checkRows(t, h, []row{want})
}

// TestFallbacks: what the fetched email lacks comes from the event.
func TestFallbacks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, func(e map[string]any) {
		e["message_id"] = ""
		e["created_at"] = "not a time"
		e["from"] = "not an address"
	})
	body := receivedEvent(t, emailID, func(d map[string]any) {
		d["message_id"] = "<from-the-event@mail.example.com>"
		d["created_at"] = "2026-02-22 23:41:11.5+00"
	})
	checkAnswer(t, "sparse email", answerOf(t, h.deliver(t, "msg_1", body)), processed)

	want := fixtureRow(emailID)
	want.MessageID = "<from-the-event@mail.example.com>"
	want.ReceivedAt = time.Date(2026, 2, 22, 23, 41, 11, 500000000, time.UTC)
	want.FromAddress, want.FromName = "not an address", ""
	checkRows(t, h, []row{want})
}

// The handler's metrics are registered on the registry it is given.
func TestNewRegisters(t *testing.T) {
	t.Parallel()
	wh, err := svix.NewWebhook("whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")))
	if err != nil {
		t.Fatal(err)
	}
	inbound, _ := resendhook.ParseInbound([]string{"support@munchable.app"})
	reg := prometheus.NewRegistry()
	resendhook.New(resendhook.Config{
		Queue: support.NewQueue(nil), Webhook: wh, APIKey: apiKey, APIURL: &url.URL{Scheme: "https", Host: "api.resend.com"}, Inbound: inbound, Registerer: reg,
	})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range []string{"resend_inbound_ignored_total", "resend_emails_unfetchable_total"} {
		if !got[name] {
			t.Errorf("%s not registered (have %v)", name, got)
		}
	}
}

// A signed delivery that reuses a done svix-id with another body (another
// email) processes nothing new, and says so in its metric.
func TestReusedIDWithOtherBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	h.api.addEmail(t, "b7e2c1d0-0000-4000-8000-000000000002", nil)

	if w := h.deliver(t, "msg_reused", receivedEvent(t, emailID, nil)); w.Code != 200 {
		t.Fatalf("first delivery: %d %s", w.Code, w.Body)
	}
	w := h.deliver(t, "msg_reused", receivedEvent(t, "b7e2c1d0-0000-4000-8000-000000000002", nil))
	if w.Code != 200 || w.Header().Get(claim.HeaderIdempotency) != "duplicate" {
		t.Errorf("reused id with another body: %d %q, want 200 duplicate", w.Code, w.Header().Get(claim.HeaderIdempotency))
	}
	if n := h.api.totalFetches(); n != 1 {
		t.Errorf("fetches = %d, want 1: the reused id must not fetch", n)
	}
	if n := len(h.rows(t)); n != 1 {
		t.Errorf("rows = %d, want 1", n)
	}
	if got := h.counter(t, "webhook_id_body_mismatch_total"); got != 1 {
		t.Errorf("webhook_id_body_mismatch_total = %v, want 1", got)
	}
}

func TestWrongContentType(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)
	now := time.Now()
	sig, err := h.wh.Sign("msg_ct", now, body)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/webhooks/resend", bytes.NewReader(body))
	r.Header.Set("Content-Type", "text/plain")
	r.Header.Set("svix-id", "msg_ct")
	r.Header.Set("svix-timestamp", strconv.FormatInt(now.Unix(), 10))
	r.Header.Set("svix-signature", sig)
	w := httptest.NewRecorder()
	h.handler.ServeHTTP(w, r)
	if w.Code != http.StatusUnsupportedMediaType {
		t.Errorf("status = %d, want 415", w.Code)
	}
	if h.api.totalFetches() != 0 || len(h.rows(t)) != 0 || len(h.claimKeys(t)) != 0 {
		t.Error("a wrong content type had an effect")
	}
}
