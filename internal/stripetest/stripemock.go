package stripetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// stripeMockVersion is the stripe-mock that request shapes are checked
// against: its routes and parameter validation come from Stripe's OpenAPI
// spec, so it refuses (400, 404) a route or parameter Stripe does not have.
const stripeMockVersion = "github.com/stripe/stripe-mock@v0.203.0"

// StartStripeMock builds stripe-mock from the module proxy into a temporary
// directory and serves it on a free loopback port until the test ends. Where
// it cannot be built the test is skipped, except under CI=true.
func StartStripeMock(t testing.TB) *url.URL {
	t.Helper()
	dir := t.TempDir()
	install := exec.Command("go", "install", stripeMockVersion)
	install.Dir = dir // outside this module: its go.mod must not apply
	install.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
	if out, err := install.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("stripe-mock unavailable: go install %s: %v\n%s", stripeMockVersion, err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	port := freePort(t)
	cmd := exec.Command(filepath.Join(dir, "stripe-mock"), "-http-port", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start stripe-mock: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base.String()+"/v1/subscriptions", nil)
		req.SetBasicAuth(Key, "")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("stripe-mock did not answer within 30s")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
