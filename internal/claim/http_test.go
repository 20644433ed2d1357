package claim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/munchable/munchable-webhooks/internal/intake"
)

// intakeRig is one provider's Endpoint behind a real HTTP server, on a real
// Redis. Its decode stands in for a provider's: the body says which event
// id it carries and which verification failure to report, so that every
// reason can be produced on purpose.
type intakeRig struct {
	srv     *httptest.Server
	flow    *Flow
	store   *Store
	rdb     *redis.Client
	applied counter
	decoded chan []byte // a copy of every body decode saw
}

func newIntakeRig(t *testing.T, cfg FlowConfig) *intakeRig {
	t.Helper()
	s, rdb := newTestStore(t, time.Minute)
	cfg.HandlerTimeout = 5 * time.Second
	cfg.Registerer = prometheus.NewRegistry()
	r := &intakeRig{flow: NewFlow(s, cfg), store: s, rdb: rdb, decoded: make(chan []byte, 64)}
	ep := r.flow.Endpoint(stripe)
	r.srv = httptest.NewServer(ep.Handler(r.decode))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *intakeRig) decode(_ http.Header, body []byte) (Event, error) {
	select {
	case r.decoded <- bytes.Clone(body):
	default:
	}
	var in struct {
		ID     string `json:"id"`
		Reject string `json:"reject"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	switch in.Reject {
	case "signature":
		return Event{}, fmt.Errorf("verify: %w", ErrSignature)
	case "timestamp":
		return Event{}, fmt.Errorf("verify: %w", ErrTimestamp)
	}
	return Event{ID: in.ID, Type: "test.event", Apply: r.applied.apply(nil)}, nil
}

func (r *intakeRig) post(t *testing.T, contentType string, body []byte) *http.Response {
	t.Helper()
	resp, err := r.srv.Client().Post(r.srv.URL, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func (r *intakeRig) rejections(reason string) float64 {
	return testutil.ToFloat64(r.flow.metrics.rejections.WithLabelValues(stripe.Name, reason))
}

func (r *intakeRig) rejectedDeliveries() float64 {
	return testutil.ToFloat64(r.flow.metrics.deliveries.WithLabelValues(stripe.Name, string(Rejected)))
}

// keys counts the claim keys the rig's store holds.
func (r *intakeRig) keys(t *testing.T) int {
	t.Helper()
	keys, err := r.rdb.Keys(t.Context(), r.store.prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// partial opens a connection and sends a request announcing contentLength
// bytes of body and sending only sent of them. The connection stays open
// until the test ends.
func (r *intakeRig) partial(t *testing.T, contentLength, sent int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", r.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", contentLength)
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(bytes.Repeat([]byte(" "), sent)); err != nil {
		t.Fatal(err)
	}
	return c
}

// answer reads the response to a partial request.
func answer(t *testing.T, c net.Conn) *http.Response {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// Every refusal before the claim is counted under its own reason, and only
// verification failures count as the delivery outcome "rejected", which is
// what the signatures-refused alert watches. None takes a claim or applies.
func TestRejectionReasons(t *testing.T) {
	t.Parallel()
	r := newIntakeRig(t, FlowConfig{})
	tests := []struct {
		name        string
		contentType string
		body        string
		status      int
		reason      string
	}{
		{"bad signature", "application/json", `{"id":"evt_1","reject":"signature"}`, 400, reasonSignature},
		{"stale timestamp", "application/json", `{"id":"evt_1","reject":"timestamp"}`, 400, reasonTimestamp},
		{"not an event", "application/json", `{"id":`, 400, reasonMalformed},
		{"empty body", "application/json", ``, 400, reasonMalformed},
		{"id with a NUL", "application/json", `{"id":"evt_\u0000"}`, 400, reasonInvalidID},
		{"text/plain", "text/plain", `{"id":"evt_1"}`, 415, reasonMediaType},
		{"form post", "application/x-www-form-urlencoded", `id=evt_1`, 415, reasonMediaType},
		{"over the cap", "application/json", `{"id":"evt_1","pad":"` + strings.Repeat("x", MaxBody) + `"}`, 413, reasonBodyTooLarge},
	}
	want := map[string]float64{}
	for _, tt := range tests {
		if got := r.post(t, tt.contentType, []byte(tt.body)); got.StatusCode != tt.status {
			t.Errorf("%s: status = %d, want %d", tt.name, got.StatusCode, tt.status)
		} else if got.Header.Get(HeaderIdempotency) != "" {
			t.Errorf("%s: answered from the claim (%s)", tt.name, got.Header.Get(HeaderIdempotency))
		}
		want[tt.reason]++
	}
	for _, reason := range rejectionReasons {
		if got := r.rejections(reason); got != want[reason] {
			t.Errorf("webhook_rejections_total{reason=%q} = %v, want %v", reason, got, want[reason])
		}
	}
	if got, verification := r.rejectedDeliveries(), want[reasonSignature]+want[reasonTimestamp]; got != verification {
		t.Errorf(`webhook_deliveries_total{outcome="rejected"} = %v, want %v (signature and timestamp only)`, got, verification)
	}
	if n := r.applied.n.Load(); n != 0 {
		t.Errorf("applied %d refused deliveries", n)
	}
	if n := r.keys(t); n != 0 {
		t.Errorf("refused deliveries left %d claim keys", n)
	}
}

// A body that does not arrive within the body deadline is answered 408 and
// counted as body_timeout: a slow client, not a forged signature.
func TestBodyReadTimeout(t *testing.T) {
	t.Parallel()
	r := newIntakeRig(t, FlowConfig{Intake: intake.New(intake.Config{Timeout: 300 * time.Millisecond})})
	c := r.partial(t, 3000, 100)
	if resp := answer(t, c); resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status = %d, want 408", resp.StatusCode)
	}
	if got := r.rejections(reasonBodyTimeout); got != 1 {
		t.Errorf("body_timeout = %v, want 1", got)
	}
	if got := r.rejectedDeliveries(); got != 0 {
		t.Errorf(`a slow body counted as outcome "rejected" (%v)`, got)
	}
	if got := r.rejections(reasonSignature); got != 0 {
		t.Errorf("a slow body counted as a signature failure (%v)", got)
	}
	if got := len(r.decoded); got != 0 {
		t.Errorf("decode ran %d times on a body that never arrived", got)
	}
	// The deadline is the body's alone: a delivery that sends its body in
	// time is served on the same server.
	if resp := r.post(t, "application/json", []byte(`{"id":"evt_on_time"}`)); resp.StatusCode != http.StatusOK {
		t.Errorf("delivery in time: status = %d, want 200", resp.StatusCode)
	}
}

// Every body byte held counts against the budget; a growing body is
// refused with 503 and Retry-After before it eats into the reserve kept for
// first chunks, so a small delivery is still served while large bodies hold
// the rest. The budget comes back when a body ends.
func TestBodyBudget(t *testing.T) {
	t.Parallel()
	const budget = 8 * intake.ChunkSize
	// The reserve: a chunk for each of 2 connections.
	bodies := intake.New(intake.Config{Budget: budget, MaxConnections: 2})
	r := newIntakeRig(t, FlowConfig{Intake: bodies})

	// The holder has sent 4.5 chunks: it holds five of the six a body may
	// grow into.
	holder := r.partial(t, MaxBody, 9*intake.ChunkSize/2)
	waitInUse(t, bodies, 5*intake.ChunkSize)

	big := []byte(`{"id":"evt_big","pad":"` + strings.Repeat("x", 2*intake.ChunkSize) + `"}`)
	resp := r.post(t, "application/json", big)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "5" {
		t.Errorf("large body over the budget: %d Retry-After %q, want 503 Retry-After 5", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := r.rejections(reasonBodyBudget); got != 1 {
		t.Errorf("body_budget = %v, want 1", got)
	}
	if got := r.rejectedDeliveries(); got != 0 {
		t.Errorf(`a refusal for want of budget counted as "rejected" (%v)`, got)
	}
	small := []byte(`{"id":"evt_small","pad":"` + strings.Repeat("x", 3<<10) + `"}`)
	if resp := r.post(t, "application/json", small); resp.StatusCode != http.StatusOK {
		t.Errorf("3 KiB delivery while the budget is held: status = %d, want 200", resp.StatusCode)
	}

	holder.Close()
	waitInUse(t, bodies, 0)
	if resp := r.post(t, "application/json", big); resp.StatusCode != http.StatusOK {
		t.Errorf("large body once the budget is free: status = %d, want 200", resp.StatusCode)
	}
	waitInUse(t, bodies, 0)
}

func waitInUse(t *testing.T, in *intake.Intake, want int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for in.InUse() != want {
		select {
		case <-ctx.Done():
			t.Fatalf("budget in use = %d, want %d", in.InUse(), want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestCheckID(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		id   string
		ok   bool
	}{
		{"stripe event id", "evt_1NG8Du2eZvKYlo2CUI79vXWy", true},
		{"svix id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", true},
		{"255 bytes", strings.Repeat("a", MaxIDLen), true},
		{"every printable byte", "!~azAZ09_-:.", true},
		{"empty", "", false},
		{"256 bytes", strings.Repeat("a", MaxIDLen+1), false},
		{"NUL", "evt_\x00", false},
		{"space", "evt_ 1", false},
		{"newline", "evt_\n1", false},
		{"DEL", "evt_\x7f", false},
		{"byte over 0x7f", "evt_\xff", false},
		{"UTF-8", "evt_é", false},
	} {
		if err := checkID(tt.id); (err == nil) != tt.ok {
			t.Errorf("checkID(%s) = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}
