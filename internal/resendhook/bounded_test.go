package resendhook_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/munchable/munchable-webhooks/internal/support"
)

// labeled reads the counter name{label=value} from the registry, 0 when
// it has not been counted.
func (h *harness) labeled(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestPartsCapped: both bodies over 2 MiB are cut at a character boundary,
// and each cut is counted by part.
func TestPartsCapped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	text := strings.Repeat("ü", 3<<20)                        // 6 MiB
	html := "<p>" + strings.Repeat("\u2028é", 1<<20) + "</p>" // 5 MiB, escaped by the encoder
	h.api.addEmail(t, emailID, func(e map[string]any) { e["text"], e["html"] = text, html })

	checkAnswer(t, "huge parts", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)
	r := rowOf(t, h, emailID)
	for _, part := range []struct{ name, sent, stored string }{{"text", text, r.TextBody}, {"html", html, r.HTMLBody}} {
		if n := len(part.stored); n > 2<<20 || n < 2<<20-3 || !strings.HasPrefix(part.sent, part.stored) {
			t.Errorf("%s: %d bytes stored, a prefix: %v; want the first 2 MiB, cut between characters", part.name, n, strings.HasPrefix(part.sent, part.stored))
		}
		if got := h.labeled(t, "support_mail_truncated_total", "part", part.name); got != 1 {
			t.Errorf("support_mail_truncated_total{part=%q} = %v, want 1", part.name, got)
		}
	}
}

// TestHeaderFieldsOneLine: control characters in the fields taken from
// headers become spaces, RFC 2047 encoded ones included; bodies keep
// theirs. to_address is one of them: with a domain entry and no
// received_for, the matched recipient comes from the sender's To.
func TestHeaderFieldsOneLine(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, func(e map[string]any) {
		e["subject"] = "Refund\r\nBcc: everyone@example.com"
		e["message_id"] = "<evil\x00@mail.example.com>"
		e["reply_to"] = []string{"=?UTF-8?Q?Eve=0D=0A?= <eve@example.com>"}
		e["text"] = "line one\r\nline two"
		hd := e["headers"].(map[string]any)
		hd["from"] = "=?UTF-8?B?QWRhDQpCY2M6IHhAZXhhbXBsZS5jb20=?= <ada@example.com>" // "Ada\r\nBcc: x@example.com"
		hd["in-reply-to"] = "<a@x>\r\n\tX-Injected: 1"
		hd["references"] = "<b\x01@x> <c@x>"
	})
	ev := receivedEvent(t, emailID, func(d map[string]any) {
		d["to"] = []string{"x\r\nBcc: y\x00" + inboundDomain}
	})
	checkAnswer(t, "control characters", answerOf(t, h.deliver(t, "msg_1", ev)), processed)
	r := rowOf(t, h, emailID)
	got := []string{r.ToAddress, r.Subject, r.MessageID, r.FromName, r.ReplyTo, r.InReplyTo, strings.Join(r.References, "|"), r.TextBody}
	want := []string{
		"x  bcc: y @inbound.munchable.app",
		"Refund  Bcc: everyone@example.com",
		"<evil @mail.example.com>",
		"Ada  Bcc: x@example.com",
		"eve@example.com",
		"<a@x>   X-Injected: 1",
		"<b @x>|<c@x>",
		"line one\r\nline two",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("to_address, subject, message_id, from_name, reply_to, in_reply_to, references, text_body (-want +got):\n%s", diff)
	}
}

// TestOneLineFormAndMailAlike: a sender name and subject holding ESC, C1
// controls (NEL, CSI), the Unicode line and paragraph separators, TAB, DEL
// or a bidirectional control are stored the same whether they came by
// mail or through the form, both cleaned by support.OneLine: the controls
// and separators as a space, the bidirectional characters removed. On
// main the form kept every one of them.
func TestOneLineFormAndMailAlike(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	form := support.NewForm(support.NewQueue(h.pool), support.FormConfig{Rate: 1000, DatabaseMaxConns: 4}).Submit()
	tests := []struct {
		name, char, sep string // sep: what the stored text holds in its place
	}{
		{"ESC", "\x1b", " "},
		{"TAB", "\t", " "},
		{"DEL", "\x7f", " "},
		{"NEL", "\u0085", " "},
		{"CSI", "\u009b", " "},
		{"line separator", "\u2028", " "},
		{"paragraph separator", "\u2029", " "},
		{"RLO", "\u202e", ""},
		{"LRE", "\u202a", ""},
		{"RLI", "\u2067", ""},
		{"PDI", "\u2069", ""},
		{"RLM", "\u200f", ""},
		{"LRM", "\u200e", ""},
		{"ALM", "\u061c", ""},
	}
	for i, tc := range tests {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		name, subject := "Ada"+tc.char+"Lovelace", "Refund"+tc.char+"now"
		h.api.addEmail(t, id, func(e map[string]any) {
			e["subject"] = subject
			e["message_id"] = "<" + id + "@mail.example.com>"
			e["headers"].(map[string]any)["from"] = mime.QEncoding.Encode("utf-8", name) + " <ada@example.com>"
		})
		checkAnswer(t, tc.name, answerOf(t, h.deliver(t, "msg_"+id, receivedEvent(t, id, nil))), processed)
		body, err := json.Marshal(map[string]string{"email": "ada@example.com", "name": name, "subject": subject, "message": "Help"})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/support/messages", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		form.ServeHTTP(w, r)
		if w.Code != http.StatusAccepted {
			t.Fatalf("%s: form post answered %d %s, want 202", tc.name, w.Code, w.Body)
		}
		var formID struct{ ID int64 }
		if err := json.Unmarshal(w.Body.Bytes(), &formID); err != nil {
			t.Fatal(err)
		}
		var formName, formSubject string
		if err := h.pool.QueryRow(t.Context(), `SELECT from_name, subject FROM support_messages WHERE id = $1`, formID.ID).Scan(&formName, &formSubject); err != nil {
			t.Fatal(err)
		}
		mail := rowOf(t, h, id)
		want := []string{"Ada" + tc.sep + "Lovelace", "Refund" + tc.sep + "now"}
		if diff := cmp.Diff(want, []string{mail.FromName, mail.Subject}); diff != "" {
			t.Errorf("%s: mail's from_name, subject (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(want, []string{formName, formSubject}); diff != "" {
			t.Errorf("%s: form's from_name, subject (-want +got):\n%s", tc.name, diff)
		}
	}
}
