package faulttest_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"
	"golang.org/x/net/http/httpguts"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/faulttest"
)

// heldRequest is an attacker's request: it announces a body and sends only
// part of it, then holds the connection. answer receives the service's
// answer (its body unread), or nil when the connection ends without one.
type heldRequest struct {
	conn   net.Conn
	answer chan *http.Response
	done   sync.WaitGroup
}

// hold opens a connection to path and sends a JSON request announcing
// announced bytes of body, of which it sends the first len(body). Both of
// its goroutines end when release closes the connection.
func hold(t *testing.T, addr, path string, announced int, body []byte) *heldRequest {
	t.Helper()
	return holdHead(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, addr, announced), body)
}

// holdHead sends head and then body on a connection of its own, and reads
// the answer in the background.
func holdHead(t *testing.T, addr, head string, body []byte) *heldRequest {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldRequest{conn: c, answer: make(chan *http.Response, 1)}
	h.done.Go(func() {
		// Fails once the service answers and closes: that is the point.
		if _, err := io.WriteString(c, head); err == nil {
			_, _ = c.Write(body)
		}
	})
	h.done.Go(func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			h.answer <- nil
			return
		}
		h.answer <- resp
	})
	return h
}

// answered is the service's answer so far: nil for none yet, or none at
// all.
func (h *heldRequest) answered() *http.Response {
	select {
	case a := <-h.answer:
		h.answer <- a
		return a
	default:
		return nil
	}
}

// status is the answer's status code, 0 for none.
func (h *heldRequest) status() int {
	if a := h.answered(); a != nil {
		return a.StatusCode
	}
	return 0
}

func (h *heldRequest) release() {
	h.conn.Close()
	h.done.Wait()
}

// vmRSS is the resident set of process pid, in bytes, from /proc.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read VmRSS: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// padded is a subscription event whose metadata brings it to about 3 KiB,
// a typical Stripe delivery.
func padded(n int) faulttest.StripeEvent {
	ev := subEvent(n, "active")
	ev.Metadata = map[string]string{}
	for i := range 5 {
		ev.Metadata[fmt.Sprintf("note_%d", i)] = strings.Repeat(string(rune('a'+i)), 480)
	}
	return ev
}

// Memory is bounded by what arrives, and by the in-flight budget beyond the
// free part of each body: 200 requests that announce 1 MiB and send all but
// its last byte, held for 3 s, no longer take the pod's memory (about 537
// MiB before), and a real 3 KiB delivery is served meanwhile.
func TestHeldBodiesBoundedMemory(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(nil) // BODY_READ_TIMEOUT 10s, MAX_INFLIGHT_BODY_BYTES 32 MiB
	const (
		conns   = 200
		holdFor = 3 * time.Second
		limit   = 96 << 20
	)
	idle := vmRSS(t, svc.PID())
	body := bytes.Repeat([]byte(" "), claim.MaxBody-1)
	held := make([]*heldRequest, conns)
	for i := range held {
		held[i] = hold(t, svc.Addr(), "/webhooks/stripe", claim.MaxBody, body)
	}
	t.Cleanup(func() {
		for _, h := range held {
			h.release()
		}
	})

	var peak int64
	var delivery faulttest.Answer
	ev := padded(1)
	size := len(ev.JSON())
	start := time.Now()
	for time.Since(start) < holdFor {
		peak = max(peak, vmRSS(t, svc.PID()))
		if delivery.Sent.IsZero() && time.Since(start) > holdFor/3 {
			delivery = r.stripe(svc, ev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	answers := map[int]int{}
	for _, h := range held {
		answers[h.status()]++
	}
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	budget := m.Sum("webhook_rejections_total", "provider", "stripe", "reason", "body_budget")
	figure(t, "%d held requests (1 MiB announced, 1 MiB - 1 sent) for %v: VmRSS %.1f MiB idle, peak %.1f MiB; answers while held %v (0: none yet), body_budget %v; a %d-byte signed delivery meanwhile: %d in %v",
		conns, holdFor, float64(idle)/(1<<20), float64(peak)/(1<<20), answers, budget, size, delivery.Status, delivery.Done.Sub(delivery.Sent).Round(time.Millisecond))

	if peak >= limit {
		t.Errorf("peak VmRSS %.1f MiB with %d held requests, want under %d MiB", float64(peak)/(1<<20), conns, limit>>20)
	}
	if !delivery.OK() {
		t.Errorf("a 3 KiB delivery while the bodies were held: %v, want 200", delivery)
	}
	if _, ok := r.entitlement(ev.SubscriptionID); !ok {
		t.Error("the delivery answered while the bodies were held wrote no entitlement")
	}
	if answers[http.StatusServiceUnavailable] == 0 || budget == 0 {
		t.Errorf("no request was refused for want of budget (answers %v, body_budget %v), yet 200 MiB were announced against 32 MiB", answers, budget)
	}
	if got := m.Sum("webhook_deliveries_total", "outcome", "rejected"); got != 0 {
		t.Errorf(`held bodies counted as outcome "rejected" (%v): they are not forgeries`, got)
	}
}

// A body slower than BODY_READ_TIMEOUT is answered 408 and counted as
// body_timeout, and a wrong content type 415 as media_type; neither counts
// as the outcome "rejected" that the signatures-refused alert watches.
func TestSlowBodyIsNotAForgery(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{"BODY_READ_TIMEOUT": "1s"})
	took := map[string]time.Duration{}
	for _, provider := range []string{"stripe", "resend"} {
		start := time.Now()
		h := hold(t, svc.Addr(), "/webhooks/"+provider, 3000, []byte(`{"type":`))
		select {
		case got := <-h.answer:
			took[provider] = time.Since(start).Round(time.Millisecond)
			if got == nil || got.StatusCode != http.StatusRequestTimeout {
				t.Errorf("%s: slow body answered %v, want 408", provider, got)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: slow body not answered in 20s (BODY_READ_TIMEOUT 1s)", provider)
		}
		h.release()

		req, err := http.NewRequest(http.MethodPost, svc.URL()+"/webhooks/"+provider, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		if a := faulttest.Do(r.client, req); a.Status != http.StatusUnsupportedMediaType {
			t.Errorf("%s: text/plain answered %v, want 415", provider, a)
		}
	}
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, provider := range []string{"stripe", "resend"} {
		for reason, want := range map[string]float64{"body_timeout": 1, "media_type": 1, "signature": 0, "timestamp": 0} {
			if got := m.Sum("webhook_rejections_total", "provider", provider, "reason", reason); got != want {
				t.Errorf("webhook_rejections_total{provider=%q,reason=%q} = %v, want %v", provider, reason, got, want)
			}
		}
		if got := m.Sum("webhook_deliveries_total", "provider", provider, "outcome", "rejected"); got != 0 {
			t.Errorf(`%s: webhook_deliveries_total{outcome="rejected"} = %v, want 0`, provider, got)
		}
	}
	figure(t, "a body stalled after 8 of 3000 bytes: 408 after %v (stripe), %v (resend) with BODY_READ_TIMEOUT=1s; counted body_timeout, rejected 0", took["stripe"], took["resend"])
}

// Over MAX_INFLIGHT_BODY_BYTES a large body is refused with 503 and
// Retry-After (both providers retry); a small delivery is still served.
func TestBodyBudgetRefusesWithRetryAfter(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(map[string]string{"MAX_INFLIGHT_BODY_BYTES": strconv.Itoa(2 << 20)})
	body := bytes.Repeat([]byte(" "), claim.MaxBody-1)
	var held []*heldRequest
	t.Cleanup(func() {
		for _, h := range held {
			h.release()
		}
	})
	var refused *heldRequest
	deadline := time.Now().Add(20 * time.Second)
	for refused == nil && time.Now().Before(deadline) {
		held = append(held, hold(t, svc.Addr(), "/webhooks/stripe", claim.MaxBody, body))
		time.Sleep(200 * time.Millisecond)
		for _, h := range held {
			if h.status() == http.StatusServiceUnavailable {
				refused = h
			}
		}
	}
	if refused == nil {
		t.Fatalf("%d held 1 MiB bodies against a 2 MiB budget, none refused with 503", len(held))
	}
	if ra, err := strconv.Atoi(refused.answered().Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("503 with Retry-After %q, want whole seconds >= 1", refused.answered().Header.Get("Retry-After"))
	}
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("webhook_rejections_total", "provider", "stripe", "reason", "body_budget"); got < 1 {
		t.Errorf("body_budget = %v, want at least 1", got)
	}
	ev := padded(2)
	if a := r.stripe(svc, ev); !a.OK() {
		t.Errorf("3 KiB delivery while the budget is held: %v, want 200", a)
	}
	figure(t, "held 1 MiB bodies against MAX_INFLIGHT_BODY_BYTES=2MiB: number %d was refused 503 Retry-After %s; a 3 KiB delivery was served meanwhile",
		len(held), refused.answered().Header.Get("Retry-After"))
}

// An event id the claim key cannot hold sanely (over 255 bytes, a NUL, a
// space, a byte over 0x7e) is refused with 400 before the claim, for both
// providers, with a valid signature: no key, no row, no Resend fetch.
func TestInvalidEventIDs(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	svc := r.service(nil)
	ids := []struct{ name, id string }{
		{"256 bytes", "evt_" + strings.Repeat("x", 252)},
		{"NUL", "evt_\x00nul"},
		{"space", "evt_ space"},
		{"DEL (0x7f)", "evt_\x7fdel"},
		{"0xc3 0xbf (ÿ)", "evt_ÿ"},
	}
	var stripeSent float64
	for i, tt := range ids {
		ev := subEvent(100+i, "active")
		ev.ID = tt.id
		body := ev.JSON()
		signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: faulttest.StripeSecret, Timestamp: time.Now()})
		header := http.Header{"Content-Type": {"application/json"}, "Stripe-Signature": {signed.Header}}
		if got := rawPost(t, svc.Addr(), "/webhooks/stripe", header, body); got != http.StatusBadRequest {
			t.Errorf("stripe id %s: status %d, want 400", tt.name, got)
		}
		stripeSent++
		if v, _ := r.claim("stripe", tt.id); v != "" {
			t.Errorf("stripe id %s: claim key holds %q, want none", tt.name, v)
		}
		if _, ok := r.entitlement(ev.SubscriptionID); ok {
			t.Errorf("stripe id %s: an entitlement was written", tt.name)
		}
	}

	wh, err := svix.NewWebhook(faulttest.ResendSecret)
	if err != nil {
		t.Fatal(err)
	}
	var resendHandled float64
	for i, tt := range ids {
		m := newEmail(fmt.Sprintf("badid%d", i))
		m.SvixID = strings.Replace(tt.id, "evt_", "msg_", 1)
		r.api.Add(m)
		body := m.EventJSON()
		now := time.Now()
		sig, err := wh.Sign(m.SvixID, now, body)
		if err != nil {
			t.Fatal(err)
		}
		header := http.Header{
			"Content-Type":   {"application/json"},
			"Svix-Id":        {m.SvixID},
			"Svix-Timestamp": {strconv.FormatInt(now.Unix(), 10)},
			"Svix-Signature": {sig},
		}
		if got := rawPost(t, svc.Addr(), "/webhooks/resend", header, body); got != http.StatusBadRequest {
			t.Errorf("svix-id %s: status %d, want 400", tt.name, got)
		}
		// Go's server refuses a header value with a control byte (NUL,
		// DEL) before any handler runs: 400 all the same, but not counted.
		if httpguts.ValidHeaderFieldValue(m.SvixID) {
			resendHandled++
		}
		if v, _ := r.claim("resend", m.SvixID); v != "" {
			t.Errorf("svix-id %s: claim key holds %q, want none", tt.name, v)
		}
		if n := r.supportRows(m); n != 0 {
			t.Errorf("svix-id %s: %d support rows, want 0", tt.name, n)
		}
	}
	if n := r.api.Fetches(); n != 0 {
		t.Errorf("%d Resend fetches for deliveries with invalid ids, want 0", n)
	}
	m, err := svc.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for provider, want := range map[string]float64{"stripe": stripeSent, "resend": resendHandled} {
		if got := m.Sum("webhook_rejections_total", "provider", provider, "reason", "invalid_id"); got != want {
			t.Errorf("webhook_rejections_total{provider=%q,reason=\"invalid_id\"} = %v, want %v", provider, got, want)
		}
		if got := m.Sum("webhook_deliveries_total", "provider", provider, "outcome", "rejected"); got != 0 {
			t.Errorf(`%s: webhook_deliveries_total{outcome="rejected"} = %v, want 0: a bad id is not a forged signature`, provider, got)
		}
	}
	figure(t, "%d ids per provider: every one 400, 0 keys, 0 rows, 0 fetches; invalid_id stripe %v, resend %v (the rest refused by net/http's header check)",
		len(ids), stripeSent, resendHandled)
}

// rawPost writes a request byte for byte, headers the Go client would
// refuse to send included, and returns the answer's status (0: none).
func rawPost(t *testing.T, addr, path string, header http.Header, body []byte) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n", path, addr, len(body))
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&req, "%s: %s\r\n", k, v)
		}
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
