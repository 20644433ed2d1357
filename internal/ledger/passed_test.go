package ledger_test

import (
	"testing"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// TestCursorPassed: a cursor has read every change at or before it in
// (txid, id) order; a first release's window cursor, the changes below
// its lo and those in [lo, hi) up to its last id.
func TestCursorPassed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cursor string
		txid   uint64
		id     int64
		want   bool
	}{
		{"", 1, 1, false},
		{"c2.100.7", 99, 50, true},
		{"c2.100.7", 100, 7, true},
		{"c2.100.7", 100, 6, true},
		{"c2.100.7", 100, 8, false},
		{"c2.100.7", 101, 1, false},
		{"c2.100.0", 100, 1, false},
		{"c1.100.110.7", 99, 50, true},
		{"c1.100.110.7", 105, 7, true},
		{"c1.100.110.7", 105, 8, false},
		{"c1.100.110.7", 110, 1, false},
	} {
		c, err := ledger.ParseCursor(tc.cursor)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Passed(tc.txid, tc.id); got != tc.want {
			t.Errorf("%q.Passed(%d, %d) = %v, want %v", tc.cursor, tc.txid, tc.id, got, tc.want)
		}
	}
}
