package faulttest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ResendAPI is a fake of the Resend API calls the service makes for a
// received email: GET /emails/receiving/{email_id} (with html_format=cid)
// and GET /emails/receiving/{email_id}/attachments. It answers the emails
// added to it, which have no attachments, 404 for any other id, and lets a
// test hold, delay or fail a fetch of the email with a hook.
type ResendAPI struct {
	srv     *httptest.Server
	fetches atomic.Int64

	mu     sync.Mutex
	emails map[string][]byte
	hook   Hook
}

// Hook runs before each fetch is answered, on the request's context (done
// when the service hangs up or dies). It may block; it returns the status to
// fail the fetch with, or 0 to answer it normally.
type Hook func(ctx context.Context, emailID string) int

// NewResendAPI starts the fake on a local port. Close stops it.
func NewResendAPI() *ResendAPI {
	a := &ResendAPI{emails: map[string][]byte{}}
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
	body := m.APIJSON()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.emails[m.EmailID] = body
}

// SetHook installs h (nil: answer every fetch at once).
func (a *ResendAPI) SetHook(h Hook) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook = h
}

// Fetches counts the fetches received so far.
func (a *ResendAPI) Fetches() int64 { return a.fetches.Load() }

func (a *ResendAPI) serve(w http.ResponseWriter, r *http.Request) {
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
	hook, body := a.hook, a.emails[id]
	a.mu.Unlock()
	if list {
		a.listAttachments(w, body != nil)
		return
	}
	a.fetches.Add(1)
	if hook != nil {
		if status := hook(r.Context(), id); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"statusCode":` + strconv.Itoa(status) + `,"message":"injected failure","name":"application_error"}`))
			return
		}
	}
	if body == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"statusCode":404,"message":"Email not found","name":"not_found"}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// listAttachments answers the attachments of a known email: none, as the
// emails this fake holds list none.
func (a *ResendAPI) listAttachments(w http.ResponseWriter, known bool) {
	w.Header().Set("Content-Type", "application/json")
	if !known {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"statusCode":404,"message":"Email not found","name":"not_found"}`))
		return
	}
	_, _ = w.Write([]byte(`{"object":"list","has_more":false,"data":[]}`))
}
