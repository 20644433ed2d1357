package support_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/intake"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// The form's body is read by the webhooks' intake: a body slower than the
// body deadline gets 408, and a body the budget cannot hold 503 with
// Retry-After, each as JSON, storing nothing.
func TestFormBodyThroughIntake(t *testing.T) {
	t.Parallel()
	// Budget 8 chunks, reserve 2 (MaxConnections 2): a form body may grow
	// into 6 chunks, 48 KiB, while the budget is free.
	bodies := intake.New(intake.Config{Timeout: 300 * time.Millisecond, Budget: 8 * intake.ChunkSize, MaxConnections: 2})
	wf := newWebForm(t, support.FormConfig{Intake: bodies})
	srv := httptest.NewServer(wf.form.Submit())
	t.Cleanup(srv.Close)

	// A slow body: 408 at the deadline.
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 3000\r\n\r\n{\"email\":")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("slow body: no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "not received in time") {
		t.Errorf("slow body: %d %s, want 408 and why", resp.StatusCode, b)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("slow body answered after %v, want about the 300ms deadline", took)
	}

	// A body larger than the budget leaves to grow into: 503, Retry-After.
	big := `{"email":"ada@example.com","message":"` + strings.Repeat("x", 7*intake.ChunkSize) + `"}`
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err = srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("body over the budget: %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := bodies.InUse(); got != 0 {
		t.Errorf("budget in use after both refusals = %d, want 0", got)
	}
	if n := countMessages(t, wf.pool); n != 0 {
		t.Errorf("messages = %d, want 0", n)
	}
}
