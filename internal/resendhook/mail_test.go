package resendhook_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// What an agent needs of a mail, each read the way Resend documents it.

func TestSender(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	tests := []struct {
		name             string
		from, header     any // the API's from, headers.from (nil: absent)
		wantAddr, wantNm string
	}{
		{"bare from, name in the From header", "ada@example.com", "Ada Lovelace <ada@example.com>", "ada@example.com", "Ada Lovelace"},
		{"encoded name", "renee@example.com", "=?UTF-8?Q?Ren=C3=A9e_Dupont?= <renee@example.com>", "renee@example.com", "Renée Dupont"},
		{"header address in another case", "ada@example.com", "Ada <ADA@Example.com>", "ada@example.com", "Ada"},
		{"from with a name of its own", "Countess <ada@example.com>", "Ada Lovelace <ada@example.com>", "ada@example.com", "Countess"},
		{"header for another address", "ada@example.com", "Mallory <mallory@example.com>", "ada@example.com", ""},
		{"no From header", "ada@example.com", nil, "ada@example.com", ""},
		{"From header as a list", "ada@example.com", []string{"Ada Lovelace <ada@example.com>"}, "ada@example.com", "Ada Lovelace"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := "sender-" + strconv.Itoa(i)
			h.api.addEmail(t, id, func(e map[string]any) {
				e["from"] = tc.from
				e["text"] = "case " + id // its own content, so each case is its own row
				hd := e["headers"].(map[string]any)
				delete(hd, "from")
				if tc.header != nil {
					hd["From"] = tc.header
				}
			})
			checkAnswer(t, tc.name, answerOf(t, h.deliver(t, "msg_"+id, receivedEvent(t, id, nil))), processed)
			r := rowOf(t, h, id)
			if r.FromAddress != tc.wantAddr || r.FromName != tc.wantNm {
				t.Errorf("from = %q, %q; want %q, %q", r.FromAddress, r.FromName, tc.wantAddr, tc.wantNm)
			}
		})
	}
}

// rowOf is the row of email id; the test fails when there is not exactly one.
func rowOf(t *testing.T, h *harness, id string) row {
	t.Helper()
	var found []row
	for _, r := range h.rows(t) {
		if r.ExternalID == id {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("rows of %s = %d, want 1", id, len(found))
	}
	return found[0]
}

// mailIn delivers email id (the fixture, with Message-ID msgID and the
// given headers) and checks it is processed.
func mailIn(t *testing.T, h *harness, id, msgID string, hdrs map[string]any, change func(e map[string]any)) {
	t.Helper()
	h.api.addEmail(t, id, func(e map[string]any) {
		e["message_id"] = msgID
		e["text"] = "mail " + id
		hd := e["headers"].(map[string]any)
		for k, v := range hdrs {
			hd[k] = v
		}
		if change != nil {
			change(e)
		}
	})
	w := h.deliver(t, "msg_"+id, receivedEvent(t, id, func(d map[string]any) { d["message_id"] = msgID }))
	checkAnswer(t, id, answerOf(t, w), processed)
}

// TestReplyJoinsThread: a customer's reply carries Reply-To, In-Reply-To and
// References; it is stored as sent and joins the conversation of the mail
// it answers, found through In-Reply-To, else References from the newest.
func TestReplyJoinsThread(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	mailIn(t, h, "first", "<first@mail.example.com>", nil, nil)
	mailIn(t, h, "other", "<other@mail.example.com>", nil, nil)
	mailIn(t, h, "reply", "<reply@mail.example.com>", map[string]any{
		"in-reply-to": "<first@mail.example.com>",
		"references":  "<first@mail.example.com>",
	}, func(e map[string]any) {
		e["reply_to"] = []string{"Accounts Payable <AP@example.com>", "other@example.com"}
	})
	// In-Reply-To names a mail we never stored (our own answer); References
	// lead back to the conversation, folded over lines as mailers do.
	mailIn(t, h, "reply-2", "<reply-2@mail.example.com>", map[string]any{
		"In-Reply-To": "<our-answer@munchable.app>",
		"References":  "<first@mail.example.com>\r\n <reply@mail.example.com> <our-answer@munchable.app>",
	}, nil)
	// References name two conversations: the newest reference wins.
	mailIn(t, h, "newest-ref", "<newest-ref@mail.example.com>", map[string]any{
		"references": "<first@mail.example.com> <other@mail.example.com>",
	}, nil)
	// In-Reply-To is asked before References.
	mailIn(t, h, "in-reply-to-first", "<irt@mail.example.com>", map[string]any{
		"in-reply-to": "<other@mail.example.com>",
		"references":  "<first@mail.example.com> <reply@mail.example.com>",
	}, nil)
	// Nothing matches: a thread of its own.
	mailIn(t, h, "stranger", "<stranger@mail.example.com>", map[string]any{
		"in-reply-to": "<unknown@elsewhere.example>",
	}, nil)

	type threaded struct {
		ReplyTo, InReplyTo string
		References         []string
		Thread             string
	}
	want := map[string]threaded{
		"first": {Thread: "first"},
		"other": {Thread: "other"},
		"reply": {ReplyTo: "AP@example.com", InReplyTo: "<first@mail.example.com>",
			References: []string{"<first@mail.example.com>"}, Thread: "first"},
		"reply-2": {InReplyTo: "<our-answer@munchable.app>",
			References: []string{"<first@mail.example.com>", "<reply@mail.example.com>", "<our-answer@munchable.app>"}, Thread: "first"},
		"newest-ref": {References: []string{"<first@mail.example.com>", "<other@mail.example.com>"}, Thread: "other"},
		"in-reply-to-first": {InReplyTo: "<other@mail.example.com>",
			References: []string{"<first@mail.example.com>", "<reply@mail.example.com>"}, Thread: "other"},
		"stranger": {InReplyTo: "<unknown@elsewhere.example>", Thread: "stranger"},
	}
	got := map[string]threaded{}
	for _, r := range h.rows(t) {
		got[r.ExternalID] = threaded{r.ReplyTo, r.InReplyTo, r.References, r.Thread}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("threads (-want +got):\n%s", diff)
	}
}

// TestAuthentication: Resend's verdicts are stored as reported, and only a
// DMARC verdict decides sender_authenticated.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	tests := []struct {
		name              string
		auth              any
		spf, dkim, dmarc  string
		wantAuthenticated *bool
	}{
		{"all pass", map[string]any{"spf": "pass", "dkim": "pass", "dmarc": "pass"}, "pass", "pass", "pass", ptr(true)},
		{"DMARC fail: a spoofed sender", map[string]any{"spf": "pass", "dkim": "fail", "dmarc": "fail"}, "pass", "fail", "fail", ptr(false)},
		{"DMARC gray (p=none)", map[string]any{"spf": "pass", "dkim": "gray", "dmarc": "gray"}, "pass", "gray", "gray", nil},
		{"processing failed", map[string]any{"spf": "processing_failed", "dkim": "unknown", "dmarc": "processing_failed"}, "processing_failed", "unknown", "processing_failed", nil},
		{"null: received before Resend had it", nil, "", "", "", nil},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := "auth-" + strconv.Itoa(i)
			h.api.addEmail(t, id, func(e map[string]any) {
				e["authentication"] = tc.auth
				e["text"] = "case " + id
			})
			checkAnswer(t, tc.name, answerOf(t, h.deliver(t, "msg_"+id, receivedEvent(t, id, nil))), processed)
			r := rowOf(t, h, id)
			got := []any{r.AuthSPF, r.AuthDKIM, r.AuthDMARC, r.SenderAuthenticated}
			if diff := cmp.Diff([]any{tc.spf, tc.dkim, tc.dmarc, tc.wantAuthenticated}, got); diff != "" {
				t.Errorf("spf, dkim, dmarc, sender_authenticated (-want +got):\n%s", diff)
			}
		})
	}
}

var (
	screenshot = fakeAttachment{ID: "5c7a1e2f-8f0e-4c3b-9d5e-1f2a3b4c5d6e", Filename: "IMG_0042.PNG",
		ContentType: "image/png", ContentDisposition: "attachment", Content: bytes.Repeat([]byte("png!"), 300)}
	logo = fakeAttachment{ID: "2a0c9ce0-3112-4728-976e-47ddcd16a318", Filename: "avatar.png",
		ContentType: "image/png", ContentDisposition: "inline", ContentID: "img001", Content: []byte("\x89PNG\r\n\x1a\n inline")}
)

// stored is the row an attachment whose content was stored becomes.
func stored(message string, a fakeAttachment) attachmentRow {
	size := int64(len(a.Content))
	return attachmentRow{Message: message, ExternalID: a.ID, Filename: a.Filename, ContentType: a.ContentType,
		ContentDisposition: a.ContentDisposition, ContentID: a.ContentID, Size: &size, Content: a.Content, SHA256OK: true}
}

// withoutContent is the row of an attachment recorded without content.
func withoutContent(message string, a fakeAttachment, reason string) attachmentRow {
	r := stored(message, a)
	r.Content, r.NoContentReason = nil, reason
	return r
}

func checkAttachments(t *testing.T, h *harness, want []attachmentRow) {
	t.Helper()
	checkTable(t, "support_attachments", want, h.attachmentRows(t))
}

// TestAttachmentOnlyMail: a phone mail with nothing but a screenshot is a
// message with its attachment, and its redelivery under a new svix-id (a
// replay) neither doubles the attachment nor downloads it again.
func TestAttachmentOnlyMail(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, func(e map[string]any) {
		e["subject"], e["text"], e["html"] = "", nil, nil
	}, screenshot)
	body := receivedEvent(t, emailID, func(d map[string]any) { d["subject"] = "" })

	checkAnswer(t, "attachment-only mail", answerOf(t, h.deliver(t, "msg_1", body)), processed)
	checkAnswer(t, "redelivery under a new svix-id", answerOf(t, h.deliver(t, "msg_2", body)), processed)

	want := fixtureRow(emailID)
	want.Subject, want.TextBody, want.HTMLBody = "", "", ""
	checkRows(t, h, []row{want})
	checkAttachments(t, h, []attachmentRow{stored(emailID, screenshot)})
	if got := h.api.downloadCount(screenshot.ID); got != 1 {
		t.Errorf("downloads = %d, want 1", got)
	}
	if got := h.api.listCount(emailID); got != 1 {
		t.Errorf("attachment listings = %d, want 1: a message already queued lists none", got)
	}
}

// TestInlineImage: the email is asked for with html_format=cid, so the HTML
// keeps its cid: reference and the image is an attachment with that
// content_id.
func TestInlineImage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	html := `<p>This error:</p><img src="cid:img001" alt="screenshot">`
	h.api.addEmail(t, emailID, func(e map[string]any) {
		e["html"], e["text"] = html, "This error:"
	}, logo)

	checkAnswer(t, "inline image", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)

	q, err := url.ParseQuery(h.api.lastQuery(emailID))
	if err != nil || q.Get("html_format") != "cid" {
		t.Errorf("fetch query = %q, want html_format=cid", h.api.lastQuery(emailID))
	}
	if got := rowOf(t, h, emailID).HTMLBody; got != html {
		t.Errorf("html_body = %q, want %q", got, html)
	}
	checkAttachments(t, h, []attachmentRow{stored(emailID, logo)})
}

// TestOversizeAttachment: content over the limit is not stored, its size
// is; a size the email lists spares the download, else the download's
// Content-Length decides, else the bytes counted.
func TestOversizeAttachment(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{attachmentMax: 1000})
	big := fakeAttachment{ID: "9e8d7c6b-0000-4000-8000-00000000b16", Filename: "logs.zip",
		ContentType: "application/zip", ContentDisposition: "attachment", Content: bytes.Repeat([]byte{7}, 5000)}
	bigUnlisted := big
	bigUnlisted.ID = "9e8d7c6b-0000-4000-8000-0000000b1655"
	small := logo // 1000 bytes or fewer: stored
	// Without a size listed or a Content-Length, the content is read to
	// learn its size.
	bigChunked := bigUnlisted
	bigChunked.ID, bigChunked.Chunked = "9e8d7c6b-0000-4000-8000-00000c4u4ked", true
	smallChunked := logo
	smallChunked.ID, smallChunked.Chunked = "2a0c9ce0-3112-4728-976e-00000c4u4ked", true

	h.api.addEmail(t, emailID, func(e map[string]any) {
		// The email's list gives no size for these: only the download can
		// tell.
		for _, i := range []int{1, 3, 4} {
			(e["attachments"].([]any))[i].(map[string]any)["size"] = nil
		}
	}, big, bigUnlisted, small, bigChunked, smallChunked)

	checkAnswer(t, "oversize attachments", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)

	checkAttachments(t, h, []attachmentRow{
		withoutContent(emailID, big, "too_large"),
		withoutContent(emailID, bigUnlisted, "too_large"),
		stored(emailID, small),
		withoutContent(emailID, bigChunked, "too_large"),
		stored(emailID, smallChunked),
	})
	if got := h.api.downloadCount(big.ID); got != 0 {
		t.Errorf("downloads of the listed oversize attachment = %d, want 0", got)
	}
}

// TestAttachmentDownloadFails: a download that fails in a way a retry may
// fix fails the delivery with nothing written (the message and its
// attachments are one transaction); the retry stores one message with one
// attachment.
func TestAttachmentDownloadFails(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusInternalServerError, http.StatusTooManyRequests, http.StatusForbidden} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, options{})
			h.api.addEmail(t, emailID, nil, screenshot)
			h.api.failDownloads(screenshot.ID, status)
			body := receivedEvent(t, emailID, nil)

			checkAnswer(t, "download fails", answerOf(t, h.deliver(t, "msg_1", body)), failed)
			checkRows(t, h, nil)
			checkAttachments(t, h, nil)
			if keys := h.claimKeys(t); len(keys) != 0 {
				t.Errorf("claim keys = %v, want none (released)", keys)
			}

			checkAnswer(t, "retry", answerOf(t, h.deliver(t, "msg_1", body)), processed)
			checkRows(t, h, []row{fixtureRow(emailID)})
			checkAttachments(t, h, []attachmentRow{stored(emailID, screenshot)})
		})
	}
}

// TestAttachmentDownloadHangs: a download still running at the handler
// deadline fails the delivery; the retry stores the mail.
func TestAttachmentDownloadHangs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{handlerTimeout: 300 * time.Millisecond})
	h.api.addEmail(t, emailID, nil, screenshot)
	h.api.failDownloads(screenshot.ID, hangDownload)
	body := receivedEvent(t, emailID, nil)

	checkAnswer(t, "download hangs", answerOf(t, h.deliver(t, "msg_1", body)), failed)
	checkRows(t, h, nil)
	checkAnswer(t, "retry", answerOf(t, h.deliver(t, "msg_1", body)), processed)
	checkAttachments(t, h, []attachmentRow{stored(emailID, screenshot)})
}

// TestAttachmentGone: a 404 or 410 from the download URL will not change
// on a retry: the attachment is recorded without content, with the reason.
func TestAttachmentGone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	gone := logo
	h.api.addEmail(t, emailID, nil, screenshot, gone)
	h.api.failDownloads(screenshot.ID, http.StatusNotFound)
	h.api.failDownloads(gone.ID, http.StatusGone)

	checkAnswer(t, "attachments gone", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)
	checkRows(t, h, []row{fixtureRow(emailID)})
	checkAttachments(t, h, []attachmentRow{
		withoutContent(emailID, screenshot, "not_found"),
		withoutContent(emailID, gone, "gone"),
	})
}

// TestAttachmentListFails: the attachments API failing fails the delivery
// like the email's fetch does.
func TestAttachmentListFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil, screenshot)
	h.api.mu.Lock()
	delete(h.api.attachments, emailID) // the listing answers 404
	h.api.mu.Unlock()

	checkAnswer(t, "listing fails", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), failed)
	checkRows(t, h, nil)
}

// TestHTMLCapped: an HTML body over 2 MiB is cut, at a character boundary.
func TestHTMLCapped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	html := "<p>" + strings.Repeat("é", 2<<20) + "</p>" // 4 MiB
	h.api.addEmail(t, emailID, func(e map[string]any) { e["html"] = html })

	checkAnswer(t, "huge html", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)
	got := rowOf(t, h, emailID).HTMLBody
	if len(got) > 2<<20 || len(got) < 2<<20-1 || !strings.HasPrefix(html, got) {
		t.Errorf("html_body: %d bytes, a prefix: %v; want the first 2 MiB, cut between characters", len(got), strings.HasPrefix(html, got))
	}
}

// TestAutoSubmittedStored: the Auto-Submitted header is kept as sent (the
// forward to the team skips automatic mail), absent as NULL.
func TestAutoSubmittedStored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	mailIn(t, h, "ooo", "<ooo@mail.example.com>", map[string]any{"Auto-Submitted": "auto-replied"}, nil)
	mailIn(t, h, "person", "<person@mail.example.com>", nil, nil)
	got := map[string]*string{}
	rows, err := h.pool.Query(context.Background(), `SELECT external_id, auto_submitted FROM support_messages`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var a *string
		if err := rows.Scan(&id, &a); err != nil {
			t.Fatal(err)
		}
		got[id] = a
	}
	if want := "auto-replied"; got["ooo"] == nil || *got["ooo"] != want || got["person"] != nil {
		t.Errorf("auto_submitted = ooo %v, person %v; want %q and NULL", got["ooo"], got["person"], want)
	}
}
