package main

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/support"
	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// The service's own Resend sweep (resendhook's SweepPass, through its
// resend-go client) reads the stand-in's list, as `SWEEP_INTERVAL=30s make
// dev` has it do: over two pages of 100, after the last id, it queues every
// mail of the window (the sample with its attachment, fetched and
// downloaded from the stand-in) and stops at the first older one; a second
// pass finds them all queued. Needs Postgres and Redis (internal/dbtest).
func TestSweepReadsTheList(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	rdb, prefix := dbtest.Redis(t)

	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, emailID), os.DirFS(filepath.Join(dataDir, emailID))); err != nil {
		t.Fatal(err)
	}
	sampleCreated := time.Date(2026, 2, 22, 23, 41, 11, 894719000, time.UTC) // the sample's created_at
	const newer = 150
	for i := range newer {
		writeMail(t, dir, fmt.Sprintf("00000000-0000-4000-8000-%012d", i), sampleCreated.Add(time.Duration(i+1)*time.Second).Format(time.RFC3339Nano))
	}
	writeMail(t, dir, "00000000-0000-4000-8000-999999999999", sampleCreated.Add(-2*time.Hour).Format(time.RFC3339Nano))
	srv := newServer(t, dir)

	apiURL, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	inbound, bad := resendhook.ParseInbound([]string{"support@munchable.app"})
	if len(bad) != 0 {
		t.Fatalf("inbound addresses %q refused", bad)
	}
	logger := slog.New(slog.NewJSONHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	receiver := resendhook.New(resendhook.Config{
		Queue:              support.NewQueue(pool),
		APIKey:             key,
		APIURL:             apiURL,
		Inbound:            inbound,
		AttachmentMaxBytes: 1 << 20,
		// The stand-in's download URLs are on loopback, over http.
		DownloadAllowPrivate: true,
		Logger:               logger,
	})
	store := claim.NewStore(rdb, claim.StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: time.Minute})
	ep := claim.NewFlow(store, claim.FlowConfig{HandlerTimeout: 10 * time.Second, Logger: logger}).
		Endpoint(claim.Provider{Name: "resend", DedupeTTL: time.Hour})
	pass := receiver.SweepPass(ep, 0)
	from := sampleCreated.Add(-time.Hour)

	n, err := pass(t.Context(), from)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if want := (sweep.Counts{Listed: newer + 1, Recovered: newer + 1}); n != want {
		t.Errorf("sweep = %+v, want %+v", n, want)
	}
	var queued int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM support_messages").Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued != newer+1 {
		t.Errorf("%d messages queued, want %d", queued, newer+1)
	}
	var filename string
	var size int
	const q = `SELECT a.filename, length(a.content) FROM support_attachments a
		JOIN support_messages m ON m.id = a.support_message_id WHERE m.external_id = $1`
	if err := pool.QueryRow(t.Context(), q, emailID).Scan(&filename, &size); err != nil || filename != "receipt.png" || size != 124 {
		t.Errorf("the sample's attachment: %q, %d bytes (%v), want receipt.png, 124", filename, size, err)
	}

	n, err = pass(t.Context(), from)
	if err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if want := (sweep.Counts{Listed: newer + 1, Delivered: newer + 1}); n != want {
		t.Errorf("second sweep = %+v, want %+v", n, want)
	}
}
