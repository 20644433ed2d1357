package resendhook_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gauge reads the gauge name from the registry.
func (h *harness) gauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// TestMailBudgetManyAtOnce: mails delivered all at once (attachments at
// their cap, one held by a slow download) never hold more than
// MAIL_INFLIGHT_BYTES between them; a delivery that cannot get its share
// in time is answered 503 with Retry-After, having stored nothing and
// given its claim back, and, retried as Svix would, every mail is queued
// exactly once with its attachments.
func TestMailBudgetManyAtOnce(t *testing.T) {
	t.Parallel()
	const (
		mails         = 8
		attachmentMax = 512 << 10
	)
	// Room for about three such mails at once (each 300 KiB of text,
	// drawn twice while read, and 1 MiB of attachments).
	const budget = 3 << 20
	h := newHarness(t, options{attachmentMax: attachmentMax, inflightBytes: budget, quiet: true, handlerTimeout: 30 * time.Second})
	text := strings.Repeat("x", 300<<10)
	for i := range mails {
		id := fmt.Sprintf("em_budget_%02d", i)
		h.api.addEmail(t, id, func(e map[string]any) { e["text"], e["message_id"] = text+id, "<"+id+"@x>" },
			fakeAttachment{ID: id + "_a", Filename: "a.bin", ContentType: "application/octet-stream",
				Content: bytes.Repeat([]byte{'a'}, attachmentMax), Delay: 50 * time.Millisecond},
			fakeAttachment{ID: id + "_b", Filename: "b.bin", ContentType: "application/octet-stream",
				Content: bytes.Repeat([]byte{'b'}, attachmentMax-1), Chunked: true})
	}

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), int64(h.gauge(t, "support_mail_inflight_bytes"))))
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	var busy atomic.Int32
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	for i := range mails {
		id := fmt.Sprintf("em_budget_%02d", i)
		wg.Go(func() {
			for {
				w := h.deliver(t, "msg_"+id, receivedEvent(t, id, nil))
				if w.Code == 200 {
					return
				}
				if w.Code != 503 || w.Header().Get("Retry-After") == "" || time.Now().After(deadline) {
					t.Errorf("%s: %d %s (Retry-After %q), want 200, or 503 with Retry-After", id, w.Code, w.Body, w.Header().Get("Retry-After"))
					return
				}
				busy.Add(1)
				time.Sleep(20 * time.Millisecond) // Svix waits longer
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	t.Logf("%d mails, budget %d bytes: peak held %d bytes, %d answers 503", mails, budget, peak.Load(), busy.Load())
	if p := peak.Load(); p > budget {
		t.Errorf("mail in flight held %d bytes at its peak, over the budget of %d", p, budget)
	}
	if got := h.gauge(t, "support_mail_inflight_bytes"); got != 0 {
		t.Errorf("support_mail_inflight_bytes = %v once every mail is done, want 0", got)
	}
	perMessage := map[string]int{}
	for _, a := range h.attachmentRows(t) {
		perMessage[a.Message]++
		if a.NoContentReason != "" || a.Size == nil || int64(len(a.Content)) != *a.Size {
			t.Errorf("attachment %s stored without its content: %q", a.ExternalID, a.NoContentReason)
		}
	}
	rows := h.rows(t)
	if len(rows) != mails {
		t.Errorf("%d support messages, want %d (each mail once)", len(rows), mails)
	}
	for _, r := range rows {
		if perMessage[r.ExternalID] != 2 {
			t.Errorf("%s: %d attachments stored, want 2", r.ExternalID, perMessage[r.ExternalID])
		}
	}
}

// TestAttachmentListBounded: the attachment list is read as a stream
// within caps, not decoded whole: 100 attachments with 100,000-byte
// filenames carrying CR, LF and NUL are all stored, each filename cut to
// 255 bytes and cleaned, and so are content types.
func TestAttachmentListBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{quiet: true})
	long := "evil\r\nX-Header: 1\x00" + strings.Repeat("é", 50000)
	var atts []fakeAttachment
	for i := range 100 {
		atts = append(atts, fakeAttachment{ID: fmt.Sprintf("att_%03d", i), Filename: long,
			ContentType: "text/plain\r\nX-Injected: 1", Content: []byte("hello")})
	}
	h.api.addEmail(t, emailID, nil, atts...)
	checkAnswer(t, "100 long filenames", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)
	rows := h.attachmentRows(t)
	if len(rows) != 100 {
		t.Fatalf("%d attachments stored, want 100", len(rows))
	}
	for _, a := range rows {
		if len(a.Filename) > 255 || strings.ContainsAny(a.Filename, "\r\n\x00") || !strings.HasPrefix(a.Filename, "evil  X-Header: 1 é") {
			t.Fatalf("filename stored as %d bytes %q..., want at most 255, CR, LF and NUL replaced", len(a.Filename), a.Filename[:min(40, len(a.Filename))])
		}
		if a.ContentType != "text/plain  X-Injected: 1" || string(a.Content) != "hello" {
			t.Fatalf("content type %q, content %q; want cleaned, and the content", a.ContentType, a.Content)
		}
	}
}
