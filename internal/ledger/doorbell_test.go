package ledger

import (
	"context"
	"strings"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestDoorbellPlan: the bell's look reads the range of the (txid, id)
// index between the two horizons, in the generic plan a pool's prepared
// statement settles on, and never walks the table.
func TestDoorbellPlan(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, s := range []string{
		// A feed of some size, analyzed: on an empty one any plan is cheap.
		`INSERT INTO changes (txid, at, kind, subject)
		 SELECT (1000 + g)::text::xid8, now(), 'subscription', 'sub_' || g FROM generate_series(1, 50000) g`,
		`ANALYZE changes`,
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE bell(text) AS ` + bellSQL,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	defer conn.Exec(ctx, `DEALLOCATE bell; RESET plan_cache_mode`) //nolint:errcheck
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE bell('1')`)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	p := plan.String()
	if !strings.Contains(p, "changes_txid") || !strings.Contains(p, "Index Cond: ((txid >=") || strings.Contains(p, "Filter") {
		t.Errorf("the bell's look does not read only its range of changes_txid:\n%s", p)
	}
}
