package faulttest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// Giant mails cost memory of the order of the caps, not of the mail: three
// mails whose text and HTML parts are 30 MiB each, delivered at once, grow
// the service's resident set by less than 96 MiB (before the bounded
// decoding: 116 MiB peak for one, 278 MiB for three), and both parts are
// stored cut at 2 MiB.
func TestGiantMailsBoundedMemory(t *testing.T) {
	t.Parallel()
	for _, mails := range []int{1, 3} {
		t.Run(strconv.Itoa(mails), func(t *testing.T) {
			t.Parallel()
			giantMails(t, mails)
		})
	}
}

func giantMails(t *testing.T, mails int) {
	r := newRig(t)
	svc := r.service(nil)
	const (
		partBytes = 30 << 20
		cut       = 2 << 20
		limit     = 96 << 20
	)
	idle := vmRSS(t, svc.PID())
	var giants []faulttest.Email
	for i := range mails {
		m := newEmail(fmt.Sprintf("giant-%d-%d", mails, i))
		m.PartBytes = partBytes
		r.api.Add(m)
		giants = append(giants, m)
	}

	var (
		wg      sync.WaitGroup
		answers = make([]faulttest.Answer, mails)
		peak    int64
		done    = make(chan struct{})
	)
	start := time.Now()
	for i, m := range giants {
		wg.Go(func() { answers[i] = r.resend(svc, m) })
	}
	go func() { wg.Wait(); close(done) }()
	for sampling := true; sampling; {
		peak = max(peak, vmRSS(t, svc.PID()))
		select {
		case <-done:
			sampling = false
		case <-time.After(20 * time.Millisecond):
		}
	}
	peak = max(peak, vmRSS(t, svc.PID()))
	elapsed := time.Since(start)

	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	growth := peak - idle
	figure(t, "%d mails with %d MiB text and HTML parts at once: VmRSS %.1f MiB idle, peak %.1f MiB (growth %.1f MiB) in %v; truncated text %v, html %v",
		mails, partBytes>>20, mib(idle), mib(peak), mib(growth), elapsed.Round(time.Millisecond),
		m.Sum("support_mail_truncated_total", "part", "text"), m.Sum("support_mail_truncated_total", "part", "html"))

	for i, a := range answers {
		if !a.OK() {
			t.Errorf("mail %d: %v, want 200", i, a)
		}
	}
	if growth >= limit {
		t.Errorf("VmRSS grew %.1f MiB with %d giant mails, want under %d MiB", mib(growth), mails, limit>>20)
	}
	for _, g := range giants {
		var text, html int
		err := r.db.QueryRow(context.Background(),
			`SELECT octet_length(coalesce(text_body, '')), octet_length(coalesce(html_body, '')) FROM support_messages WHERE external_id = $1`, g.EmailID).
			Scan(&text, &html)
		if err != nil {
			t.Errorf("stored %s: %v", g.EmailID, err)
			continue
		}
		if text != cut || html != cut {
			t.Errorf("stored %s: text %d bytes, html %d, want both %d", g.EmailID, text, html, cut)
		}
	}
	for _, part := range []string{"text", "html"} {
		if got := m.Sum("support_mail_truncated_total", "part", part); got != float64(mails) {
			t.Errorf("support_mail_truncated_total{part=%q} = %v, want %d", part, got, mails)
		}
	}
}

// TestHostileMail: the service's answers to mail someone else shapes, on
// one running binary. A spoof failing DMARC and an unrelated sender both
// name a customer's Message-ID and start threads of their own, while the
// customer's own reply joins; a forged Cc of support on mail whose
// envelope went to sales is ignored; download URLs on loopback (http, and
// https) are not fetched without RESEND_DOWNLOAD_ALLOW_PRIVATE; an API
// answer redirecting to another port does not take the API key there.
func TestHostileMail(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(nil)

	t.Run("thread hijack", func(t *testing.T) {
		order := newEmail("hijack-order")
		order.DMARC = "pass"
		reply := newEmail("hijack-reply")
		reply.InReplyTo, reply.DMARC = order.MessageID, "pass"
		spoof := newEmail("hijack-spoof")
		spoof.InReplyTo, spoof.DMARC = order.MessageID, "fail"
		stranger := newEmail("hijack-stranger")
		stranger.From, stranger.InReplyTo, stranger.DMARC = "Mallory <mallory@evil.example>", order.MessageID, "pass"
		for _, m := range []faulttest.Email{order, reply, spoof, stranger} {
			r.api.Add(m)
			if a := r.resend(svc, m); !a.OK() {
				t.Fatalf("%s: %v, want 200", m.EmailID, a)
			}
		}
		got := map[string]string{}
		rows, err := r.db.Query(context.Background(), `
SELECT m.external_id, t.external_id || ' / ' || coalesce(m.in_reply_to, '')
FROM support_messages m JOIN support_messages t ON t.id = m.thread_id
WHERE m.external_id LIKE 'em-hijack-%'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, thread string
			if err := rows.Scan(&id, &thread); err != nil {
				t.Fatal(err)
			}
			got[id] = thread
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			order.EmailID:    order.EmailID + " / ",
			reply.EmailID:    order.EmailID + " / " + order.MessageID,
			spoof.EmailID:    spoof.EmailID + " / " + order.MessageID,
			stranger.EmailID: stranger.EmailID + " / " + order.MessageID,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("thread / in_reply_to by mail (-want +got):\n%s", diff)
		}
	})

	t.Run("forged cc", func(t *testing.T) {
		m := newEmail("forged-cc")
		m.To, m.Cc, m.ReceivedFor = "sales@munchable.app", []string{faulttest.SupportAddress}, []string{"sales@munchable.app"}
		r.api.Add(m)
		before := r.api.Fetches()
		a := r.resend(svc, m)
		if !a.OK() || !strings.Contains(a.Body, `"ignored":true`) {
			t.Errorf("forged cc: %v, want 200 ignored", a)
		}
		if n := r.api.Fetches() - before; n != 0 {
			t.Errorf("fetches = %d, want 0", n)
		}
		if n := r.supportRows(m); n != 0 {
			t.Errorf("support rows = %d, want 0", n)
		}
	})

	t.Run("download on loopback", func(t *testing.T) {
		var hits atomic.Int64
		serve := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			hits.Add(1)
			_, _ = w.Write([]byte("internal secrets"))
		})
		plain, tls := httptest.NewServer(serve), httptest.NewTLSServer(serve)
		t.Cleanup(plain.Close)
		t.Cleanup(tls.Close)
		m := newEmail("loopback-download")
		m.Attachments = []faulttest.Attachment{
			{ID: "att-http", Filename: "a.txt", DownloadURL: plain.URL + "/a.txt", Size: 16},
			{ID: "att-https", Filename: "b.txt", DownloadURL: tls.URL + "/b.txt", Size: 16},
		}
		r.api.Add(m)
		if a := r.resend(svc, m); !a.OK() {
			t.Fatalf("%v, want 200", a)
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("loopback downloads = %d, want 0", n)
		}
		refused := r.count(`SELECT count(*) FROM support_attachments a JOIN support_messages m ON m.id = a.support_message_id
WHERE m.external_id = $1 AND a.content IS NULL AND a.no_content_reason = 'refused'`, m.EmailID)
		if refused != 2 {
			t.Errorf("attachments recorded as refused = %d, want 2", refused)
		}
	})

	t.Run("API redirect to another port", func(t *testing.T) {
		var mu sync.Mutex
		var keys []string
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			keys = append(keys, r.Header.Get("Authorization"))
			mu.Unlock()
			http.Error(w, "not the API", http.StatusNotFound)
		}))
		t.Cleanup(other.Close)
		m := newEmail("api-redirect")
		r.api.Add(m)
		r.api.Redirect(m.EmailID, other.URL+"/emails/receiving/"+m.EmailID)
		a := r.resend(svc, m)
		if a.Status != http.StatusInternalServerError {
			t.Errorf("redirected fetch: %v, want 500", a)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, k := range keys {
			if k != "" {
				t.Errorf("the other port received Authorization %q", k)
			}
		}
		figure(t, "API redirect to another port: delivery %d, requests at the other port %d, with the key %d", a.Status, len(keys), countNonEmpty(keys))
	})
}

func countNonEmpty(ss []string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}
