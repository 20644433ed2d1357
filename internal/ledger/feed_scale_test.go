package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// growFeed appends n changes shaped as deliveries write them: a
// transaction every three rows, in txid and id order. The transactions are
// real (burnt one by one, committed, so below the horizon) and the rows
// carry their ids: one INSERT stands in for n/3 deliveries.
func growFeed(t *testing.T, conn *pgx.Conn, n int) {
	t.Helper()
	ctx := context.Background()
	var x0 uint64
	if err := conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&x0); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	// DO with COMMIT needs the simple protocol's implicit transaction.
	burn := fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`, n/3+1)
	if _, err := conn.Exec(ctx, burn, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `
INSERT INTO changes (txid, at, kind, subject, stripe_customer_id, event_id, before, after)
SELECT ($1::bigint + 1 + (g - 1) / 3)::text::xid8, now(), 'subscription',
       'sub_' || (g % 997), 'cus_' || (g % 997), 'evt_' || g,
       '{"status": "trialing"}', '{"status": "active"}'
FROM generate_series(1, $2::int) g`, x0, n); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE changes`); err != nil {
		t.Fatal(err)
	}
}

// scanOfChanges runs ReadSQL at cursor c under EXPLAIN (ANALYZE, BUFFERS)
// as the prepared statement feed, and returns its plan's scan of changes.
func scanOfChanges(t *testing.T, conn *pgx.Conn, c ledger.Cursor, limit int) planNode {
	t.Helper()
	var out []byte
	q := fmt.Sprintf(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE feed('%d', %d, %d)`, c.Lo, c.Last, limit)
	if err := conn.QueryRow(context.Background(), q).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN: %v (%s)", err, out)
	}
	var scans []planNode
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.Relation == "changes" {
			scans = append(scans, n)
		}
		for _, p := range n.Plans {
			walk(p)
		}
	}
	walk(plans[0].Plan)
	if len(scans) != 1 {
		t.Fatalf("plan scans changes %d times, want once: %s", len(scans), out)
	}
	return scans[0]
}

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Removed  float64    `json:"Rows Removed by Filter"`
	Hit      int64      `json:"Shared Hit Blocks"`
	Read     int64      `json:"Shared Read Blocks"`
	Plans    []planNode `json:"Plans"`
}

// TestFeedPageCostIsFlat: on a long-lived connection whose plans are
// generic (plan_cache_mode=force_generic_plan, what a connection's cached
// statement turns into after its sixth run), a page of the feed reads
// only its own rows from one index, whether the cursor is at the feed's
// start or at its end. The first release's window query read the whole
// window to return one page under such a plan.
func TestFeedPageCostIsFlat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	const n, page = 6000, 500
	growFeed(t, conn, n)
	for _, stmt := range []string{
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE feed(text, bigint, bigint) AS ` + ledger.ReadSQL,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	// Most blocks a page may touch: its rows' heap pages (about 40 rows to
	// one here) and the index's path down and along, with room to spare.
	// Reading the whole feed touches several hundred.
	maxBlocks := func(rows int) int64 { return int64(rows/20 + 20) }
	check := func(t *testing.T, at ledger.Cursor, want int) {
		t.Helper()
		s := scanOfChanges(t, conn, at, page)
		if s.Index != "changes_txid" || s.Rows*s.Loops > float64(want) || s.Removed > 0 ||
			s.Hit+s.Read > maxBlocks(want) {
			t.Errorf("at %s: %s of changes by %q read %v rows (removed %v), %d blocks; want an index scan of changes_txid reading at most %d rows, %d blocks",
				at, s.Type, s.Index, s.Rows*s.Loops, s.Removed, s.Hit+s.Read, want, maxBlocks(want))
		}
	}

	// Page after page from the start, on the same connection.
	var c ledger.Cursor
	var got []ledger.Change
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("read %d changes after 20s, want %d (a transaction of another test holds the horizon?)", len(got), n)
		}
		check(t, c, page)
		p, next, err := ledger.Read(ctx, conn, c, page)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p...)
		c = next
	}
	if !slices.IsSortedFunc(got, func(a, b ledger.Change) int { return int(a.ID - b.ID) }) || len(got) != n {
		t.Fatalf("read %d changes, want %d in order", len(got), n)
	}

	// At the end: one new change at a time.
	for i := range 8 {
		id := write(t, conn, "cus_end", "evt_end_"+strconv.Itoa(i), "k"+strconv.Itoa(i))
		var p []ledger.Change
		deadline := time.Now().Add(20 * time.Second)
		for len(p) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("change %d not read after 20s", id)
			}
			check(t, c, 1)
			if p, c, err = ledger.Read(ctx, conn, c, page); err != nil {
				t.Fatal(err)
			}
		}
		if len(p) != 1 || p[0].ID != id {
			t.Fatalf("read %v, want change %d alone", p, id)
		}
	}
}
