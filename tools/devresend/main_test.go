package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
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

// Data that would make the stand-in lie is refused at startup.
func TestLoadMailsRefusesWrongSizes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mail := filepath.Join(dir, "e1")
	if err := os.MkdirAll(filepath.Join(mail, "attachments"), 0o755); err != nil {
		t.Fatal(err)
	}
	email := `{"object":"email","id":"e1","attachments":[{"id":"a1","filename":"a.txt","content_type":"text/plain","size":3}]}`
	if err := os.WriteFile(filepath.Join(mail, "email.json"), []byte(email), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mail, "attachments", "a.txt"), []byte("four"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadMails(dir); err == nil || !strings.Contains(err.Error(), "size 3") {
		t.Errorf("loadMails = %v, want the size mismatch", err)
	}
}

// With a command, devresend hands it RESEND_API_URL and exits with its
// status; with RESEND_API_URL set, it leaves it alone.
func TestRunsTheCommand(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	script := `case "$RESEND_API_URL" in http://127.0.0.1:*) exit 7;; esac; exit 1`
	code, err := run([]string{"-data", dataDir, "--", "sh", "-c", script}, []string{"PATH=" + os.Getenv("PATH")}, io.Discard, &stderr)
	if err != nil || code != 7 {
		t.Errorf("run = %d, %v, want 7 (the command saw the stand-in's URL)\n%s", code, err, &stderr)
	}
	code, err = run([]string{"-data", dataDir, "--", "sh", "-c", `test "$RESEND_API_URL" = https://api.resend.com`},
		[]string{"PATH=" + os.Getenv("PATH"), "RESEND_API_URL=https://api.resend.com"}, io.Discard, &stderr)
	if err != nil || code != 0 {
		t.Errorf("run with RESEND_API_URL set = %d, %v, want 0 (left as set)\n%s", code, err, &stderr)
	}
}
