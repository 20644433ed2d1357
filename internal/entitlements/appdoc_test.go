package entitlements_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

// TestAppDocAccessQuery runs docs/APP.md's access query as the page gives
// it, for user 42 and for a user who has access: an unknown user is
// answered false, not NULL (which an app reading a bool gets wrong or
// fails on).
func TestAppDocAccessQuery(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/APP.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "-- May the app's user 42 use \"pro\"?\n")
	query, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 || !strings.Contains(query, "'42'") {
		t.Fatal(`docs/APP.md has no sql block starting -- May the app's user 42 use "pro"? and naming '42'`)
	}
	query = strings.ReplaceAll(query, "'42'", "$1")

	ctx := context.Background()
	pool := dbtest.NewPool(t)
	if _, err := pool.Exec(ctx, strings.ReplaceAll(seedAccessSQL, "$1::int", "12")); err != nil {
		t.Fatal(err)
	}
	var user string
	err = pool.QueryRow(ctx, `SELECT client_reference_id FROM customer_access
		WHERE has_access AND client_reference_id IS NOT NULL ORDER BY 1 LIMIT 1`).Scan(&user)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user string
		want bool
	}{{"42", false}, {user, true}} {
		var got *bool
		if err := pool.QueryRow(ctx, query, tc.user).Scan(&got); err != nil {
			t.Fatalf("user %s: %v", tc.user, err)
		}
		if got == nil {
			t.Errorf("user %s: NULL, want %v", tc.user, tc.want)
		} else if *got != tc.want {
			t.Errorf("user %s: %v, want %v", tc.user, *got, tc.want)
		}
	}
}
