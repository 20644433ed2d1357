package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

func TestSupportCommandLine(t *testing.T) {
	t.Parallel()
	env := nowhere(t)
	for _, args := range [][]string{
		{"support", "-h"}, {"support", "--help"}, {"support", "help"}, {"support", "list", "-h"},
		{"support", "show", "--help"}, {"support", "show", "7", "--attachment", "a.pdf", "-h"},
	} {
		if err := wantUsage(t, env, args, "stdout"); err != nil {
			t.Errorf("%q: err = %v, want nil (help acted?)", args, err)
		}
	}
	for _, args := range [][]string{
		{"support"}, {"support", "purge"}, {"support", "list", "--bogus"}, {"support", "list", "extra"},
		{"support", "list", "--state", "lost"}, {"support", "list", "--source", "fax"}, {"support", "list", "--since", "-1h"},
		{"support", "show"}, {"support", "show", "abc"}, {"support", "show", "0"}, {"support", "show", "7", "--html", "--attachment", "a"},
	} {
		if err := wantUsage(t, env, args, "stderr"); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

// TestSupportListAndShow reads a queued mail, with DATABASE_URL alone, as
// whoever looks after support would when forwarding is off.
func TestSupportListAndShow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	content := []byte("%PDF-1.7 receipt")
	id, _, err := support.NewQueue(pool).EnqueueWith(ctx, support.Message{
		Source: support.SourceEmail, ExternalID: "em_1", FromAddress: "ada@example.com", FromName: "Ada Lovelace",
		ToAddress: "support@munchable.app", Subject: "My order", MessageID: "<abc@mail.example.com>",
		TextBody: "Where is my order?\n\x1b[2Jstill waiting", HTMLBody: "<p>Where is my order?</p>",
		ReceivedAt: time.Date(2026, 2, 22, 23, 41, 11, 0, time.UTC), AuthDMARC: "fail", SenderAuthenticated: new(false),
	}, func(ctx context.Context, w *support.Attachments) error {
		return w.Add(ctx, support.Attachment{ExternalID: "att_1", Filename: "receipt.pdf", ContentType: "application/pdf",
			Size: int64(len(content))}, bytes.NewReader(content))
	})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": dbURL} // nothing else

	out, stderr, err := runCmd(t, env, "support", "list")
	var listed struct {
		ID      int64
		From    string
		Subject string
		Thread  int64
		Forward struct{ State string }
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || stderr != "1 support messages\n" {
		t.Fatalf("support list = %q, stderr %q, %v", out, stderr, err)
	}
	if listed.ID != id || listed.From != "Ada Lovelace <ada@example.com>" || listed.Subject != "My order" ||
		listed.Thread != id || listed.Forward.State != "off" || !strings.Contains(out, `"from":"Ada Lovelace <ada@example.com>"`) {
		t.Errorf("support list = %s; want message %d from Ada, forward off, unescaped", out, id)
	}
	if out, stderr, err := runCmd(t, env, "support", "list", "--source", "web"); err != nil || out != "" || stderr != "0 support messages\n" {
		t.Errorf("support list --source web = %q, stderr %q, %v; want nothing and the count", out, stderr, err)
	}

	sid := strconv.FormatInt(id, 10)
	out, _, err = runCmd(t, env, "support", "show", sid)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"From:           Ada Lovelace <ada@example.com>\n", "Subject:        My order\n",
		"Message-ID:     <abc@mail.example.com>\n", "DMARC fail", "may be forged",
		"Forward:        off (change ", "receipt.pdf  application/pdf  16 bytes\n",
		"HTML body:      25 bytes (support show " + sid + " --html)\n", "\nWhere is my order?\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("support show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("support show printed the body's ESC to the terminal:\n%q", out)
	}
	if out, _, err := runCmd(t, env, "support", "show", sid, "--html"); err != nil || out != "<p>Where is my order?</p>" {
		t.Errorf("--html = %q, %v", out, err)
	}
	if out, _, err := runCmd(t, env, "support", "show", sid, "--attachment", "receipt.pdf"); err != nil || out != string(content) {
		t.Errorf("--attachment receipt.pdf = %q, %v", out, err)
	}
	if _, _, err := runCmd(t, env, "support", "show", sid, "--attachment", "other.pdf"); !errors.Is(err, support.ErrNoAttachment) {
		t.Errorf("--attachment other.pdf: %v, want ErrNoAttachment", err)
	}
	if _, _, err := runCmd(t, env, "support", "show", "999"); !errors.Is(err, support.ErrNotFound) || errors.Is(err, errUsage) {
		t.Errorf("show 999: %v, want not found (exit 1)", err)
	}
}
