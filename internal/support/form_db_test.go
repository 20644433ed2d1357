package support_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// TestFormDatabaseShare locks support_messages in another transaction and
// posts the form four times at once, the last with its honeypot filled: the
// posts never hold more than a quarter of the pool (one of four
// connections), and each gives up at the form's deadline with 503 and
// Retry-After instead of waiting on the lock, the bot's as a person's.
func TestFormDatabaseShare(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	h := support.NewForm(support.NewQueue(pool), support.FormConfig{Rate: 100, DatabaseMaxConns: 4, Registerer: reg}).Submit()

	unlock := dbtest.LockTable(t, dbURL, "support_messages")
	// A honeypot post draws its id from the table's sequence, which the
	// table's lock does not hold: ALTER SEQUENCE in an open transaction
	// holds nextval too, so that whichever post takes the form's share,
	// a person's or the bot's, waits on the database until its deadline.
	seq, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seq.Close(context.Background()) })
	if _, err := seq.Exec(context.Background(), `BEGIN; ALTER SEQUENCE support_messages_id_seq INCREMENT BY 1`); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	answers := make([]int, 4)
	retryAfter := make([]string, 4)
	for i := range answers {
		wg.Go(func() {
			fields := map[string]any{"email": "ada@example.com", "message": "Help " + strconv.Itoa(i)}
			if i == len(answers)-1 {
				fields["website"] = "https://spam.example"
			}
			w := postJSON(t, h, fields)
			answers[i], retryAfter[i] = w.Code, w.Header().Get("Retry-After")
		})
	}
	// The posts' sessions waiting on the lock, sampled from a connection
	// of the test's own: the pool's count of acquired connections also
	// holds one whose query the deadline cancelled while it is being
	// closed, after the post gave its share back (seen under load).
	watch, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watch.Close(context.Background()) })
	var done atomic.Bool
	var most int32
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for !done.Load() {
			var n int32
			if err := watch.QueryRow(context.Background(), `SELECT count(*)::int FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Error(err)
				return
			}
			most = max(most, n)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg.Wait()
	done.Store(true)
	<-sampled

	for i, code := range answers {
		if code != http.StatusServiceUnavailable || retryAfter[i] == "" {
			t.Errorf("post %d: status = %d, Retry-After %q; want 503 with Retry-After", i, code, retryAfter[i])
		}
	}
	if most != 1 {
		t.Errorf("up to %d form posts waited on the database at once, want 1 (a quarter of the pool of 4)", most)
	}
	wantCounts(t, reg, map[string]float64{"failed": 4})

	unlock()
	if _, err := seq.Exec(context.Background(), `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if w := postJSON(t, h, map[string]any{"email": "ada@example.com", "message": "Help"}); w.Code != http.StatusAccepted {
		t.Errorf("after the lock: status = %d %s, want 202", w.Code, w.Body)
	}
}
