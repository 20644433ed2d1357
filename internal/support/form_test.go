package support_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// newForm is the form's POST handler on a fresh database, with a rate
// limit no test here reaches.
func newForm(t *testing.T) (http.Handler, *pgxpool.Pool) {
	t.Helper()
	pool := dbtest.NewPool(t)
	f := support.NewForm(support.NewQueue(pool), support.FormConfig{Rate: 1000, DatabaseMaxConns: 4, Logger: slog.New(slog.DiscardHandler)})
	return f.Submit(), pool
}

// post sends body with contentType and the given extra headers.
func post(t *testing.T, h http.Handler, contentType, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/support/messages", strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func postJSON(t *testing.T, h http.Handler, fields map[string]any, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return post(t, h, "application/json", string(b), header...)
}

// decodeJSON decodes a JSON answer, failing the test on anything else.
func decodeJSON[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("answer %q is not the expected JSON: %v", w.Body.String(), err)
	}
	return v
}

func TestFormAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		contentType string
		body        string
	}{
		{"json", "application/json; charset=utf-8",
			`{"email":"ada@example.com","name":" Ada Lovelace ","subject":"Order 42","message":"Where is\r\nmy order? ☕"}`},
		{"urlencoded", "application/x-www-form-urlencoded", url.Values{
			"email": {"ada@example.com"}, "name": {" Ada Lovelace "}, "subject": {"Order 42"},
			"message": {"Where is\r\nmy order? ☕"},
		}.Encode()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, pool := newForm(t)
			w := post(t, h, tc.contentType, tc.body)
			if w.Code != http.StatusAccepted {
				t.Fatalf("status = %d %s, want 202", w.Code, w.Body)
			}
			got := decodeJSON[map[string]int64](t, w)
			rs := rows(t, pool)
			if len(rs) != 1 {
				t.Fatalf("rows = %d, want 1", len(rs))
			}
			if diff := cmp.Diff(map[string]int64{"id": rs[0].ID}, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
			r := rs[0]
			if !strings.HasPrefix(r.ExternalID, "form:") || len(r.ExternalID) != len("form:")+32 {
				t.Errorf("external_id = %q, want form: and 128 bits of hex", r.ExternalID)
			}
			if time.Since(r.ReceivedAt) > time.Minute {
				t.Errorf("received_at = %v, want about now", r.ReceivedAt)
			}
			r.ID, r.ExternalID, r.ReceivedAt = 0, "", time.Time{}
			want := row{
				Source: "web", FromAddress: "ada@example.com", FromName: ptr("Ada Lovelace"),
				Subject: ptr("Order 42"), TextBody: ptr("Where is\r\nmy order? ☕"),
			}
			if diff := cmp.Diff(want, r); diff != "" {
				t.Errorf("row (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFormValidation(t *testing.T) {
	t.Parallel()
	h, pool := newForm(t)
	valid := func(change func(map[string]any)) map[string]any {
		f := map[string]any{"email": "ada@example.com", "name": "Ada", "subject": "Hi", "message": "Help"}
		change(f)
		return f
	}
	tests := []struct {
		name   string
		fields map[string]any
		header []string
		want   map[string]string
	}{
		{"email missing", valid(func(f map[string]any) { delete(f, "email") }), nil,
			map[string]string{"email": "is required"}},
		{"email blank", valid(func(f map[string]any) { f["email"] = "   " }), nil,
			map[string]string{"email": "is required"}},
		{"email invalid", valid(func(f map[string]any) { f["email"] = "ada at example.com" }), nil,
			map[string]string{"email": "must be a plain email address, such as name@example.com"}},
		{"email with display name", valid(func(f map[string]any) { f["email"] = "Ada <ada@example.com>" }), nil,
			map[string]string{"email": "must be a plain email address, such as name@example.com"}},
		{"email with several addresses", valid(func(f map[string]any) { f["email"] = "ada@example.com, bob@example.com" }), nil,
			map[string]string{"email": "must be a plain email address, such as name@example.com"}},
		{"email with a header injected", valid(func(f map[string]any) { f["email"] = "ada@example.com\r\nBcc: all@example.com" }), nil,
			map[string]string{"email": "must not contain line breaks"}},
		{"email not a string", valid(func(f map[string]any) { f["email"] = 42 }), nil,
			map[string]string{"email": "must be a string"}},
		{"message missing", valid(func(f map[string]any) { delete(f, "message") }), nil,
			map[string]string{"message": "is required"}},
		{"message only white space", valid(func(f map[string]any) { f["message"] = " \n\t " }), nil,
			map[string]string{"message": "is required"}},
		{"message over 20000 characters", valid(func(f map[string]any) { f["message"] = strings.Repeat("é", 20001) }), nil,
			map[string]string{"message": "must be at most 20000 characters"}},
		{"subject over 300 characters", valid(func(f map[string]any) { f["subject"] = strings.Repeat("s", 301) }), nil,
			map[string]string{"subject": "must be at most 300 characters"}},
		{"subject with LF", valid(func(f map[string]any) { f["subject"] = "Hi\nBcc: x@example.com" }), nil,
			map[string]string{"subject": "must not contain line breaks"}},
		{"name over 200 characters", valid(func(f map[string]any) { f["name"] = strings.Repeat("n", 201) }), nil,
			map[string]string{"name": "must be at most 200 characters"}},
		{"name with CR", valid(func(f map[string]any) { f["name"] = "Ada\rLovelace" }), nil,
			map[string]string{"name": "must not contain line breaks"}},
		{"NUL in message", valid(func(f map[string]any) { f["message"] = "a\x00b" }), nil,
			map[string]string{"message": "must not contain NUL characters"}},
		{"idempotency key empty", valid(func(map[string]any) {}), []string{"Idempotency-Key", ""},
			map[string]string{"Idempotency-Key": "must be 1 to 255 printable ASCII characters"}},
		{"idempotency key too long", valid(func(map[string]any) {}), []string{"Idempotency-Key", strings.Repeat("k", 256)},
			map[string]string{"Idempotency-Key": "must be 1 to 255 printable ASCII characters"}},
		{"idempotency key not ASCII", valid(func(map[string]any) {}), []string{"Idempotency-Key", "clé"},
			map[string]string{"Idempotency-Key": "must be 1 to 255 printable ASCII characters"}},
		{"several problems at once", map[string]any{"email": "nope", "subject": strings.Repeat("s", 301)}, nil,
			map[string]string{
				"email":   "must be a plain email address, such as name@example.com",
				"subject": "must be at most 300 characters",
				"message": "is required",
			}},
	}
	// The group returns only when every parallel case has finished, so the
	// row count after it sees them all.
	t.Run("group", func(t *testing.T) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				w := postJSON(t, h, tc.fields, tc.header...)
				if w.Code != http.StatusUnprocessableEntity {
					t.Fatalf("status = %d %s, want 422", w.Code, w.Body)
				}
				got := decodeJSON[map[string]map[string]string](t, w)
				if diff := cmp.Diff(map[string]map[string]string{"errors": tc.want}, got); diff != "" {
					t.Errorf("answer (-want +got):\n%s", diff)
				}
			})
		}
	})
	if n := len(rows(t, pool)); n != 0 {
		t.Errorf("rows = %d after only invalid posts, want 0", n)
	}
}

// TestFormInvalidUTF8 sends bytes that are not UTF-8, which JSON decoding
// would otherwise quietly turn into U+FFFD.
func TestFormInvalidUTF8(t *testing.T) {
	t.Parallel()
	h, pool := newForm(t)
	tests := []struct {
		name, contentType, body string
	}{
		{"json", "application/json", "{\"email\":\"ada@example.com\",\"message\":\"caf\xe9\"}"},
		{"urlencoded", "application/x-www-form-urlencoded", "email=ada%40example.com&message=caf%E9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := post(t, h, tc.contentType, tc.body)
			if w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("status = %d %s, want 422", w.Code, w.Body)
			}
			got := decodeJSON[map[string]map[string]string](t, w)
			want := map[string]map[string]string{"errors": {"message": "must be valid UTF-8"}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
	if n := len(rows(t, pool)); n != 0 {
		t.Errorf("rows = %d, want 0", n)
	}
}

func TestFormRefuses(t *testing.T) {
	t.Parallel()
	h, pool := newForm(t)
	huge := `{"email":"ada@example.com","message":"` + strings.Repeat("x", 256<<10) + `"}`
	tests := []struct {
		name, contentType, body string
		wantStatus              int
	}{
		{"no content type", "", `{"email":"ada@example.com","message":"hi"}`, http.StatusUnsupportedMediaType},
		{"text/plain", "text/plain", "hello", http.StatusUnsupportedMediaType},
		{"multipart", "multipart/form-data; boundary=x", "--x--", http.StatusUnsupportedMediaType},
		{"malformed JSON", "application/json", `{"email":`, http.StatusBadRequest},
		{"JSON array", "application/json", `[]`, http.StatusBadRequest},
		{"trailing JSON", "application/json", `{"email":"ada@example.com","message":"hi"} {}`, http.StatusBadRequest},
		{"malformed form", "application/x-www-form-urlencoded", "email=%zz", http.StatusBadRequest},
		{"body over 256 KiB", "application/json", huge, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := post(t, h, tc.contentType, tc.body)
			if w.Code != tc.wantStatus {
				t.Fatalf("status = %d %s, want %d", w.Code, w.Body, tc.wantStatus)
			}
			got := decodeJSON[map[string]string](t, w)
			if got["error"] == "" {
				t.Errorf("answer %s has no error message", w.Body)
			}
		})
	}
	if n := len(rows(t, pool)); n != 0 {
		t.Errorf("rows = %d, want 0", n)
	}
}

func TestFormIdempotencyKey(t *testing.T) {
	t.Parallel()
	h, pool := newForm(t)
	msg := map[string]any{"email": "ada@example.com", "name": "Ada", "message": "Where is my order?"}

	first := postJSON(t, h, msg, "Idempotency-Key", "2f1c7a52-form-retry")
	again := postJSON(t, h, msg, "Idempotency-Key", "2f1c7a52-form-retry")
	for _, w := range []*httptest.ResponseRecorder{first, again} {
		if w.Code != http.StatusAccepted {
			t.Fatalf("status = %d %s, want 202", w.Code, w.Body)
		}
	}
	id1 := decodeJSON[map[string]int64](t, first)["id"]
	id2 := decodeJSON[map[string]int64](t, again)["id"]
	if id1 != id2 {
		t.Errorf("repeat answered id %d, want the first post's %d", id2, id1)
	}
	rs := rows(t, pool)
	if len(rs) != 1 || rs[0].ExternalID != "key:2f1c7a52-form-retry" {
		t.Fatalf("rows = %+v, want one with external_id key:2f1c7a52-form-retry", rs)
	}

	// The key reused for another message is refused, not swallowed.
	other := map[string]any{"email": "ada@example.com", "name": "Ada", "message": "Something else entirely"}
	w := postJSON(t, h, other, "Idempotency-Key", "2f1c7a52-form-retry")
	if w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("reused key with another message: status = %d %s, want 422", w.Code, w.Body)
	}
	got := decodeJSON[map[string]map[string]string](t, w)
	if got["errors"]["Idempotency-Key"] == "" {
		t.Errorf("answer %s names no Idempotency-Key problem", w.Body)
	}

	// Without a key, each post is its own message.
	for range 2 {
		if w := postJSON(t, h, msg); w.Code != http.StatusAccepted {
			t.Fatalf("post without key: status = %d %s, want 202", w.Code, w.Body)
		}
	}
	if n := len(rows(t, pool)); n != 3 {
		t.Errorf("rows = %d, want 3 (one keyed, two unkeyed)", n)
	}
}
