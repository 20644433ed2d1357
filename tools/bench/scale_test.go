package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// TestGrow: the grown rows are shaped as the service's own (the access
// view finds a user's subscription; the feed reads every change, in
// order, each transaction's three together), and growing twice goes on
// from where the first stopped.
func TestGrow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if err := grow(ctx, conn, 0, 40); err != nil {
		t.Fatal(err)
	}
	if err := grow(ctx, conn, 40, 100); err != nil {
		t.Fatal(err)
	}
	var subs, sessions, events, changes int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM entitlements), (SELECT count(*) FROM checkout_sessions),
		(SELECT count(*) FROM webhook_events), (SELECT count(*) FROM changes)`).Scan(&subs, &sessions, &events, &changes); err != nil {
		t.Fatal(err)
	}
	if subs != 100 || sessions != 125 || events != 300 || changes != 300 {
		t.Errorf("grown rows: %d subscriptions, %d sessions, %d events, %d changes; want 100, 125, 300, 300", subs, sessions, events, changes)
	}
	var sub string
	if err := conn.QueryRow(ctx, `SELECT stripe_subscription_id FROM customer_access WHERE client_reference_id = 'user_77'`).Scan(&sub); err != nil || sub != "sub_scale_77" {
		t.Errorf("access of user_77 = %q, %v; want sub_scale_77", sub, err)
	}
	// Every lookup the scale run times finds rows for the keys it asks.
	for _, l := range lookups {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM (`+l.sql+`) q`, lookupKey(l.key, 77)).Scan(&n); err != nil || n == 0 {
			t.Errorf("%s of key 77: %d rows, %v; want some", l.name, n, err)
		}
	}
	var got []ledger.Change
	var c ledger.Cursor
	for deadline := time.Now().Add(20 * time.Second); len(got) < 300; {
		if time.Now().After(deadline) {
			t.Fatalf("read %d changes after 20s, want 300", len(got))
		}
		page, next, err := ledger.Read(ctx, conn, c, 64)
		if err != nil {
			t.Fatal(err)
		}
		got, c = append(got, page...), next
	}
	for i, ch := range got {
		if i > 0 && (ch.ID <= got[i-1].ID || ch.Cursor.Lo < got[i-1].Cursor.Lo) {
			t.Fatalf("change %d (%s) after %d (%s): want id and txid order alike", ch.ID, ch.Cursor, got[i-1].ID, got[i-1].Cursor)
		}
		if i%3 > 0 && ch.Cursor.Lo != got[i-1].Cursor.Lo {
			t.Errorf("change %d: txid %d, the one before %d; want three changes to a transaction", ch.ID, ch.Cursor.Lo, got[i-1].Cursor.Lo)
		}
	}
}

// The scale report prints a column per size, and "-" where a size has no
// figure (no retention on an empty database, unpaced only at the largest).
func TestRenderScale(t *testing.T) {
	t.Parallel()
	lat := []time.Duration{time.Millisecond}
	run := result{requests: 10, elapsed: time.Second, lat: lat, c: counters{targetCPU: 1e6, allCPU: 2e6}}
	point := func(size int, trim, unpaced *trimRun) scalePoint {
		return scalePoint{size: size, sat: run, fixed: run, lookup: slices.Repeat([][]time.Duration{lat}, len(lookups)),
			lookupExec: slices.Repeat([][]time.Duration{lat}, len(lookups)), feedStart: lat, feedEnd: lat,
			bytesPerRow: map[string]float64{"changes": 300}, rows: map[string]float64{"changes": 3000},
			trim: trim, unpaced: unpaced}
	}
	tr := &trimRun{rows: 1800, passes: 3, took: time.Minute, wal: 5e6, checkpoints: 1, before: run, during: run, after: run}
	r := &scaleReport{o: options{scale: 1000, rate: 300, duration: time.Second},
		points: []scalePoint{point(0, nil, nil), point(100, tr, nil), point(1000, tr, tr)}}
	var b strings.Builder
	r.render(&b)
	for _, want := range []string{
		"| figure | 0 subscriptions | 100 subscriptions | 1000 subscriptions |",
		"| access by client_reference_id, p50 / p99 ms (in Postgres p50) | 1.00 / 1.00 (1.00) |",
		"| answer by stripe_customer_id, p50 / p99 ms (in Postgres p50) | 1.00 / 1.00 (1.00) |",
		"| retention: expired rows trimmed | - | 1800 in 1m0s (2 passes) | 1800 in 1m0s (2 passes) |",
		"| retention unpaced: expired rows trimmed | - | - | 1800 in 1m0s (2 passes) |",
		"| disk per row: changes, bytes | 300 (3000 rows) |",
		"| disk per row: webhook_events, bytes | - | - | - |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
