package support_test

import (
	"context"
	"strings"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// TestEnqueueWritesLedgerAndFeed: a new message appends one change (no
// bodies in it); a delivery's ledger row says applied, then unchanged for
// a redelivery, which appends nothing; a form post has no ledger row.
func TestEnqueueWritesLedgerAndFeed(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	q := support.NewQueue(pool)
	entry := &ledger.Entry{Provider: "resend", EventID: "msg_1", Type: "email.received"}
	id, inserted, err := q.EnqueueFor(ctx, entry, mailMessage("em_1"), nil)
	if err != nil || !inserted {
		t.Fatalf("EnqueueFor = %d, %v, %v", id, inserted, err)
	}
	if _, inserted, err := q.EnqueueFor(ctx, entry, mailMessage("em_1"), nil); err != nil || inserted {
		t.Fatalf("again: inserted %v, %v", inserted, err)
	}
	if _, _, err := q.Enqueue(ctx, support.Message{Source: support.SourceWeb, ExternalID: "k1", FromAddress: "b@example.com", TextBody: "hi"}); err != nil {
		t.Fatal(err)
	}

	l := ledger.New(pool, 5)
	e, err := l.Get(ctx, "resend", "msg_1")
	if err != nil {
		t.Fatal(err)
	}
	if e.Outcome != ledger.Applied || e.Attempts != 2 || e.Subject == nil || *e.Subject == "" || e.EventType == nil || *e.EventType != "email.received" {
		t.Errorf("ledger row %+v, want applied after 2 attempts", e)
	}
	var kinds []string
	var after string
	rows, err := pool.Query(ctx, `SELECT kind, coalesce(event_id, '-'), before IS NULL, after::text FROM changes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var kind, event string
		var beforeNull bool
		if err := rows.Scan(&kind, &event, &beforeNull, &after); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, kind+" "+event)
		if !beforeNull || strings.Contains(after, "Where is my order") || !strings.Contains(after, `"from_address"`) {
			t.Errorf("change %s %s: before null %v, after %s", kind, event, beforeNull, after)
		}
	}
	if want := []string{"support_message msg_1", "support_message -"}; strings.Join(kinds, ",") != strings.Join(want, ",") {
		t.Errorf("changes = %q, want %q", kinds, want)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_events`).Scan(&n); err != nil || n != 1 {
		t.Errorf("ledger rows = %d, %v; want only the delivery's", n, err)
	}
}
