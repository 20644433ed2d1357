package migrations_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/migrations"
)

// databaseAt returns a database migrated up to version only, as a
// database of an earlier release is: dbtest's fresh database, emptied.
func databaseAt(t *testing.T, version int64) string {
	t.Helper()
	dbURL := dbtest.NewDatabase(t)
	conn := connect(t, dbURL, "")
	if _, err := conn.Exec(t.Context(), `DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.ApplyUpTo(t.Context(), openDB(t, dbURL), version); err != nil {
		t.Fatal(err)
	}
	return dbURL
}

// pendingReleases returns a database migrated up to 00013, with 00014 (an
// ALTER TABLE on webhook_events, which every delivery writes) pending, as
// a database of the previous release is.
func pendingReleases(t *testing.T) string {
	t.Helper()
	return databaseAt(t, 13)
}

func connect(t *testing.T, dbURL, application string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if application != "" {
		cfg.RuntimeParams["application_name"] = application
	}
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// later runs fn after d on a goroutine of its own, and the test's
// cleanup waits for it to end: fn uses a connection that an earlier
// cleanup closes, and closing it while fn still runs is a data race.
func later(t *testing.T, d time.Duration, fn func()) {
	t.Helper()
	done := make(chan struct{})
	time.AfterFunc(d, func() {
		defer close(done)
		fn()
	})
	t.Cleanup(func() { <-done })
}

func openDB(t *testing.T, dbURL string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// holdReader opens a transaction that has read webhook_events and stays
// open, as a report or pg_dump does: it holds an ACCESS SHARE lock, which
// an ALTER TABLE must wait for. It returns the session's pid and a func
// that ends the transaction.
func holdReader(t *testing.T, dbURL string) (pid uint32, end func()) {
	t.Helper()
	return holdTable(t, dbURL, "webhook_events")
}

// holdTable is holdReader on table.
func holdTable(t *testing.T, dbURL, table string) (pid uint32, end func()) {
	t.Helper()
	conn := connect(t, dbURL, "nightly-report")
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `SELECT count(*) FROM `+table); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	// Before conn is closed (cleanups run last first), and after an end
	// called from another goroutine (a time.AfterFunc) has returned.
	t.Cleanup(end)
	return conn.PgConn().PID(), end
}

// writeLoop inserts a ledger row every 20 ms, as deliveries do, until stop,
// which returns the slowest insert.
func writeLoop(t *testing.T, dbURL string) (stop func() time.Duration) {
	t.Helper()
	conn := connect(t, dbURL, "delivery")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan time.Duration)
	go func() {
		var slowest time.Duration
		for i := 0; ctx.Err() == nil; i++ {
			start := time.Now()
			_, err := conn.Exec(ctx, `INSERT INTO webhook_events (provider, event_id, outcome, attempts, first_seen_at)
				VALUES ('stripe', $1, 'applied', 1, now())`, fmt.Sprintf("evt_%d", i))
			if err != nil && ctx.Err() == nil {
				t.Errorf("insert: %v", err)
			}
			slowest = max(slowest, time.Since(start))
			time.Sleep(20 * time.Millisecond)
		}
		done <- slowest
	}()
	return func() time.Duration { cancel(); return <-done }
}

func TestMigrationBehindHeldLockGivesUpNamingTheSession(t *testing.T) {
	t.Parallel()
	dbURL := pendingReleases(t)
	readerPID, endReader := holdReader(t, dbURL)
	defer endReader()
	stopWrites := writeLoop(t, dbURL)

	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	opts := migrations.Options{LockTimeout: 300 * time.Millisecond, Attempts: 3, Backoff: 200 * time.Millisecond, MaxBackoff: time.Second}
	// Without the lock timeout the migration would wait for the reader,
	// which never ends: the context bounds the test, not the runner.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := migrations.ApplyWith(ctx, openDB(t, dbURL), logger, opts)
	took := time.Since(start)
	slowest := stopWrites()

	if err == nil {
		t.Fatal("ApplyWith succeeded with webhook_events held by another transaction")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("err = %v, want one wrapping SQLSTATE 55P03 (lock_not_available)", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"00014_releases.sql", "waited 3 times", "webhook_events",
		fmt.Sprintf("pid %d", readerPID), `application_name "nightly-report"`,
		`state "idle in transaction"`, "transaction open", "SELECT count(*) FROM webhook_events",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not say %q:\n%s", want, msg)
		}
	}
	if got := strings.Count(logs.String(), "trying again"); got != 2 {
		t.Errorf("%d retry warnings logged, want 2 (3 attempts):\n%s", got, logs.String())
	}
	// Three waits of 300 ms and pauses of 200 and 400 ms.
	if took < 1500*time.Millisecond {
		t.Errorf("ApplyWith gave up after %s, before three attempts could wait their lock timeout", took)
	}
	// A write queued behind the waiting ALTER TABLE waits at most the lock
	// timeout, plus a machine's scheduling noise.
	if slowest > opts.LockTimeout+700*time.Millisecond {
		t.Errorf("slowest write during the migration took %s, want at most about the lock timeout %s", slowest, opts.LockTimeout)
	}
	t.Logf("gave up after %s; slowest write meanwhile %s; the error:\n%v", took, slowest, err)

	var version int64
	if err := openDB(t, dbURL).QueryRow(`SELECT max(version_id) FROM goose_db_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != 13 {
		t.Errorf("schema version %d after the failed migration, want 13", version)
	}
}

// patient waits 300 ms for a lock, up to 10 times: long enough for the
// tests' held locks (1 to 1.5 s) to end between tries.
var patient = migrations.Options{LockTimeout: 300 * time.Millisecond, Attempts: 10, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond}

// applyPatiently applies the pending migrations with patient, and returns
// what ApplyWith did and logged.
func applyPatiently(t *testing.T, dbURL string) ([]string, *bytes.Buffer, error) {
	t.Helper()
	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	applied, err := migrations.ApplyWith(ctx, openDB(t, dbURL), slog.New(slog.NewJSONHandler(&logs, nil)), patient)
	return applied, &logs, err
}

func TestMigrationRetriesUntilTheLockIsFree(t *testing.T) {
	t.Parallel()
	dbURL := pendingReleases(t)
	_, endReader := holdReader(t, dbURL)
	later(t, time.Second, endReader)
	stopWrites := writeLoop(t, dbURL)

	applied, logs, err := applyPatiently(t, dbURL)
	slowest := stopWrites()
	if err != nil {
		t.Fatalf("ApplyWith: %v", err)
	}
	if len(applied) == 0 || applied[0] != "00014_releases.sql" {
		t.Errorf("applied %v, want 00014_releases.sql first", applied)
	}
	if !strings.Contains(logs.String(), `"blocked_by":"blocked on webhook_events by pid`) {
		t.Errorf("no retry warning naming the blocking session:\n%s", logs.String())
	}
	if slowest > patient.LockTimeout+700*time.Millisecond {
		t.Errorf("slowest write during the migration took %s, want at most about the lock timeout %s", slowest, patient.LockTimeout)
	}
	if err := migrations.Verify(t.Context(), openDB(t, dbURL)); err != nil {
		t.Errorf("Verify after the migration: %v", err)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	want := migrations.Version()
	if want < 14 {
		t.Fatalf("Version() = %d, want the highest migration, 14 or more", want)
	}
	tests := []struct {
		name    string
		setup   []string
		wantErr []string // substrings; none: Verify passes
	}{
		{name: "migrated"},
		{
			// The highest migration's record gone, as before it ran: the
			// schema is at the one below it (13 while 14 is the highest).
			name:    "older schema",
			setup:   []string{fmt.Sprintf(`DELETE FROM goose_db_version WHERE version_id >= %d`, want)},
			wantErr: []string{"this build needs " + fmt.Sprint(want), "munchable-webhooks migrate"},
		},
		{
			name:    "contracted past this build",
			setup:   []string{fmt.Sprintf(`INSERT INTO schema_contracts VALUES (%d, %d, 'column x')`, want+2, want+1)},
			wantErr: []string{"removed column x", fmt.Sprintf("this build expects %d", want), fmt.Sprintf("expecting %d or later", want+1)},
		},
		{
			name:  "contracted, this build new enough",
			setup: []string{fmt.Sprintf(`INSERT INTO schema_contracts VALUES (%d, %d, 'column x')`, want+2, want)},
		},
		{
			name:    "never migrated",
			setup:   []string{`DROP TABLE goose_db_version`, `DROP TABLE schema_contracts`},
			wantErr: []string{fmt.Sprintf("schema is version 0, this build needs %d", want)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := openDB(t, dbtest.NewDatabase(t))
			for _, stmt := range tt.setup {
				if _, err := db.Exec(stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			err := migrations.Verify(t.Context(), db)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				return
			}
			if !errors.Is(err, migrations.ErrSchema) {
				t.Fatalf("Verify = %v, want ErrSchema", err)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q: %v", s, err)
				}
			}
		})
	}
}

// An index built CONCURRENTLY waits for every transaction older than it,
// and that wait is a lock wait: lock_timeout ends it, the build leaves an
// invalid index, and the next try drops it and builds it again, until the
// old transaction is gone (IF NOT EXISTS would keep the invalid one for
// good). Deliveries write on meanwhile.
func TestConcurrentIndexBuildRetriesPastAnOldTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		before    int64 // the version the database is at
		migration string
		index     string
		table     string // a table the old transaction reads
	}{
		{10, "00011_access_at_scale.sql", "checkout_sessions_subscription", "entitlements"},
		{15, "00016_access_expiry.sql", "entitlements_access_ends", "entitlements"},
	} {
		t.Run(tc.migration, func(t *testing.T) {
			t.Parallel()
			dbURL := databaseAt(t, tc.before)
			// pg_dump's kind of transaction: one snapshot for its whole
			// life, which is what a CONCURRENTLY build waits for (a READ
			// COMMITTED transaction between statements holds none).
			conn := connect(t, dbURL, "pg_dump")
			tx, err := conn.BeginTx(t.Context(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(t.Context(), `SELECT count(*) FROM `+tc.table); err != nil {
				t.Fatal(err)
			}
			later(t, 1500*time.Millisecond, func() { _ = tx.Rollback(context.Background()) })

			applied, logs, err := applyPatiently(t, dbURL)
			if err != nil {
				t.Fatalf("ApplyWith: %v\n%s", err, logs.String())
			}
			if len(applied) == 0 || applied[0] != tc.migration {
				t.Errorf("applied %v, want %s first", applied, tc.migration)
			}
			if !strings.Contains(logs.String(), `"migration":"`+tc.migration+`"`) ||
				!strings.Contains(logs.String(), `blocked on the end of its transaction (virtualxid lock) by pid`) {
				t.Errorf("%s's build never waited out its lock timeout:\n%s", tc.migration, logs.String())
			}
			var valid bool
			err = openDB(t, dbURL).QueryRow(`SELECT i.indisvalid FROM pg_index i
				WHERE i.indexrelid = $1::regclass`, tc.index).Scan(&valid)
			if err != nil || !valid {
				t.Errorf("%s valid = %v (%v), want a valid index", tc.index, valid, err)
			}
		})
	}
}

// A migration is tried again after a lock wait that ended without the
// lock: a lock timeout, or a deadlock Postgres settled against it (its
// transaction rolled back either way); any other error ends the call.
func TestRetriedErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code string
		want bool
	}{
		{"55P03", true}, // lock_not_available
		{"40P01", true}, // deadlock_detected
		{"23505", false},
		{"42P01", false},
	} {
		err := fmt.Errorf("00020_changes_traceparent.sql: %w", &pgconn.PgError{Code: tc.code})
		if got := migrations.WaitedForLock(err); got != tc.want {
			t.Errorf("WaitedForLock(SQLSTATE %s) = %v, want %v", tc.code, got, tc.want)
		}
	}
	if migrations.WaitedForLock(errors.New("connection refused")) {
		t.Error("WaitedForLock(a non-Postgres error) = true, want false")
	}
}

// Options.Attempts is one budget for the whole call, not one per
// migration: with several migrations pending, each blocked in turn, the
// call still gives up after Attempts tries in all, so its worst case fits
// a pod's start and a Job's deadline however many migrations a release
// brings.
func TestMigrationAttemptsAreOneBudgetForTheCall(t *testing.T) {
	t.Parallel()
	dbURL := databaseAt(t, 19) // 00020 alters changes, 00021 webhook_events
	_, endChanges := holdTable(t, dbURL, "changes")
	time.AfterFunc(time.Second, endChanges)
	_, endEvents := holdTable(t, dbURL, "webhook_events") // held to the end
	defer endEvents()

	var logs bytes.Buffer
	opts := migrations.Options{LockTimeout: 300 * time.Millisecond, Attempts: 6, Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	applied, err := migrations.ApplyWith(ctx, openDB(t, dbURL), slog.New(slog.NewJSONHandler(&logs, nil)), opts)

	if want := []string{"00020_changes_traceparent.sql"}; fmt.Sprint(applied) != fmt.Sprint(want) {
		t.Errorf("applied %v, want %v", applied, want)
	}
	if err == nil || !strings.Contains(err.Error(), "00021_webhook_events_trace_id.sql") ||
		!strings.Contains(err.Error(), "waited 6 times") {
		t.Fatalf("err = %v, want 00021 given up on after 6 waits in all", err)
	}
	first := strings.Count(logs.String(), `"migration":"00020_changes_traceparent.sql"`)
	if first == 0 {
		t.Fatalf("00020 never waited for the reader of changes:\n%s", logs.String())
	}
	if got := strings.Count(logs.String(), "trying again"); got != opts.Attempts-1 {
		t.Errorf("%d retry warnings logged (%d of them 00020's), want %d: the call's budget, not each migration's:\n%s",
			got, first, opts.Attempts-1, logs.String())
	}
}
