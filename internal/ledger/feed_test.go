package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// A store in miniature, built as the real ones are: the subject's lock
// first (so the statement's snapshot, which old reads, comes after the
// previous writer's commit), then the guarded write with the feed's
// fragment after it.
const (
	testLockSQL  = `SELECT pg_advisory_xact_lock(hashtext('customer_features'), hashtext($1))`
	testWriteSQL = `
WITH old(j) AS (
    SELECT to_jsonb(f) - '{updated_at,last_event_id,last_event_created,gap_from,gap_to}'::text[]
    FROM customer_features f WHERE stripe_customer_id = $1
), up AS (
    INSERT INTO customer_features AS f (stripe_customer_id, lookup_keys, complete,
        last_event_id, last_event_created, updated_at)
    VALUES ($1, $2, true, $3, now(), now())
    ON CONFLICT (stripe_customer_id) DO UPDATE SET
        lookup_keys = EXCLUDED.lookup_keys, last_event_id = EXCLUDED.last_event_id,
        last_event_created = EXCLUDED.last_event_created, updated_at = EXCLUDED.updated_at
    RETURNING f.*
), new(kind, subject, customer, event_id, j) AS (
    SELECT 'customer_features', u.stripe_customer_id, u.stripe_customer_id, $3::text,
        to_jsonb(u) - '{updated_at,last_event_id,last_event_created,gap_from,gap_to}'::text[]
    FROM up u
), judged(provider, event_id, event_type, subject, outcome) AS (
    SELECT 'stripe', $3::text, 'test', $1::text,
        CASE WHEN s.last_event_id = $3 THEN 'unchanged' ELSE 'applied' END
    FROM up LEFT JOIN customer_features s ON s.stripe_customer_id = $1
),` + ledger.AppendCTE + `,` + ledger.RecordCTE + `
SELECT (SELECT id FROM appended)`
)

type execer interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// write sets customer's features to keys as event eventID, in q (a pool:
// its own implicit transaction; or an open transaction), and returns the
// change's id, 0 for none.
func write(t *testing.T, q execer, customer, eventID string, keys ...string) int64 {
	t.Helper()
	if keys == nil {
		keys = []string{}
	}
	b := &pgx.Batch{}
	b.Queue(testLockSQL, customer)
	b.Queue(testWriteSQL, customer, keys, eventID)
	br := q.SendBatch(context.Background(), b)
	var id *int64
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&id)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("write %s: %v", eventID, err)
	}
	if id == nil {
		return 0
	}
	return *id
}

func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// consumer reads the feed as an app does, remembering only its cursor.
type consumer struct {
	pool    *pgxpool.Pool
	cursor  ledger.Cursor
	seen    []int64
	changes []ledger.Change
	page    int
}

func (c *consumer) read(t *testing.T) []ledger.Change {
	t.Helper()
	var got []ledger.Change
	for {
		page, next, err := ledger.Read(context.Background(), c.pool, c.cursor, c.page)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		for _, ch := range page {
			c.seen = append(c.seen, ch.ID)
			c.changes = append(c.changes, ch)
		}
		c.cursor = next
		if len(page) < c.page {
			return got
		}
	}
}

// until reads until the consumer has seen n changes in all. Tests of
// other packages share the server, and any transaction of theirs that is
// running holds the horizon back, so "eventually" is what can be asserted.
func (c *consumer) until(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(c.seen) < n {
		if time.Now().After(deadline) {
			t.Fatalf("saw %v after 20s, want %d changes", c.seen, n)
		}
		c.read(t)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLateCommitIsNotSkipped is the feed's reason to exist: a transaction
// that drew its id (and txid) first but commits last is neither skipped
// nor read twice, and a newer change is held back until it commits.
func TestLateCommitIsNotSkipped(t *testing.T) {
	t.Parallel()
	for _, page := range []int{1, 500} {
		t.Run("page "+strconv.Itoa(page), func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			c := &consumer{pool: pool, page: page}

			old := begin(t, pool)
			older := write(t, old, "cus_old", "evt_old", "a") // holds the older txid, open

			newer := write(t, pool, "cus_new", "evt_new", "b") // commits
			if older == 0 || newer == 0 || newer <= older {
				t.Fatalf("ids %d, %d: want the open transaction's first", older, newer)
			}
			// However long we wait, the newer change stays below no
			// horizon while the older transaction runs.
			for range 5 {
				if got := c.read(t); len(got) > 0 {
					t.Fatalf("read %v while an older transaction was open", got)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := old.Commit(context.Background()); err != nil {
				t.Fatal(err)
			}
			c.until(t, 2)
			time.Sleep(50 * time.Millisecond)
			c.read(t) // nothing more: each change exactly once
			if diff := cmp.Diff([]int64{older, newer}, c.seen); diff != "" {
				t.Errorf("changes read (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSameRowInCommitOrder: two transactions write one row, the one that
// began first waiting for the other's lock. Every writer takes the row's
// lock before its first write, so the waiter gets its txid, and draws its
// change's id, only after the holder committed: txid and id both follow
// commit order, and the feed returns the row's changes in that order
// whichever windows the horizon cuts (an unrelated open transaction
// anywhere on the server can put a window's end between them).
func TestSameRowInCommitOrder(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	write(t, pool, "cus_1", "evt_0", "a")

	first := begin(t, pool) // begins first, writes second
	second := begin(t, pool)
	secondID := write(t, second, "cus_1", "evt_2", "c") // holds the row
	done := make(chan int64)
	go func() {
		// Waits for second's lock; t.Fatal is not for goroutines.
		b := &pgx.Batch{}
		b.Queue(testLockSQL, "cus_1")
		b.Queue(testWriteSQL, "cus_1", []string{"b"}, "evt_1")
		br := first.SendBatch(ctx, b)
		var id int64
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&id)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = first.Commit(ctx)
		}
		if err != nil {
			t.Error(err)
		}
		done <- id
	}()
	time.Sleep(100 * time.Millisecond) // let first block on the lock
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	firstID := <-done

	var firstTx, secondTx uint64
	if err := pool.QueryRow(ctx, `SELECT (SELECT txid::text::bigint FROM changes WHERE id = $1), (SELECT txid::text::bigint FROM changes WHERE id = $2)`, firstID, secondID).Scan(&firstTx, &secondTx); err != nil {
		t.Fatal(err)
	}
	if firstTx <= secondTx || firstID <= secondID {
		t.Errorf("the later commit has txid %d and id %d, the earlier txid %d and id %d: want both larger", firstTx, firstID, secondTx, secondID)
	}
	c := &consumer{pool: pool, page: 500}
	c.until(t, 3)
	var keys [][2]string
	for _, ch := range c.changes {
		keys = append(keys, [2]string{string(ch.Before), string(ch.After)})
	}
	want := [][2]string{
		{"", `{"complete": true, "lookup_keys": ["a"], "stripe_customer_id": "cus_1"}`},
		{`{"lookup_keys": ["a"]}`, `{"lookup_keys": ["c"]}`}, // second committed first
		{`{"lookup_keys": ["c"]}`, `{"lookup_keys": ["b"]}`},
	}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("changes in feed order, before and after (-want +got):\n%s", diff)
	}
}

// TestDoorbell: the doorbell rings with the newest change's id once
// changes are readable, never before their commit, never for a rollback,
// not for a change an older open transaction still holds below the
// horizon (the consumer could not read it yet), and not when nothing
// changed.
func TestDoorbell(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = listener.Exec(context.Background(), "UNLISTEN *")
		listener.Release()
	})
	if _, err := listener.Exec(ctx, "LISTEN "+ledger.Channel); err != nil {
		t.Fatal(err)
	}
	bell := ledger.NewDoorbell(pool)
	// ring looks once and returns what it rang with, and what the listener
	// heard (the empty string for nothing).
	ring := func() (int64, string) {
		t.Helper()
		id, err := bell.Ring(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wait := 200 * time.Millisecond
		if id != 0 {
			wait = 5 * time.Second
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		n, err := listener.Conn().WaitForNotification(wctx)
		if err != nil {
			return id, ""
		}
		return id, n.Payload
	}
	// ringing looks until the bell rings: another test's transaction on
	// the same server can hold the horizon (it is the cluster's) for a while.
	ringing := func() (int64, string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if id, heard := ring(); id != 0 || time.Now().After(deadline) {
				return id, heard
			}
		}
	}
	if id, heard := ring(); id != 0 || heard != "" { // the first look only sets the horizon
		t.Fatalf("first look rang %d, heard %q", id, heard)
	}

	rolled := begin(t, pool)
	write(t, rolled, "cus_1", "evt_r", "x")
	if id, heard := ring(); id != 0 || heard != "" {
		t.Fatalf("rang %d (heard %q) before commit", id, heard)
	}
	if err := rolled.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if id, heard := ring(); id != 0 || heard != "" {
		t.Fatalf("rang %d (heard %q) for a rollback", id, heard)
	}

	tx := begin(t, pool)
	id := write(t, tx, "cus_1", "evt_c", "y")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, heard := ringing(); got != id || heard != strconv.FormatInt(id, 10) {
		t.Fatalf("after commit: rang %d, heard %q; want %d", got, heard, id)
	}

	// A late commit: a takes its txid first, b commits first. b's change
	// waits above the horizon a holds, so the bell waits too; once a
	// commits, one ring covers both.
	a, b := begin(t, pool), begin(t, pool)
	idA := write(t, a, "cus_a", "evt_a", "1")
	idB := write(t, b, "cus_b", "evt_b", "1")
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, heard := ring(); got != 0 || heard != "" {
		t.Fatalf("rang %d (heard %q) for a change an open transaction holds back", got, heard)
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := max(idA, idB)
	if got, heard := ringing(); got != want || heard != strconv.FormatInt(want, 10) {
		t.Fatalf("after the older commit: rang %d, heard %q; want %d", got, heard, want)
	}
	c := &consumer{pool: pool, page: 10}
	c.until(t, 3)
	if got := c.seen[len(c.seen)-2:]; got[0] != idA || got[1] != idB {
		t.Errorf("consumer read %v, want ... %d, %d", c.seen, idA, idB)
	}

	// A write that changes nothing appends nothing and rings nothing.
	if got := write(t, pool, "cus_1", "evt_d", "y"); got != 0 {
		t.Errorf("unchanged write appended change %d", got)
	}
	if got, heard := ring(); got != 0 || heard != "" {
		t.Fatalf("rang %d (heard %q) for no change", got, heard)
	}
}

// TestTailFollow: tail with follow delivers what is there, then what
// commits later, and returns the cursor to resume from.
func TestTailFollow(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	first := write(t, pool, "cus_1", "evt_1", "a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan ledger.Change, 10)
	ended := make(chan ledger.Cursor)
	go func() {
		c, err := ledger.New(pool, 0).Tail(ctx, ledger.Cursor{}, true, 100*time.Millisecond, func(ch ledger.Change) error {
			got <- ch
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		ended <- c
	}()
	recv := func() ledger.Change {
		select {
		case ch := <-got:
			return ch
		case <-time.After(20 * time.Second):
			t.Fatal("no change within 20s")
		}
		return ledger.Change{}
	}
	if ch := recv(); ch.ID != first {
		t.Fatalf("first change %d, want %d", ch.ID, first)
	}
	second := write(t, pool, "cus_1", "evt_2", "b")
	last := recv()
	if last.ID != second {
		t.Fatalf("second change %d, want %d", last.ID, second)
	}
	var after map[string]any
	if err := json.Unmarshal(last.After, &after); err != nil || after["lookup_keys"] == nil {
		t.Errorf("after = %s, %v", last.After, err)
	}
	cancel()
	c := <-ended
	// Resuming from the returned cursor reads nothing twice.
	page, _, err := ledger.Read(context.Background(), pool, c, 10)
	if err != nil || len(page) != 0 {
		t.Errorf("resumed: %v, %v; want nothing", page, err)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []ledger.Cursor{{}, {Lo: 5}, {Lo: 5, Last: 7}, {Lo: 5, Hi: 9, Last: 123}} {
		got, err := ledger.ParseCursor(c.String())
		if err != nil || got != c {
			t.Errorf("ParseCursor(%q) = %v, %v", c, got, err)
		}
	}
	// The first release's cursors: between windows, and inside one.
	for s, want := range map[string]ledger.Cursor{
		"c1.741.0.0":     {Lo: 741},
		"c1.741.743.12":  {Lo: 741, Hi: 743, Last: 12},
		"c2.741.12":      {Lo: 741, Last: 12},
		"":               {},
		"c1.0.0.0":       {},
		"c2.99999999.99": {Lo: 99999999, Last: 99},
	} {
		if got, err := ledger.ParseCursor(s); err != nil || got != want {
			t.Errorf("ParseCursor(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"x", "c1.1.2", "c2.1.2.3", "c2.1", "c1.9.2.3", "c1.a.0.0", "c1.5.0.3", "c2.5.-1", "c3.1.2"} {
		if _, err := ledger.ParseCursor(s); !errors.Is(err, ledger.ErrCursor) {
			t.Errorf("ParseCursor(%q) = %v, want ErrCursor", s, err)
		}
	}
}

// TestFirstReleaseCursor: a cursor the first release printed inside a
// window (c1.lo.hi.last: the window's changes up to id last have been
// read) goes on with the rest of that window, then after it, reading
// nothing twice and skipping nothing.
func TestFirstReleaseCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	var ids []int64
	for i := range 5 {
		ids = append(ids, write(t, pool, "cus_"+strconv.Itoa(i%2), "evt_"+strconv.Itoa(i), strconv.Itoa(i)))
	}
	// The window the first release would have opened over them: its hi a
	// horizon above all five.
	var hi uint64
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint
			WHERE pg_snapshot_xmin(pg_current_snapshot()) > (SELECT max(txid) FROM changes)`).Scan(&hi)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) || time.Now().After(deadline) {
			t.Fatalf("horizon above the changes: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := 5; i < 7; i++ { // after the window
		ids = append(ids, write(t, pool, "cus_"+strconv.Itoa(i%2), "evt_"+strconv.Itoa(i), strconv.Itoa(i)))
	}
	printed := "c1.0." + strconv.FormatUint(hi, 10) + "." + strconv.FormatInt(ids[1], 10)
	start, err := ledger.ParseCursor(printed)
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range []int{1, 2, 500} {
		t.Run("page "+strconv.Itoa(page), func(t *testing.T) {
			c := &consumer{pool: pool, page: page, cursor: start}
			c.until(t, 5)
			c.read(t)
			if diff := cmp.Diff(ids[2:], c.seen); diff != "" {
				t.Errorf("changes read after %s (-want +got):\n%s", printed, diff)
			}
		})
	}
}

// TestChangesOfCursor: an event's changes, as events show prints them,
// each carry the cursor that resumes the feed just after that change.
func TestChangesOfCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	l := ledger.New(pool, 3)
	first := write(t, pool, "cus_1", "evt_1", "a")
	second := write(t, pool, "cus_1", "evt_2", "b")
	e, err := l.Get(ctx, "stripe", "evt_1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.ChangesOf(ctx, e)
	if err != nil || len(got) != 1 || got[0].ID != first {
		t.Fatalf("ChangesOf(evt_1) = %v, %v; want change %d", got, err, first)
	}
	c := &consumer{pool: pool, page: 500, cursor: got[0].Cursor}
	c.until(t, 1)
	c.read(t)
	if diff := cmp.Diff([]int64{second}, c.seen); diff != "" {
		t.Errorf("read after %s (-want +got):\n%s", got[0].Cursor, diff)
	}
}

// TestFirstReleaseCursorKeepsTraceparent: a change read through a first
// release's window carries its traceparent, as one read after it does.
func TestFirstReleaseCursorKeepsTraceparent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO changes (at, kind, subject, after, traceparent)
VALUES (now(), 'support_message', 's', '{}', $1) RETURNING id`, tp).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var hi uint64
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint
			WHERE pg_snapshot_xmin(pg_current_snapshot()) > (SELECT max(txid) FROM changes)`).Scan(&hi)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) || time.Now().After(deadline) {
			t.Fatalf("horizon above the change: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	page, _, err := ledger.Read(ctx, pool, ledger.Cursor{Hi: hi}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 1 || page[0].ID != id || page[0].Traceparent != tp {
		t.Fatalf("read through the window %+v, want change %d with traceparent %s", page, id, tp)
	}
}
