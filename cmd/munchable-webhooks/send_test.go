package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
)

const (
	sendStripeFile = "../../testdata/events/customer.subscription.created.json"
	sendResendFile = "../../testdata/events/email.received.json"
)

// received is one delivery as the fake provider endpoint verified it.
type received struct {
	Path     string
	ID       string // Stripe: the event's id; Resend: svix-id
	Verified bool   // within the provider's tolerance
	Signed   bool   // signature right, whatever the timestamp
	Body     []byte
	At       time.Time
}

// fakeProvider verifies deliveries the way the service does, with
// stripe-go's webhook package and the svix library, and records them.
type fakeProvider struct {
	url string
	mu  sync.Mutex
	got []received
	// answer, when set, writes the response.
	answer func(w http.ResponseWriter)
	// hold, when set, runs before the response (to see concurrency).
	hold func()
}

func newFakeProvider(t *testing.T) *fakeProvider {
	t.Helper()
	env := validEnv()
	wh, err := svix.NewWebhook(env["RESEND_WEBHOOK_SECRET"])
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProvider{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := received{Path: r.URL.Path, Body: body}
		switch r.URL.Path {
		case "/webhooks/stripe":
			sig := r.Header.Get("Stripe-Signature")
			rec.Verified = webhook.ValidatePayload(body, sig, env["STRIPE_WEBHOOK_SECRET"]) == nil
			rec.Signed = webhook.ValidatePayloadIgnoringTolerance(body, sig, env["STRIPE_WEBHOOK_SECRET"]) == nil
			var ev struct{ ID string }
			_ = json.Unmarshal(body, &ev)
			rec.ID = ev.ID
		case "/webhooks/resend":
			rec.Verified = wh.Verify(body, r.Header) == nil
			rec.Signed = wh.VerifyIgnoringTimestamp(body, r.Header) == nil
			rec.ID = r.Header.Get("svix-id")
		}
		if ts, err := strconv.ParseInt(r.Header.Get("svix-timestamp"), 10, 64); err == nil {
			rec.At = time.Unix(ts, 0)
		}
		f.mu.Lock()
		f.got = append(f.got, rec)
		f.mu.Unlock()
		if f.hold != nil {
			f.hold()
		}
		if f.answer != nil {
			f.answer(w)
			return
		}
		w.Header().Set("Webhook-Idempotency", "first")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"received":true}`+"\n")
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *fakeProvider) received() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.got...)
}

// runSend runs `munchable-webhooks send args...` with the test secrets.
func runSend(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(t.Context(), append([]string{"munchable-webhooks", "send"}, args...), environ(validEnv()), &out, &errOut)
	return out.String(), err
}

func TestSendSignsLikeTheProvider(t *testing.T) {
	t.Parallel()
	stripeBody, err := os.ReadFile(sendStripeFile)
	if err != nil {
		t.Fatal(err)
	}
	resendBody, err := os.ReadFile(sendResendFile)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		want     received
		wantBody []byte // nil: not compared
	}{
		{"stripe", []string{sendStripeFile},
			received{Path: "/webhooks/stripe", ID: "evt_1QmunchableCreated0001", Verified: true, Signed: true}, stripeBody},
		{"stripe with -id", []string{"-id", "evt_other", sendStripeFile},
			received{Path: "/webhooks/stripe", ID: "evt_other", Verified: true, Signed: true}, nil},
		{"stripe backdated past the tolerance", []string{"-age", "10m", sendStripeFile},
			received{Path: "/webhooks/stripe", ID: "evt_1QmunchableCreated0001", Verified: false, Signed: true}, stripeBody},
		{"resend", []string{sendResendFile},
			received{Path: "/webhooks/resend", ID: resendDefaultID(t), Verified: true, Signed: true}, resendBody},
		{"resend with -id", []string{"-id", "msg_mine", sendResendFile},
			received{Path: "/webhooks/resend", ID: "msg_mine", Verified: true, Signed: true}, resendBody},
		{"resend backdated past the tolerance", []string{"-age", "10m", sendResendFile},
			received{Path: "/webhooks/resend", ID: resendDefaultID(t), Verified: false, Signed: true}, resendBody},
		{"provider forced", []string{"-provider", "resend", "-id", "msg_x", sendStripeFile},
			received{Path: "/webhooks/resend", ID: "msg_x", Verified: true, Signed: true}, stripeBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeProvider(t)
			out, err := runSend(t, append([]string{"-url", f.url}, tt.args...)...)
			if err != nil {
				t.Fatalf("send: %v", err)
			}
			got := f.received()
			if len(got) != 1 {
				t.Fatalf("provider got %d deliveries, want 1", len(got))
			}
			if diff := cmp.Diff(tt.want, got[0], cmp.FilterPath(func(p cmp.Path) bool {
				return p.Last().String() == ".Body" || p.Last().String() == ".At"
			}, cmp.Ignore())); diff != "" {
				t.Errorf("delivery (-want +got):\n%s", diff)
			}
			if tt.wantBody != nil && !bytes.Equal(got[0].Body, tt.wantBody) {
				t.Errorf("body differs from the file's")
			}
			if want := "200 idempotency=first retry-after=- {\"received\":true}\n"; out != want {
				t.Errorf("output = %q, want %q", out, want)
			}
		})
	}
}

// resendDefaultID is the svix-id send derives from the sample file.
func resendDefaultID(t *testing.T) string {
	t.Helper()
	f := newFakeProvider(t)
	for range 2 {
		if _, err := runSend(t, "-url", f.url, sendResendFile); err != nil {
			t.Fatal(err)
		}
	}
	got := f.received()
	if got[0].ID == "" || got[0].ID != got[1].ID {
		t.Fatalf("svix-ids of two sends of one file: %q, %q; want one stable id", got[0].ID, got[1].ID)
	}
	return got[0].ID
}

func TestSendBackdates(t *testing.T) {
	t.Parallel()
	f := newFakeProvider(t)
	if _, err := runSend(t, "-url", f.url, "-age", "10m", sendResendFile); err != nil {
		t.Fatal(err)
	}
	if age := time.Since(f.received()[0].At); age < 9*time.Minute || age > 11*time.Minute {
		t.Errorf("signature timestamp is %s old, want 10m", age)
	}
}

func TestSendRepeatsAndConcurrency(t *testing.T) {
	t.Parallel()
	f := newFakeProvider(t)
	// Each request waits until all four of its round are in flight: a send
	// that did not run them at once would time out here.
	var mu sync.Mutex
	arrived, inflight, maxInflight := 0, 0, 0
	cond := sync.NewCond(&mu)
	f.hold = func() {
		mu.Lock()
		defer mu.Unlock()
		arrived++
		inflight++
		maxInflight = max(maxInflight, inflight)
		cond.Broadcast()
		wake := time.AfterFunc(5*time.Second, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
		defer wake.Stop()
		for start := time.Now(); arrived%4 != 0 && time.Since(start) < 5*time.Second; {
			cond.Wait()
		}
		inflight--
	}
	out, err := runSend(t, "-url", f.url, "-n", "2", "-concurrency", "4", sendStripeFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(f.received()); got != 8 {
		t.Errorf("provider got %d deliveries, want 2 rounds of 4", got)
	}
	if maxInflight != 4 {
		t.Errorf("at most %d deliveries were in flight together, want 4", maxInflight)
	}
	if n := strings.Count(out, "\n"); n != 8 {
		t.Errorf("printed %d lines, want one per answer:\n%s", n, out)
	}

	seq := newFakeProvider(t)
	if _, err := runSend(t, "-url", seq.url, "-n", "3", sendStripeFile); err != nil {
		t.Fatal(err)
	}
	if got := len(seq.received()); got != 3 {
		t.Errorf("-n 3 made %d deliveries", got)
	}
}

func TestSendPrintsTheAnswer(t *testing.T) {
	t.Parallel()
	f := newFakeProvider(t)
	f.answer = func(w http.ResponseWriter) {
		w.Header().Set("Webhook-Idempotency", "in-progress")
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"error":"in progress"}`)
	}
	out, err := runSend(t, "-url", f.url+"/", sendStripeFile)
	// Printed like any answer, and counted as a failure so scripts see it.
	if err == nil || !strings.Contains(err.Error(), "1 of 1") {
		t.Errorf("err = %v, want one naming the request that got no 2xx", err)
	}
	if want := "409 idempotency=in-progress retry-after=7 {\"error\":\"in progress\"}\n"; out != want {
		t.Errorf("output = %q, want %q", out, want)
	}
}

func TestSendRefuses(t *testing.T) {
	t.Parallel()
	port, err := dbtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nobody := "http://127.0.0.1:" + strconv.Itoa(port)
	tests := []struct {
		name    string
		env     []string
		args    []string
		wantErr string
	}{
		{"no stripe secret", []string{"RESEND_WEBHOOK_SECRET=" + validEnv()["RESEND_WEBHOOK_SECRET"]}, []string{sendStripeFile}, "STRIPE_WEBHOOK_SECRET"},
		{"no resend secret", []string{"STRIPE_WEBHOOK_SECRET=whsec_x"}, []string{sendResendFile}, "RESEND_WEBHOOK_SECRET"},
		{"resend secret not whsec", []string{"RESEND_WEBHOOK_SECRET=plain"}, []string{sendResendFile}, "RESEND_WEBHOOK_SECRET"},
		{"unknown provider", environ(validEnv()), []string{"-provider", "paypal", sendStripeFile}, "paypal"},
		{"no file", environ(validEnv()), nil, "EVENT_FILE"},
		{"missing file", environ(validEnv()), []string{"nope.json"}, "nope.json"},
		{"zero sends", environ(validEnv()), []string{"-n", "0", sendStripeFile}, "-n"},
		{"nobody listening", environ(validEnv()), []string{"-url", nobody, sendStripeFile}, "no answer"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := run(t.Context(), append([]string{"munchable-webhooks", "send"}, tt.args...), tt.env, &out, &out)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: err = %v, want one mentioning %q", tt.name, err, tt.wantErr)
		}
	}
}

// Against the real service: send's signatures are the ones the Stripe
// handler accepts, and a repeat is a duplicate.
func TestSendToService(t *testing.T) {
	t.Parallel()
	s := startService(t, nil)
	var lines []string
	for range 2 {
		out, err := runSend(t, "-url", s.url, sendStripeFile)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.Fields(out)[:2]...)
	}
	if want := []string{"200", "idempotency=first", "200", "idempotency=duplicate"}; !cmp.Equal(lines, want) {
		t.Errorf("two sends = %v, want %v", lines, want)
	}
	out, _ := runSend(t, "-url", s.url, "-age", "10m", "-id", "evt_stale", sendStripeFile)
	if !strings.HasPrefix(out, "400 ") {
		t.Errorf("backdated send = %q, want 400", out)
	}

	// A wrong secret: the answer, and on stderr what to check and where
	// the reason is logged.
	env := validEnv()
	env["STRIPE_WEBHOOK_SECRET"] = "whsec_not_the_services"
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"munchable-webhooks", "send", "-url", s.url, "-id", "evt_wrong_secret", sendStripeFile}, environ(env), &stdout, &stderr)
	if err == nil || !strings.HasPrefix(stdout.String(), "400 ") {
		t.Errorf("send with a wrong secret: %v, %q; want an error and a 400", err, &stdout)
	}
	for _, want := range []string{"STRIPE_WEBHOOK_SECRET is not the secret the service runs with", "reason field"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("send with a wrong secret: stderr %q lacks %q", &stderr, want)
		}
	}
}

// Without -url, send posts to LISTEN_ADDR's port on loopback, where
// healthcheck looks for the service too.
func TestSendFindsTheServiceOnListenAddr(t *testing.T) {
	t.Parallel()
	f := newFakeProvider(t)
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	env := validEnv()
	env["LISTEN_ADDR"] = ":" + u.Port()
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"munchable-webhooks", "send", sendStripeFile}, environ(env), &stdout, &stderr); err != nil {
		t.Fatalf("send: %v\n%s", err, &stderr)
	}
	if got := f.received(); len(got) != 1 || got[0].Path != "/webhooks/stripe" {
		t.Errorf("the provider at LISTEN_ADDR received %+v, want one Stripe delivery", got)
	}
}
