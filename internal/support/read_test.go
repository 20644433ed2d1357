package support_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// changeOf returns the txid and id of message id's change in the feed.
func changeOf(t *testing.T, pool *pgxpool.Pool, id int64) (txid string, changeID int64) {
	t.Helper()
	err := pool.QueryRow(context.Background(),
		`SELECT txid::text, id FROM changes WHERE kind = 'support_message' AND subject = $1::bigint::text`, id).Scan(&txid, &changeID)
	if err != nil {
		t.Fatalf("change of message %d: %v", id, err)
	}
	return txid, changeID
}

func listStates(t *testing.T, pool *pgxpool.Pool, q support.ListQuery) map[int64]support.ForwardState {
	t.Helper()
	got := map[int64]support.ForwardState{}
	err := support.List(context.Background(), pool, q, func(l support.Listed) error {
		got[l.ID] = l.Forward.State
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestListForwardStates: support list says where each message's forward
// stands, from a delivery row when the relay wrote one, else from the
// forward consumer's cursor: a change it passed with no row is delivered
// (the relay may record a delivery by its cursor alone), one it has not
// reached is not_yet, and with no consumer, or a disabled one that never
// took it, forwarding is off.
func TestListForwardStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	var ids []int64
	for i := range 4 {
		m := mailMessage(fmt.Sprintf("em_%d", i))
		m.MessageID = fmt.Sprintf("<m%d@example.com>", i)
		if i == 3 {
			m = support.Message{Source: support.SourceWeb, ExternalID: "form:1", FromAddress: "bob@example.com", TextBody: "hi"}
		}
		id, _, err := q.Enqueue(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	all := support.ListQuery{Since: time.Now().Add(-time.Hour)}
	want := map[int64]support.ForwardState{ids[0]: "off", ids[1]: "off", ids[2]: "off", ids[3]: "off"}
	if diff := cmp.Diff(want, listStates(t, pool, all)); diff != "" {
		t.Errorf("no forward consumer (-want +got):\n%s", diff)
	}

	// The consumer has passed messages 0 and 1 (its cursor at 1's change);
	// 0 has a failed delivery row, 1 none.
	txid1, change1 := changeOf(t, pool, ids[1])
	_, change0 := changeOf(t, pool, ids[0])
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO feed_consumers (name, cursor, updated_at, floor, enabled) VALUES ('forward', $1, now(), $2::text::xid8, true)`,
		fmt.Sprintf("c2.%s.%d", txid1, change1), txid1)
	exec(`INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, last_error, change)
		VALUES ('forward', $1, $2::bigint::text, $2::bigint::text, 'failed', 2, 'resend: 500', '{}')`, change0, ids[0])
	want = map[int64]support.ForwardState{ids[0]: "failed", ids[1]: "delivered", ids[2]: "not_yet", ids[3]: "not_yet"}
	if diff := cmp.Diff(want, listStates(t, pool, all)); diff != "" {
		t.Errorf("consumer at message 1 (-want +got):\n%s", diff)
	}
	// The same delivered forward with the row the relay used to write.
	exec(`INSERT INTO relay_deliveries (consumer, change_id, subject, order_key, state, attempts, result, delivered_at, change)
		VALUES ('forward', $1, $2::bigint::text, $2::bigint::text, 'delivered', 1, 're_1', now(), '{}')`, change1, ids[1])
	if diff := cmp.Diff(want, listStates(t, pool, all)); diff != "" {
		t.Errorf("delivered with a row (-want +got):\n%s", diff)
	}

	q2 := all
	q2.States = []support.ForwardState{"not_yet", "failed"}
	q2.Source = support.SourceEmail
	if diff := cmp.Diff(map[int64]support.ForwardState{ids[0]: "failed", ids[2]: "not_yet"}, listStates(t, pool, q2)); diff != "" {
		t.Errorf("email, not_yet or failed (-want +got):\n%s", diff)
	}
	if got := listStates(t, pool, support.ListQuery{Since: time.Now().Add(time.Minute)}); len(got) != 0 {
		t.Errorf("since a minute from now: %v, want none", got)
	}

	exec(`UPDATE feed_consumers SET enabled = false`)
	want = map[int64]support.ForwardState{ids[0]: "failed", ids[1]: "delivered", ids[2]: "off", ids[3]: "off"}
	if diff := cmp.Diff(want, listStates(t, pool, all)); diff != "" {
		t.Errorf("consumer disabled (-want +got):\n%s", diff)
	}
}

// TestShowWholeMessage: support show reads a message with its thread,
// attachments (names and sizes; the bytes by name) and forward.
func TestShowWholeMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	q := support.NewQueue(pool)
	first, _, err := q.Enqueue(ctx, mailMessage("em_1"))
	if err != nil {
		t.Fatal(err)
	}
	reply := mailMessage("em_2")
	reply.MessageID, reply.InReplyTo, reply.Subject = "<reply@mail.example.com>", "<abc@mail.example.com>", "Re: My order"
	reply.AuthDMARC, reply.AuthSPF, reply.AuthDKIM, reply.SenderAuthenticated = "pass", "pass", "pass", new(true)
	content := []byte("%PDF-1.7 receipt")
	id, _, err := q.EnqueueWith(ctx, reply, func(ctx context.Context, w *support.Attachments) error {
		if err := w.Add(ctx, support.Attachment{ExternalID: "att_1", Filename: "receipt.pdf", ContentType: "application/pdf",
			Size: int64(len(content))}, bytes.NewReader(content)); err != nil {
			return err
		}
		return w.Add(ctx, support.Attachment{ExternalID: "att_2", Filename: "huge.zip", Size: 1 << 30, NoContentReason: support.NoContentTooLarge}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}

	m, err := support.Show(ctx, pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if m.ThreadID != first || len(m.Thread) != 2 || m.Thread[0].ID != first || m.Thread[1].ID != id {
		t.Errorf("thread %d %+v, want %d then %d", m.ThreadID, m.Thread, first, id)
	}
	if m.Subject != "Re: My order" || m.InReplyTo != "<abc@mail.example.com>" || m.Text != "Where is my order?" ||
		m.HTMLBytes != len("<p>Where is my order?</p>") || m.SenderAuthenticated == nil || !*m.SenderAuthenticated {
		t.Errorf("message = %+v", m)
	}
	if m.Forward.State != support.ForwardOff || m.Forward.ChangeID == nil {
		t.Errorf("forward = %+v, want off with its change", m.Forward)
	}
	gotAtt := []string{}
	for _, a := range m.Attachments {
		gotAtt = append(gotAtt, fmt.Sprintf("%s %d %q", a.Filename, a.Size, a.NoContentReason))
	}
	if diff := cmp.Diff([]string{`receipt.pdf 16 ""`, `huge.zip 1073741824 "too_large"`}, gotAtt); diff != "" {
		t.Errorf("attachments (-want +got):\n%s", diff)
	}

	if b, err := support.AttachmentContent(ctx, pool, id, "receipt.pdf"); err != nil || !bytes.Equal(b, content) {
		t.Errorf("receipt.pdf = %q, %v; want its bytes", b, err)
	}
	if _, err := support.AttachmentContent(ctx, pool, id, "huge.zip"); !errors.Is(err, support.ErrNoContent) {
		t.Errorf("huge.zip: %v, want ErrNoContent", err)
	}
	if _, err := support.AttachmentContent(ctx, pool, id, "other.pdf"); !errors.Is(err, support.ErrNoAttachment) {
		t.Errorf("other.pdf: %v, want ErrNoAttachment", err)
	}
	if html, err := support.HTML(ctx, pool, id); err != nil || html != "<p>Where is my order?</p>" {
		t.Errorf("HTML = %q, %v", html, err)
	}
	if _, err := support.Show(ctx, pool, id+100); !errors.Is(err, support.ErrNotFound) {
		t.Errorf("Show of a missing id: %v, want ErrNotFound", err)
	}
}

// TestListPages: List reads in pages; messages queued in the same
// microsecond across a page's edge are each listed once, in order.
func TestListPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	// 1,201 messages at three instants: two page edges fall inside one.
	_, err := pool.Exec(ctx, `INSERT INTO support_messages (source, external_id, from_address, received_at, created_at)
		SELECT 'web', 'form:' || g, 'a@example.com', now(), now() - (g % 3) * interval '1 minute'
		FROM generate_series(1, 1201) g`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	err = support.List(ctx, pool, support.ListQuery{Since: time.Now().Add(-time.Hour)}, func(l support.Listed) error {
		ids = append(ids, l.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, id := range ids {
		seen[id] = true
	}
	if len(ids) != 1201 || len(seen) != 1201 {
		t.Errorf("listed %d messages, %d distinct; want 1201 each", len(ids), len(seen))
	}
}
