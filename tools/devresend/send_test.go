package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a bytes.Buffer the handler may write from its goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func post(t *testing.T, url, auth, idemKey, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/emails", strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// POST /emails prints what it would send, once per Idempotency-Key.
func TestSendEmail(t *testing.T) {
	t.Parallel()
	var log syncBuffer
	srv := httptest.NewServer(newAPI(nil, key, &log))
	t.Cleanup(srv.Close)
	body := `{"from":"Munchable Support <support-forward@munchable.app>","to":["team@munchable.app"],
"reply_to":"jane@example.com","subject":"Where is my order?","text":"From: jane@example.com\n\nMy order never came.",
"headers":{"Message-ID":"<support-message-1@munchable.app>"},
"attachments":[{"filename":"receipt.png","content":"iVBORw0KGgo=","content_type":"image/png"}]}`

	status, first := post(t, srv.URL, key, "support-message/1", body)
	if status != 200 || first["id"] == "" {
		t.Fatalf("send: %d %v", status, first)
	}
	status, again := post(t, srv.URL, key, "support-message/1", body)
	if status != 200 || again["id"] != first["id"] {
		t.Errorf("the same key again: %d %v, want 200 and the first id %v", status, again, first["id"])
	}
	printed := log.String()
	for _, want := range []string{"would have sent", "To:       team@munchable.app", "Reply-To: jane@example.com",
		"Subject:  Where is my order?", "Attached: receipt.png (image/png, 8 bytes)", "| My order never came.", "not sent twice"} {
		if !strings.Contains(printed, want) {
			t.Errorf("printed output lacks %q:\n%s", want, printed)
		}
	}
	if n := strings.Count(printed, "would have sent"); n != 1 {
		t.Errorf("printed %d emails, want 1", n)
	}
	for _, tt := range []struct {
		name, auth, key, body string
		status                int
		errName               string
	}{
		{"another body, same key", key, "support-message/1", strings.Replace(body, "order", "parcel", 1), 409, "invalid_idempotent_request"},
		{"no key", "", "support-message/2", body, 401, "missing_api_key"},
		{"no subject", key, "support-message/3", `{"from":"a@b.c","to":"t@b.c","text":"x"}`, 422, "validation_error"},
	} {
		status, got := post(t, srv.URL, tt.auth, tt.key, tt.body)
		if status != tt.status || got["name"] != tt.errName {
			t.Errorf("%s: %d %v, want %d %s", tt.name, status, got, tt.status, tt.errName)
		}
	}
}
