package faulttest

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ResendAPI is a fake of the Resend API calls the service makes for
// received email: GET /emails/receiving/{email_id} (with html_format=cid),
// GET /emails/receiving/{email_id}/attachments, and GET /emails/receiving,
// the list the service's sweep reads. It answers the emails added to it,
// with their attachments (none by default), 404 for any other id, and lets
// a test hold, delay or fail a fetch of the email with a hook, or redirect
// it elsewhere. Every email added is listed: it is mail Resend received,
// whether or not a test delivers its webhook. It also takes POST /emails,
// the forwards to the team (resendsend.go).
type ResendAPI struct {
	srv     *httptest.Server
	fetches atomic.Int64
	lists   atomic.Int64

	mu        sync.Mutex
	emails    map[string]Email
	redirects map[string]string
	hook      Hook
	sent      sent // POST /emails (resendsend.go)
	listHook  func(ctx context.Context)
}

// Attachment is one attachment of an Email, as the fake lists it, with the
// download_url it names (anything: the test decides where it points).
type Attachment struct {
	ID, Filename, DownloadURL string
	Size                      int
}

// Hook runs before each fetch is answered, on the request's context (done
// when the service hangs up or dies). It may block; it returns the status to
// fail the fetch with, or 0 to answer it normally.
type Hook func(ctx context.Context, emailID string) int

// NewResendAPI starts the fake on a local port. Close stops it.
func NewResendAPI() *ResendAPI {
	a := &ResendAPI{emails: map[string]Email{}, redirects: map[string]string{}}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

// URL is the value for RESEND_API_URL.
func (a *ResendAPI) URL() string { return a.srv.URL }

// Close stops the server. Hooks must return once their context is done, or
// Close waits for them.
func (a *ResendAPI) Close() { a.srv.Close() }

// Add makes m fetchable.
func (a *ResendAPI) Add(m Email) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.emails[m.EmailID] = m
}

// Redirect makes fetches of emailID answer 307 to url ("" stops it).
func (a *ResendAPI) Redirect(emailID, url string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.redirects[emailID] = url
}

// SetHook installs h (nil: answer every fetch at once).
func (a *ResendAPI) SetHook(h Hook) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook = h
}

// SetListHook installs h, run before each list request is answered, on
// the request's context; it may block (nil: answer at once).
func (a *ResendAPI) SetListHook(h func(ctx context.Context)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.listHook = h
}

// Fetches counts the fetches received so far.
func (a *ResendAPI) Fetches() int64 { return a.fetches.Load() }

// Lists counts the list requests (GET /emails/receiving, a sweep's pages)
// received so far.
func (a *ResendAPI) Lists() int64 { return a.lists.Load() }

func (a *ResendAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == "/emails" {
		a.send(w, r)
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/emails/receiving" {
		if r.Header.Get("Authorization") != "Bearer "+ResendAPIKey {
			http.Error(w, `{"message":"invalid api key"}`, http.StatusUnauthorized)
			return
		}
		a.lists.Add(1)
		a.mu.Lock()
		hook := a.listHook
		a.mu.Unlock()
		if hook != nil {
			hook(r.Context())
		}
		a.listReceived(w, r.URL.Query())
		return
	}
	id, ok := strings.CutPrefix(r.URL.Path, "/emails/receiving/")
	id, list := strings.CutSuffix(id, "/attachments")
	if r.Method != http.MethodGet || !ok || id == "" || strings.Contains(id, "/") {
		http.Error(w, `{"message":"not found"}`, http.StatusNotFound)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+ResendAPIKey {
		http.Error(w, `{"message":"invalid api key"}`, http.StatusUnauthorized)
		return
	}
	a.mu.Lock()
	m, known := a.emails[id]
	hook, atts, redirect := a.hook, m.Attachments, a.redirects[id]
	a.mu.Unlock()
	if list {
		a.listAttachments(w, known, atts)
		return
	}
	a.fetches.Add(1)
	if redirect != "" {
		http.Redirect(w, r, redirect, http.StatusTemporaryRedirect)
		return
	}
	if hook != nil {
		if status := hook(r.Context(), id); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"statusCode":` + strconv.Itoa(status) + `,"message":"injected failure","name":"application_error"}`))
			return
		}
	}
	if !known {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"statusCode":404,"message":"Email not found","name":"not_found"}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = m.WriteAPIJSON(w)
}

// listAttachments answers the attachments of a known email, in the
// shape of List Attachments
// (https://resend.com/docs/api-reference/emails/list-received-email-attachments).
func (a *ResendAPI) listAttachments(w http.ResponseWriter, known bool, atts []Attachment) {
	w.Header().Set("Content-Type", "application/json")
	if !known {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"statusCode":404,"message":"Email not found","name":"not_found"}`))
		return
	}
	data := []map[string]any{}
	for _, at := range atts {
		data = append(data, map[string]any{
			"id": at.ID, "filename": at.Filename, "size": at.Size, "content_type": "application/octet-stream",
			"content_disposition": "attachment", "content_id": nil, "download_url": at.DownloadURL,
			"expires_at": "2030-01-01T00:00:00.000Z",
		})
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "has_more": false, "data": data})
}

// listReceived answers List Received Emails
// (https://resend.com/docs/api-reference/emails/list-received-emails and
// https://resend.com/docs/api-reference/pagination): every email added,
// newest first (of two created at the same instant, the greater id first,
// as resendhook's and devresend's fakes order them), limit from 1 to 100
// (20 without one), after an id (excluded), has_more. Each entry has the
// fields of the page's example (testdata/resend/received_emails.json),
// created_at in its format. A bad limit or an unknown cursor is refused
// with 422 validation_error: the service never sends either, so only that
// it is refused matters.
func (a *ResendAPI) listReceived(w http.ResponseWriter, q url.Values) {
	refuse := func(msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_ = json.NewEncoder(w).Encode(map[string]any{"statusCode": http.StatusUnprocessableEntity, "message": msg, "name": "validation_error"})
	}
	limit := 20
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			refuse("limit must be a number from 1 to 100")
			return
		}
		limit = n
	}
	a.mu.Lock()
	all := make([]Email, 0, len(a.emails))
	for _, m := range a.emails {
		all = append(all, m)
	}
	a.mu.Unlock()
	slices.SortFunc(all, func(x, y Email) int {
		if c := y.Created.Compare(x.Created); c != 0 {
			return c
		}
		return cmp.Compare(y.EmailID, x.EmailID)
	})
	lo := 0
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(all, func(m Email) bool { return m.EmailID == after })
		if i < 0 {
			refuse("after is not a received email's id")
			return
		}
		lo = i + 1
	}
	hi := min(lo+limit, len(all))
	data := make([]map[string]any, 0, hi-lo)
	for _, m := range all[lo:hi] {
		data = append(data, m.listEntry())
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "has_more": hi < len(all), "data": data})
}

// listEntry is m as List Received Emails lists it. The page names no
// received_for, so the service decides by to and cc alone.
func (m Email) listEntry() map[string]any {
	atts := []map[string]any{}
	for _, at := range m.Attachments {
		atts = append(atts, map[string]any{"id": at.ID, "filename": at.Filename, "size": at.Size,
			"content_type": "application/octet-stream", "content_disposition": "attachment", "content_id": nil})
	}
	return map[string]any{
		"id":          m.EmailID,
		"to":          []string{m.To},
		"from":        m.From,
		"created_at":  m.Created.UTC().Format("2006-01-02 15:04:05.000000-07"),
		"subject":     m.Subject,
		"bcc":         []string{},
		"cc":          orEmpty(m.Cc),
		"reply_to":    []string{},
		"message_id":  m.MessageID,
		"attachments": atts,
	}
}
