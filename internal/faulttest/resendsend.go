package faulttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// SentEmail is one POST /emails the fake received.
type SentEmail struct {
	// Key is the Idempotency-Key; ID the email id answered (the first
	// email's for a key seen before).
	Key, ID string
	Body    map[string]any
}

// SendHook runs after a send is recorded (the email counts as sent) and
// before it is answered: a test may kill the sender there, between
// Resend's send and the sender's record of it.
type SendHook func(key string)

// sent is the fake's outbox: Resend's Send Email
// (https://resend.com/docs/api-reference/emails/send-email) with its
// idempotency rule: a key seen before is answered with its first email,
// and sends nothing.
type sent struct {
	posts  []SentEmail
	emails map[string]string // key -> email id
	hook   SendHook
}

// SetSendHook installs h (nil: none).
func (a *ResendAPI) SetSendHook(h SendHook) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent.hook = h
}

// Sends returns every POST /emails received, in order.
func (a *ResendAPI) Sends() []SentEmail {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]SentEmail(nil), a.sent.posts...)
}

// Emails is how many emails were sent: one per Idempotency-Key.
func (a *ResendAPI) Emails() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sent.emails)
}

func (a *ResendAPI) send(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+ResendAPIKey {
		http.Error(w, `{"message":"invalid api key"}`, http.StatusUnauthorized)
		return
	}
	raw, err := io.ReadAll(r.Body)
	var body map[string]any
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"statusCode":422,"message":"invalid body","name":"validation_error"}`))
		return
	}
	key := r.Header.Get("Idempotency-Key")
	a.mu.Lock()
	if a.sent.emails == nil {
		a.sent.emails = map[string]string{}
	}
	id, seen := a.sent.emails[key]
	if !seen || key == "" {
		id = fmt.Sprintf("fake-email-%d", len(a.sent.posts)+1)
		if key != "" {
			a.sent.emails[key] = id
		}
	}
	a.sent.posts = append(a.sent.posts, SentEmail{Key: key, ID: id, Body: body})
	hook := a.sent.hook
	a.mu.Unlock()
	if hook != nil {
		hook(key)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
}
