package support_test

import (
	"context"
	"crypto/sha256"
	"sync"
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
