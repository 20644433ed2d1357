package support_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// row is a support_messages row as the tests read it back, NULLs as nil.
type row struct {
	ID          int64
	Source      string
	ExternalID  string
	FromAddress string
	FromName    *string
	ToAddress   *string
	Subject     *string
	TextBody    *string
	HTMLBody    *string
	MessageID   *string
	ContentHash []byte
	ReceivedAt  time.Time
}

func rows(t *testing.T, pool *pgxpool.Pool) []row {
	t.Helper()
	rs, err := pool.Query(context.Background(), `
SELECT id, source, external_id, from_address, from_name, to_address, subject,
       text_body, html_body, message_id, content_hash, received_at
FROM support_messages ORDER BY id`)
	if err != nil {
		t.Fatalf("query support_messages: %v", err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.ID, &r.Source, &r.ExternalID, &r.FromAddress, &r.FromName, &r.ToAddress,
			&r.Subject, &r.TextBody, &r.HTMLBody, &r.MessageID, &r.ContentHash, &r.ReceivedAt); err != nil {
			t.Fatalf("scan support_messages: %v", err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatalf("read support_messages: %v", err)
	}
	return out
}

func ptr(s string) *string { return &s }

func mailMessage(externalID string) support.Message {
	return support.Message{
		Source:      support.SourceEmail,
		ExternalID:  externalID,
		FromAddress: "ada@example.com",
		FromName:    "Ada Lovelace",
		ToAddress:   "support@munchable.app",
		Subject:     "My order",
		TextBody:    "Where is my order?",
		HTMLBody:    "<p>Where is my order?</p>",
		MessageID:   "<abc@mail.example.com>",
		ReceivedAt:  time.Date(2026, 2, 22, 23, 41, 11, 0, time.UTC),
	}
}

func TestEnqueueStoresMessage(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	ctx := context.Background()

	mail := mailMessage("em_1")
	web := support.Message{Source: support.SourceWeb, ExternalID: "form:1", FromAddress: "bob@example.com", TextBody: "hi"}
	mailID, inserted, err := q.Enqueue(ctx, mail)
	if err != nil || !inserted {
		t.Fatalf("Enqueue(mail) = %d, %v, %v; want a new row", mailID, inserted, err)
	}
	webID, inserted, err := q.Enqueue(ctx, web)
	if err != nil || !inserted {
		t.Fatalf("Enqueue(web) = %d, %v, %v; want a new row", webID, inserted, err)
	}

	got := rows(t, pool)
	sum := sha256.Sum256([]byte("ada@example.com\x00My order\x00Where is my order?\x00<p>Where is my order?</p>"))
	want := []row{{
		ID: mailID, Source: "email", ExternalID: "em_1", FromAddress: "ada@example.com",
		FromName: ptr("Ada Lovelace"), ToAddress: ptr("support@munchable.app"), Subject: ptr("My order"),
		TextBody: ptr("Where is my order?"), HTMLBody: ptr("<p>Where is my order?</p>"),
		MessageID: ptr("<abc@mail.example.com>"), ContentHash: sum[:], ReceivedAt: mail.ReceivedAt,
	}, {
		// Empty strings are NULL; a web row has no content hash.
		ID: webID, Source: "web", ExternalID: "form:1", FromAddress: "bob@example.com", TextBody: ptr("hi"),
	}}
	// The web row's received_at defaulted to now.
	if len(got) == 2 && time.Since(got[1].ReceivedAt) > time.Minute {
		t.Errorf("web row received_at = %v, want about now", got[1].ReceivedAt)
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b time.Time) bool {
		return a.Equal(b) || a.IsZero() || b.IsZero()
	})); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

func TestEnqueueIdempotent(t *testing.T) {
	t.Parallel()
	other := mailMessage("em_other")
	other.TextBody = "A different mail that reuses the Message-ID."
	noMsgID := mailMessage("em_nomsgid_2")
	noMsgID.MessageID = ""
	noMsgIDFirst := mailMessage("em_nomsgid_1")
	noMsgIDFirst.MessageID = ""
	webSameKey := support.Message{Source: support.SourceWeb, ExternalID: "em_1", FromAddress: "ada@example.com"}

	tests := []struct {
		name         string
		first, again support.Message
		wantSame     bool
	}{
		{"same source and external id", mailMessage("em_1"), mailMessage("em_1"), true},
		{"same Message-ID and content under another email id", mailMessage("em_1"), mailMessage("em_2"), true},
		{"Message-ID reused by a different mail", mailMessage("em_1"), other, false},
		{"no Message-ID: only the external id dedupes", noMsgIDFirst, noMsgID, false},
		{"same external id from another source", mailMessage("em_1"), webSameKey, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			q := support.NewQueue(pool)
			ctx := context.Background()
			id1, ins1, err := q.Enqueue(ctx, tc.first)
			if err != nil || !ins1 {
				t.Fatalf("first Enqueue = %d, %v, %v; want a new row", id1, ins1, err)
			}
			id2, ins2, err := q.Enqueue(ctx, tc.again)
			if err != nil {
				t.Fatalf("second Enqueue: %v", err)
			}
			if got := id1 == id2; got != tc.wantSame {
				t.Errorf("second Enqueue id %d, first %d: same = %v, want %v", id2, id1, got, tc.wantSame)
			}
			if ins2 == tc.wantSame {
				t.Errorf("second Enqueue inserted = %v, want %v", ins2, !tc.wantSame)
			}
			wantRows := 2
			if tc.wantSame {
				wantRows = 1
			}
			if got := len(rows(t, pool)); got != wantRows {
				t.Errorf("rows = %d, want %d", got, wantRows)
			}
		})
	}
}

// TestEnqueueConcurrent starts many enqueues of one message at once: the
// unique indexes, not a read before the write, must make them one row.
func TestEnqueueConcurrent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  func(i int) support.Message
	}{
		{"same external id", func(int) support.Message { return mailMessage("em_1") }},
		{"same Message-ID and content, each under its own email id", func(i int) support.Message {
			return mailMessage("em_" + string(rune('a'+i)))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			q := support.NewQueue(pool)
			const n = 20
			type result struct {
				id       int64
				inserted bool
				err      error
			}
			results := make([]result, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					id, inserted, err := q.Enqueue(context.Background(), tc.msg(i))
					results[i] = result{id, inserted, err}
				})
			}
			close(start)
			wg.Wait()

			insertedCount := 0
			for i, r := range results {
				if r.err != nil {
					t.Fatalf("Enqueue %d: %v", i, r.err)
				}
				if r.id != results[0].id {
					t.Errorf("Enqueue %d id = %d, want %d like the others", i, r.id, results[0].id)
				}
				if r.inserted {
					insertedCount++
				}
			}
			if insertedCount != 1 {
				t.Errorf("inserted = true %d times, want exactly once", insertedCount)
			}
			if got := len(rows(t, pool)); got != 1 {
				t.Errorf("rows = %d, want 1", got)
			}
		})
	}
}

func TestEnqueueCleansText(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	m := mailMessage("em_1")
	m.TextBody = "nul\x00 and bad \xff bytes"
	if _, _, err := q.Enqueue(context.Background(), m); err != nil {
		t.Fatalf("Enqueue with NUL and invalid UTF-8: %v (Postgres would refuse it forever)", err)
	}
	got := rows(t, pool)
	if len(got) != 1 || got[0].TextBody == nil || *got[0].TextBody != "nul and bad \uFFFD bytes" {
		t.Errorf("text_body = %v, want the NUL dropped and the bad byte replaced", got)
	}
}

func TestEnqueueRejectsUnknownSource(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	for _, m := range []support.Message{
		{Source: "fax", ExternalID: "x", FromAddress: "a@b.c"},
		{Source: support.SourceWeb, FromAddress: "a@b.c"},
	} {
		if _, _, err := q.Enqueue(context.Background(), m); err == nil {
			t.Errorf("Enqueue(%+v) succeeded, want an error", m)
		}
	}
}

// threadOf reads the thread_id of message id.
func threadOf(t *testing.T, pool *pgxpool.Pool, id int64) int64 {
	t.Helper()
	var thread int64
	if err := pool.QueryRow(context.Background(), "SELECT thread_id FROM support_messages WHERE id = $1", id).Scan(&thread); err != nil {
		t.Fatalf("read thread_id of %d: %v", id, err)
	}
	return thread
}

// TestEnqueueThreads: a message that answers none starts its own thread (a
// form message always does); a reply joins the thread of the message it
// names, and of that message's thread when it was a reply itself.
func TestEnqueueThreads(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	ctx := context.Background()
	enqueue := func(m support.Message) int64 {
		t.Helper()
		id, inserted, err := q.Enqueue(ctx, m)
		if err != nil || !inserted {
			t.Fatalf("Enqueue(%s) = %d, %v, %v; want a new row", m.ExternalID, id, inserted, err)
		}
		return id
	}
	first := enqueue(mailMessage("em_1"))
	reply := mailMessage("em_2")
	reply.MessageID, reply.TextBody, reply.InReplyTo = "<reply@mail.example.com>", "thanks", "<abc@mail.example.com>"
	reply.AuthDMARC = "pass"
	replyID := enqueue(reply)
	again := mailMessage("em_3")
	again.MessageID, again.TextBody = "<again@mail.example.com>", "still nothing"
	again.AuthDMARC = "pass"
	again.References = []string{"<unknown@elsewhere.example>", "<reply@mail.example.com>"}
	againID := enqueue(again)
	form := enqueue(support.Message{Source: support.SourceWeb, ExternalID: "form:1", FromAddress: "bob@example.com",
		TextBody: "hi", InReplyTo: "<abc@mail.example.com>"})

	got := []int64{threadOf(t, pool, first), threadOf(t, pool, replyID), threadOf(t, pool, againID), threadOf(t, pool, form)}
	if diff := cmp.Diff([]int64{first, first, first, form}, got); diff != "" {
		t.Errorf("thread ids of first, reply, reply to the reply, form (-want +got):\n%s", diff)
	}
}

// TestEnqueueSkippedVerdict: a mail from the thread's own sender whose
// verdicts were skipped (AuthSkipped) starts its own thread, keeping
// In-Reply-To as sent: the verdict it lost may be a DMARC fail. The same
// mail with its DMARC pass kept joins.
func TestEnqueueSkippedVerdict(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	ctx := context.Background()
	first, _, err := q.Enqueue(ctx, mailMessage("em_1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		skipped bool
		joins   bool
	}{
		{"dmarc pass kept", false, true},
		{"verdicts skipped", true, false},
	} {
		m := mailMessage("em_" + tc.name)
		m.MessageID, m.TextBody, m.InReplyTo = "<"+strings.ReplaceAll(tc.name, " ", "-")+"@mail.example.com>", tc.name, "<abc@mail.example.com>"
		m.AuthDMARC, m.AuthSkipped = "pass", tc.skipped
		id, inserted, err := q.Enqueue(ctx, m)
		if err != nil || !inserted {
			t.Fatalf("%s: Enqueue = %d, %v, %v; want a new row", tc.name, id, inserted, err)
		}
		want := id
		if tc.joins {
			want = first
		}
		if got := threadOf(t, pool, id); got != want {
			t.Errorf("%s: thread %d, want %d (the first message's: %d)", tc.name, got, want, first)
		}
		var inReplyTo string
		if err := pool.QueryRow(ctx, "SELECT in_reply_to FROM support_messages WHERE id = $1", id).Scan(&inReplyTo); err != nil {
			t.Fatal(err)
		}
		if inReplyTo != m.InReplyTo {
			t.Errorf("%s: in_reply_to %q, want %q as sent", tc.name, inReplyTo, m.InReplyTo)
		}
	}
}

func TestMessageIDs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
	}{
		{"<a@x>", []string{"<a@x>"}},
		{" <a@x>\r\n\t<b@y> <c@z>", []string{"<a@x>", "<b@y>", "<c@z>"}},
		{"<a@x> (a comment)", []string{"<a@x>"}},
		{"bare@x", []string{"bare@x"}},
		{"", nil},
		{"two words", nil},
		{"<unclosed@x", nil},
	}
	for _, tc := range tests {
		if diff := cmp.Diff(tc.want, support.MessageIDs(tc.in)); diff != "" {
			t.Errorf("MessageIDs(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

func attachmentCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM support_attachments").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEnqueueWithAttachments: attachments are written with a new message
// only, in its transaction: a failed attach leaves no message behind, and a
// message already queued runs no attach.
func TestEnqueueWithAttachments(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	ctx := context.Background()
	content := []byte("%PDF-1.7 receipt")
	attach := func(ctx context.Context, w *support.Attachments) error {
		if err := w.Add(ctx, support.Attachment{ExternalID: "att_1", Filename: "receipt.pdf", Size: int64(len(content))}, bytes.NewReader(content)); err != nil {
			return err
		}
		return w.Add(ctx, support.Attachment{ExternalID: "att_2", Size: -1, NoContentReason: support.NoContentNotFound}, nil)
	}
	failing := map[string]func(ctx context.Context, w *support.Attachments) error{
		"attach fails after its first attachment": func(ctx context.Context, w *support.Attachments) error {
			if err := attach(ctx, w); err != nil {
				return err
			}
			return errors.New("download failed")
		},
		"content shorter than its size": func(ctx context.Context, w *support.Attachments) error {
			return w.Add(ctx, support.Attachment{ExternalID: "att_1", Size: int64(len(content)) + 1}, bytes.NewReader(content))
		},
	}
	for name, f := range failing {
		if _, _, err := q.EnqueueWith(ctx, mailMessage("em_1"), f); err == nil {
			t.Fatalf("%s: EnqueueWith succeeded", name)
		}
		if n := len(rows(t, pool)); n != 0 || attachmentCount(t, pool) != 0 {
			t.Fatalf("%s: %d messages, %d attachments; want none", name, n, attachmentCount(t, pool))
		}
	}

	id, inserted, err := q.EnqueueWith(ctx, mailMessage("em_1"), attach)
	if err != nil || !inserted {
		t.Fatalf("EnqueueWith = %d, %v, %v; want a new row", id, inserted, err)
	}
	ran := false
	again, inserted, err := q.EnqueueWith(ctx, mailMessage("em_1"), func(context.Context, *support.Attachments) error {
		ran = true
		return nil
	})
	if err != nil || inserted || again != id || ran {
		t.Errorf("EnqueueWith of a queued message = %d, %v, %v, attach ran %v; want %d, not inserted, no attach", again, inserted, err, ran, id)
	}

	type att struct {
		ExternalID string
		Size       *int64
		Content    []byte
		SHA256     []byte
		Reason     *string
	}
	rs, err := pool.Query(ctx, "SELECT external_id, size, content, sha256, no_content_reason FROM support_attachments WHERE support_message_id = $1 ORDER BY id", id)
	if err != nil {
		t.Fatal(err)
	}
	var got []att
	for rs.Next() {
		var a att
		if err := rs.Scan(&a.ExternalID, &a.Size, &a.Content, &a.SHA256, &a.Reason); err != nil {
			t.Fatal(err)
		}
		got = append(got, a)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	size := int64(len(content))
	sum := sha256.Sum256(content)
	want := []att{
		{ExternalID: "att_1", Size: &size, Content: content, SHA256: sum[:]},
		{ExternalID: "att_2", Reason: ptr("not_found")},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("attachments (-want +got):\n%s", diff)
	}
}

// TestEnqueueWithConcurrent: of many concurrent deliveries of one mail,
// exactly one writes its attachments.
func TestEnqueueWithConcurrent(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	const n = 20
	var attached atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			_, _, errs[i] = q.EnqueueWith(context.Background(), mailMessage("em_"+string(rune('a'+i))),
				func(ctx context.Context, w *support.Attachments) error {
					attached.Add(1)
					return w.Add(ctx, support.Attachment{ExternalID: "att_1", Size: 3}, strings.NewReader("abc"))
				})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("EnqueueWith %d: %v", i, err)
		}
	}
	if got := attached.Load(); got != 1 {
		t.Errorf("attach ran %d times, want 1", got)
	}
	if got := attachmentCount(t, pool); got != 1 || len(rows(t, pool)) != 1 {
		t.Errorf("%d messages, %d attachments; want 1 and 1", len(rows(t, pool)), got)
	}
}

// TestEnqueueThreadParticipants: a mail joins the conversation it names only
// when its sender takes part in it (wrote in it, in any case of the
// address, or is the Reply-To our answer went to) and DMARC did not fail;
// the first candidate whose conversation admits the sender wins.
func TestEnqueueThreadParticipants(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	ctx := context.Background()
	enqueue := func(id, msgID, from, dmarc, inReplyTo string, refs ...string) int64 {
		t.Helper()
		m := mailMessage(id)
		m.MessageID, m.FromAddress, m.AuthDMARC, m.InReplyTo, m.References = msgID, from, dmarc, inReplyTo, refs
		m.TextBody = "mail " + id
		n, inserted, err := q.Enqueue(ctx, m)
		if err != nil || !inserted {
			t.Fatalf("Enqueue(%s) = %d, %v, %v; want a new row", id, n, inserted, err)
		}
		return n
	}
	order := enqueue("order", "<order@x>", "ada@example.com", "pass", "")
	setReplyTo := `UPDATE support_messages SET reply_to = 'ada@home.example' WHERE id = $1`
	if _, err := pool.Exec(ctx, setReplyTo, order); err != nil {
		t.Fatal(err)
	}
	other := enqueue("other", "<other@x>", "bob@example.com", "pass", "")
	tests := []struct {
		id, from, dmarc, inReplyTo string
		refs                       []string
		want                       int64 // 0: its own
	}{
		{"same sender", "Ada@Example.com", "pass", "<order@x>", nil, order},
		{"no verdict", "ada@example.com", "", "<order@x>", nil, 0},
		{"reply-to address", "ada@home.example", "pass", "<order@x>", nil, order},
		{"dmarc fail", "ada@example.com", "fail", "<order@x>", nil, 0},
		{"stranger", "mallory@evil.example", "pass", "<order@x>", nil, 0},
		{"stranger's reference skipped for one of theirs", "bob@example.com", "pass", "<order@x>", []string{"<other@x>"}, other},
	}
	for i, tc := range tests {
		id := enqueue(tc.id, "<t"+strconv.Itoa(i)+"@x>", tc.from, tc.dmarc, tc.inReplyTo, tc.refs...)
		want := tc.want
		if want == 0 {
			want = id
		}
		if got := threadOf(t, pool, id); got != want {
			t.Errorf("%s: thread %d, want %d", tc.id, got, want)
		}
	}
}

// TestEnqueueThreadVerdicts: a reply from the thread's own address joins
// it only when its sender is authenticated (DMARC pass, or DMARC none with
// SPF and DKIM both pass); every other verdict, or none, is a possible
// spoof and starts its own thread, queued all the same.
func TestEnqueueThreadVerdicts(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	ctx := context.Background()
	first, _, err := q.Enqueue(ctx, mailMessage("em_first"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, spf, dkim, dmarc string
		joins                  bool
	}{
		{"dmarc pass", "fail", "fail", "pass", true},
		{"dmarc PASS, spaced", "", "", " PASS ", true},
		{"dmarc none, spf and dkim pass", "pass", "pass", "none", true},
		{"dmarc none, spf only", "pass", "fail", "none", false},
		{"dmarc none, dkim only", "", "pass", "none", false},
		{"dmarc none alone", "", "", "none", false},
		{"dmarc fail", "pass", "pass", "fail", false},
		{"gray", "pass", "pass", "gray", false},
		{"unknown", "pass", "pass", "unknown", false},
		{"processing_failed", "pass", "pass", "processing_failed", false},
		{"temperror", "pass", "pass", "temperror", false},
		{"empty verdict", "pass", "pass", "", false},
		{"no verdicts at all", "", "", "", false},
	}
	for i, tc := range tests {
		m := mailMessage("em_" + strconv.Itoa(i))
		m.MessageID, m.TextBody, m.InReplyTo = "<v"+strconv.Itoa(i)+"@x>", tc.name, "<abc@mail.example.com>"
		m.AuthSPF, m.AuthDKIM, m.AuthDMARC = tc.spf, tc.dkim, tc.dmarc
		id, inserted, err := q.Enqueue(ctx, m)
		if err != nil || !inserted {
			t.Fatalf("%s: Enqueue = %d, %v, %v; want a new row", tc.name, id, inserted, err)
		}
		want := id
		if tc.joins {
			want = first
		}
		if got := threadOf(t, pool, id); got != want {
			t.Errorf("%s: thread %d, want %d (first message %d, its own %d)", tc.name, got, want, first, id)
		}
	}
}
