package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	dataDir = "../../testdata/devresend"
	emailID = "4ef9a417-02e9-4d39-ad75-9611e0fcc33c"
	key     = "re_test_devresend"
)

func get(t *testing.T, url, auth string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// The stand-in answers the three calls the service makes for the sample
// mail, and Resend's errors otherwise.
func TestAPI(t *testing.T) {
	t.Parallel()
	mails, err := loadMails(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newAPI(mails, key, io.Discard))
	t.Cleanup(srv.Close)

	status, body := get(t, srv.URL+"/emails/receiving/"+emailID+"?html_format=cid", key)
	want, _ := os.ReadFile(filepath.Join(dataDir, emailID, "email.json"))
	if status != 200 || !bytes.Equal(body, want) {
		t.Errorf("email: %d %.80s, want 200 and email.json", status, body)
	}

	status, body = get(t, srv.URL+"/emails/receiving/"+emailID+"/attachments", key)
	var list struct {
		Object  string `json:"object"`
		HasMore bool   `json:"has_more"`
		Data    []struct {
			Filename    string `json:"filename"`
			Size        int64  `json:"size"`
			DownloadURL string `json:"download_url"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || status != 200 {
		t.Fatalf("attachments: %d %s (%v)", status, body, err)
	}
	if list.Object != "list" || list.HasMore || len(list.Data) != 1 || list.Data[0].Filename != "receipt.png" {
		t.Fatalf("attachments = %+v, want receipt.png listed", list)
	}
	dl := list.Data[0].DownloadURL
	if !strings.HasPrefix(dl, srv.URL+"/") {
		t.Fatalf("download_url %q does not point at the stand-in %s", dl, srv.URL)
	}

	content, _ := os.ReadFile(filepath.Join(dataDir, emailID, "attachments", "receipt.png"))
	if list.Data[0].Size != int64(len(content)) {
		t.Errorf("listed size %d, the file's %d", list.Data[0].Size, len(content))
	}
	if status, body := get(t, dl, ""); status != 200 || !bytes.Equal(body, content) {
		t.Errorf("download: %d, %d bytes; want 200 and receipt.png's %d", status, len(body), len(content))
	}
	if status, _ := get(t, dl, key); status != http.StatusBadRequest {
		t.Errorf("download with the API key: %d, want 400", status)
	}
	if status, _ := get(t, strings.Split(dl, "?")[0], ""); status != http.StatusForbidden {
		t.Errorf("download without the signature: %d, want 403", status)
	}

	for _, tt := range []struct {
		path, auth string
		status     int
		name       string
	}{
		{"/emails/receiving/" + emailID, "", 401, "missing_api_key"},
		{"/emails/receiving/" + emailID, "re_other", 403, "invalid_api_key"},
		{"/emails/receiving/nope", key, 404, "not_found"},
		{"/emails/receiving/nope/attachments", key, 404, "not_found"},
		{"/emails/receiving?limit=10", "", 401, "missing_api_key"},
		{"/emails/receiving", "re_other", 403, "invalid_api_key"},
		{"/emails", key, 404, "not_found"},
	} {
		status, body := get(t, srv.URL+tt.path, tt.auth)
		var e struct {
			StatusCode int    `json:"statusCode"`
			Name       string `json:"name"`
			Message    string `json:"message"`
		}
		if err := json.Unmarshal(body, &e); err != nil || status != tt.status || e.StatusCode != tt.status || e.Name != tt.name || e.Message == "" {
			t.Errorf("GET %s: %d %s, want %d with Resend's error %s", tt.path, status, body, tt.status, tt.name)
		}
	}
}

// Data that would make the stand-in lie is refused at startup: a size
// that is not the file's, a created_at the list cannot be ordered by.
func TestLoadMailsRefuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		created string
		size    int
		want    string
	}{
		{"2026-02-22T23:41:11.894719+00:00", 3, "size 3"},
		{"yesterday", 4, `created_at "yesterday"`},
	} {
		dir := t.TempDir()
		mail := filepath.Join(dir, "e1")
		if err := os.MkdirAll(filepath.Join(mail, "attachments"), 0o755); err != nil {
			t.Fatal(err)
		}
		email := fmt.Sprintf(`{"object":"email","id":"e1","created_at":%q,"attachments":[{"id":"a1","filename":"a.txt","content_type":"text/plain","size":%d}]}`, tt.created, tt.size)
		if err := os.WriteFile(filepath.Join(mail, "email.json"), []byte(email), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mail, "attachments", "a.txt"), []byte("four"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadMails(dir); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("loadMails = %v, want an error naming %s", err, tt.want)
		}
	}
}

// With a command, devresend hands it RESEND_API_URL and exits with its
// status; with RESEND_API_URL set, it leaves it alone. Either way the env
// file gets the URL the command got, after what was there.
func TestRunsTheCommand(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	envFile := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(envFile, []byte("DATABASE_URL='x'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The command sources the file as a second shell would.
	script := `set -a; . "$1"; set +a; case "$RESEND_API_URL" in http://127.0.0.1:*) exit 7;; esac; exit 1`
	code, err := run([]string{"-data", dataDir, "-env-file", envFile, "--", "sh", "-c", script, "sh", envFile}, []string{"PATH=" + os.Getenv("PATH")}, io.Discard, &stderr)
	if err != nil || code != 7 {
		t.Errorf("run = %d, %v, want 7 (the command saw the stand-in's URL)\n%s", code, err, &stderr)
	}
	if err := os.WriteFile(envFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, err = run([]string{"-data", dataDir, "-env-file", envFile, "--", "sh", "-c", `test "$RESEND_API_URL" = https://api.resend.com`},
		[]string{"PATH=" + os.Getenv("PATH"), "RESEND_API_URL=https://api.resend.com"}, io.Discard, &stderr)
	if err != nil || code != 0 {
		t.Errorf("run with RESEND_API_URL set = %d, %v, want 0 (left as set)\n%s", code, err, &stderr)
	}
	if b, _ := os.ReadFile(envFile); string(b) != "RESEND_API_URL='https://api.resend.com'\n" {
		t.Errorf("env file with RESEND_API_URL set = %q, want that URL", b)
	}
}

// newServer serves the mails under dir.
func newServer(t *testing.T, dir string) *httptest.Server {
	t.Helper()
	mails, err := loadMails(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newAPI(mails, key, io.Discard))
	t.Cleanup(srv.Close)
	return srv
}

// writeMail writes a mail under dir: the sample's email.json with its own
// id, created_at and message_id (the service keeps one message per
// Message-ID), and no attachments.
func writeMail(t testing.TB, dir, id, created string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, emailID, "email.json"))
	if err != nil {
		t.Fatal(err)
	}
	var e map[string]any
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	e["id"], e["created_at"], e["message_id"], e["attachments"] = id, created, "<"+id+"@example.com>", []any{}
	if b, err = json.Marshal(e); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, id), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, id, "email.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The list's entry of the sample mail holds the fields List Received
// Emails documents, each as email.json has it, and nothing else of it (no
// body, headers or download URLs).
func TestListReceivedShape(t *testing.T) {
	t.Parallel()
	srv := newServer(t, dataDir)
	status, body := get(t, srv.URL+"/emails/receiving", key)
	var page struct {
		Object  string                       `json:"object"`
		HasMore *bool                        `json:"has_more"`
		Data    []map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &page); err != nil || status != 200 {
		t.Fatalf("list: %d %s (%v)", status, body, err)
	}
	if page.Object != "list" || page.HasMore == nil || *page.HasMore || len(page.Data) != 1 {
		t.Fatalf("list = %s, want object list, has_more false and the one mail", body)
	}
	raw, _ := os.ReadFile(filepath.Join(dataDir, emailID, "email.json"))
	var email map[string]any
	if err := json.Unmarshal(raw, &email); err != nil {
		t.Fatal(err)
	}
	documented := []string{"attachments", "bcc", "cc", "created_at", "from", "id", "message_id", "reply_to", "subject", "to"}
	entry := page.Data[0]
	if got := slices.Sorted(maps.Keys(entry)); !slices.Equal(got, documented) {
		t.Errorf("entry's fields = %q, want %q", got, documented)
	}
	for _, k := range documented {
		var got any
		if err := json.Unmarshal(entry[k], &got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(email[k], got); diff != "" {
			t.Errorf("entry's %s differs from email.json's (-email.json +listed):\n%s", k, diff)
		}
	}
}

// Mails are listed newest first (of two as old, the greater id first),
// limit at a time; after and before page through them, excluding the
// cursor, and has_more says whether the list goes on in that direction.
func TestListReceivedPages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeMail(t, dir, "e1", "2026-02-22T10:00:00Z")
	writeMail(t, dir, "e2", "2026-02-22T10:01:00.5+00:00")
	writeMail(t, dir, "e3", "2026-02-22T11:01:00.5+01:00") // the same instant as e2
	writeMail(t, dir, "e4", "2026-02-22T10:02:00Z")
	writeMail(t, dir, "e5", "2026-02-22 10:03:00.951732+00") // the list example's form
	srv := newServer(t, dir)

	for _, tt := range []struct {
		query string
		ids   []string
		more  bool
	}{
		{"", []string{"e5", "e4", "e3", "e2", "e1"}, false}, // no limit: all of them
		{"?limit=100", []string{"e5", "e4", "e3", "e2", "e1"}, false},
		{"?limit=5", []string{"e5", "e4", "e3", "e2", "e1"}, false},
		{"?limit=2", []string{"e5", "e4"}, true},
		{"?limit=2&after=e4", []string{"e3", "e2"}, true},
		{"?limit=2&after=e2", []string{"e1"}, false},
		{"?limit=2&after=e1", []string{}, false},
		{"?after=e5", []string{"e4", "e3", "e2", "e1"}, false},
		{"?limit=2&before=e1", []string{"e3", "e2"}, true},
		{"?limit=2&before=e3", []string{"e5", "e4"}, false},
		{"?limit=2&before=e5", []string{}, false},
		{"?limit=1&before=e3", []string{"e4"}, true},
	} {
		status, body := get(t, srv.URL+"/emails/receiving"+tt.query, key)
		var page struct {
			Object  string `json:"object"`
			HasMore bool   `json:"has_more"`
			Data    []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &page); err != nil || status != 200 || page.Object != "list" || page.Data == nil {
			t.Errorf("GET %s: %d %s (%v), want 200 and a list", tt.query, status, body, err)
			continue
		}
		ids := []string{}
		for _, e := range page.Data {
			ids = append(ids, e.ID)
		}
		if !slices.Equal(ids, tt.ids) || page.HasMore != tt.more {
			t.Errorf("GET %s: %q has_more %t, want %q has_more %t", tt.query, ids, page.HasMore, tt.ids, tt.more)
		}
	}
}

// A limit out of 1 to 100, after with before, or a cursor that is not a
// listed id is refused with Resend's error body.
func TestListReceivedRefuses(t *testing.T) {
	t.Parallel()
	srv := newServer(t, dataDir)
	for _, query := range []string{
		"?limit=0", "?limit=101", "?limit=-1", "?limit=ten", "?limit=1.5",
		"?after=" + emailID + "&before=" + emailID,
		"?after=4ef9a417-0000-0000-0000-000000000000",
		"?limit=10&before=nope",
	} {
		status, body := get(t, srv.URL+"/emails/receiving"+query, key)
		var e struct {
			StatusCode int    `json:"statusCode"`
			Name       string `json:"name"`
			Message    string `json:"message"`
		}
		if err := json.Unmarshal(body, &e); err != nil || status != 422 || e.StatusCode != 422 || e.Name != "validation_error" || e.Message == "" {
			t.Errorf("GET %s: %d %s, want 422 with Resend's error validation_error", query, status, body)
		}
	}
}
