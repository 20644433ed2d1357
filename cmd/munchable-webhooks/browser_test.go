package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestSupportFormInBrowser drives headless Chromium against the whole
// service, as a customer would use the support form: the form is embedded
// in a page of the site, on another origin (another loopback port) than
// the service, and posts there with JavaScript (fetch, CORS preflight,
// Idempotency-Key) and without it (a plain post answered by pages). It
// checks what the person sees, and what was stored.
func TestSupportFormInBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	began := time.Now()

	var embedded atomic.Pointer[sitePage]
	site := httptest.NewServer(siteHandler(&embedded)) // in SUPPORT_FORM_ORIGINS
	t.Cleanup(site.Close)
	stranger := httptest.NewServer(siteHandler(&embedded)) // not listed
	t.Cleanup(stranger.Close)
	s := startService(t, map[string]string{
		"SUPPORT_FORM_ORIGINS":      site.URL,
		"SUPPORT_FORM_REDIRECT_URL": site.URL + "/thanks",
		"SUPPORT_FORM_RATE":         "100",
	})
	embedded.Store(embedPage(t, s.url))
	pool, err := pgxpool.New(t.Context(), s.databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	shots, err := os.MkdirTemp("", "support-form-browser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", shots)
	b := startBrowser(t, chromium)

	t.Run("JavaScript: a double-click makes one message", func(t *testing.T) {
		posts, dups := formPosts(t, s), formOutcome(t, s, "duplicate")
		tab := b.openForm(t, site.URL+"/", true)
		tab.screenshot(filepath.Join(shots, "page.png"))
		tab.fill("ada.js@example.com", "Ada", "Order 42", "Where is my order?")
		tab.doubleClick(`button[type="submit"]`)
		tab.waitText("#support-status", "Thank you: your message was received.")
		tab.screenshot(filepath.Join(shots, "javascript-thank-you.png"))
		if loc := tab.location(); loc != site.URL+"/" {
			t.Errorf("page moved to %s: the script did not post", loc)
		}
		if n, keyed := messagesFrom(t, pool, "ada.js@example.com"); n != 1 || keyed != 1 {
			t.Errorf("stored %d messages (%d with an Idempotency-Key), want 1 with a key", n, keyed)
		}
		// The page thanks on the first answer; the second click's post may
		// still be on its way. Wait for both answers before counting.
		waitFormPosts(t, s, posts+2, time.Minute)
		if got := formOutcome(t, s, "duplicate") - dups; got != 1 {
			t.Errorf("duplicate posts = %v, want 1: both clicks must reach the service with one key", got)
		}
	})

	t.Run("JavaScript: a problem is shown at its field", func(t *testing.T) {
		tab := b.openForm(t, site.URL+"/", true)
		tab.fill("bob.js@example.com", "", "", "   ")
		tab.send()
		tab.waitText("#message-error", "Message is required")
		tab.waitText("#support-status", "Your message was not sent")
		tab.screenshot(filepath.Join(shots, "javascript-error.png"))
		if n, _ := messagesFrom(t, pool, "bob.js@example.com"); n != 0 {
			t.Errorf("stored %d messages, want 0", n)
		}
	})

	t.Run("JavaScript: a filled honeypot looks sent and stores nothing", func(t *testing.T) {
		spam := formOutcome(t, s, "spam")
		tab := b.openForm(t, site.URL+"/", true)
		tab.fill("bot@example.com", "Bot", "Deal", "Cheap pills")
		tab.do(chromedp.SetValue(chromedp.ID("website"), "https://spam.example"))
		tab.send()
		tab.waitText("#support-status", "Thank you: your message was received.")
		if n, _ := messagesFrom(t, pool, "bot@example.com"); n != 0 {
			t.Errorf("stored %d messages from the bot, want 0", n)
		}
		if got := formOutcome(t, s, "spam"); got != spam+1 {
			t.Errorf("spam posts = %v, want %v", got, spam+1)
		}
	})

	t.Run("JavaScript: a page on an unlisted origin cannot post", func(t *testing.T) {
		tab := b.openForm(t, stranger.URL+"/", true)
		tab.fill("eve.js@example.com", "", "", "Hello")
		tab.send()
		tab.waitText("#support-status", "Your message could not be sent.")
		if n, _ := messagesFrom(t, pool, "eve.js@example.com"); n != 0 {
			t.Errorf("stored %d messages, want 0", n)
		}
	})

	t.Run("no JavaScript: problems page, then redirect to thank-you", func(t *testing.T) {
		tab := b.openForm(t, site.URL+"/", false)
		tab.fill("carol@example.com", "Carol <3", "", "   ")
		tab.send()
		tab.waitLocation(s.url + "/support/messages")
		tab.waitBody("Your message was not sent")
		tab.screenshot(filepath.Join(shots, "error.png"))
		if got := tab.text("#message-error"); got != "Message is required" {
			t.Errorf("message field's problem = %q, want Message is required", got)
		}
		if got := tab.value("email"); got != "carol@example.com" {
			t.Errorf("email after the problem page = %q, want what was typed", got)
		}
		if got := tab.value("name"); got != "Carol <3" {
			t.Errorf("name after the problem page = %q, want what was typed", got)
		}
		// Put it right on the service's own page and send again.
		tab.do(chromedp.SendKeys(chromedp.ID("message"), "It broke"))
		tab.send()
		tab.waitLocation(site.URL + "/thanks")
		tab.waitBody("We got your message")
		tab.screenshot(filepath.Join(shots, "thank-you.png"))
		if n, keyed := messagesFrom(t, pool, "carol@example.com"); n != 1 || keyed != 0 {
			t.Errorf("stored %d messages (%d keyed), want 1 plain post", n, keyed)
		}
	})

	t.Run("no JavaScript: a page on an unlisted origin is refused", func(t *testing.T) {
		forbidden := formOutcome(t, s, "forbidden")
		tab := b.openForm(t, stranger.URL+"/", false)
		tab.fill("eve@example.com", "", "", "Hello")
		tab.send()
		tab.waitLocation(s.url + "/support/messages")
		tab.waitBody("this page may not send messages to support")
		if n, _ := messagesFrom(t, pool, "eve@example.com"); n != 0 {
			t.Errorf("stored %d messages, want 0", n)
		}
		if got := formOutcome(t, s, "forbidden"); got != forbidden+1 {
			t.Errorf("forbidden posts = %v, want %v", got, forbidden+1)
		}
	})

	t.Logf("browser test ran in %s", time.Since(began).Round(time.Millisecond))
}

// chromiumPath finds Chromium, or ends the test: a failure under CI=true,
// where the browser test must run, a skip elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "Chromium not found: install it to run the browser test (Debian: apt-get install chromium)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// sitePage is the form as the site embeds it: the service's GET /support
// page posting to the service's absolute URL, with the service's CSP
// widened to let it.
type sitePage struct{ html, csp string }

func embedPage(t *testing.T, serviceURL string) *sitePage {
	t.Helper()
	resp, err := http.Get(serviceURL + "/support")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	html, csp := string(body), resp.Header.Get("Content-Security-Policy")
	for _, r := range []struct {
		s             *string
		old, new, why string
	}{
		{&html, `action="/support/messages"`, `action="` + serviceURL + `/support/messages"`, "form action"},
		{&csp, "connect-src 'self'", "connect-src " + serviceURL, "CSP connect-src"},
		{&csp, "form-action 'self'", "form-action 'self' " + serviceURL, "CSP form-action"},
	} {
		if !strings.Contains(*r.s, r.old) {
			t.Fatalf("GET /support: no %s %q to point at the service", r.why, r.old)
		}
		*r.s = strings.Replace(*r.s, r.old, r.new, 1)
	}
	return &sitePage{html: html, csp: csp}
}

// siteHandler serves the site: the embedded form at /, and /thanks, where
// SUPPORT_FORM_REDIRECT_URL sends a plain post.
func siteHandler(p *atomic.Pointer[sitePage]) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		page := p.Load()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", page.csp)
		_, _ = io.WriteString(w, page.html)
	})
	mux.HandleFunc("GET /thanks", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, `<!doctype html><html lang="en"><title>Thanks</title><h1>Thanks!</h1><p>We got your message and will reply by email.</p></html>`)
	})
	return mux
}

type browser struct{ ctx context.Context }

// startBrowser starts headless Chromium with a fresh profile; the flags
// let it run as root in a container and keep it off the network.
func startBrowser(t *testing.T, path string) *browser {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(900, 1100),
	)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first run starts the browser; it gets no deadline, which would
	// end the browser with it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return &browser{ctx: ctx}
}

type tab struct {
	t   *testing.T
	ctx context.Context
}

// openForm opens a tab, with JavaScript or without, on the page at url
// and waits for its support form.
func (b *browser) openForm(t *testing.T, url string, javascript bool) *tab {
	t.Helper()
	tb := b.tab(t, javascript)
	tb.do(chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("support-form")))
	return tb
}

// send clicks the form's button.
func (tb *tab) send() {
	tb.t.Helper()
	tb.do(chromedp.Click(chromedp.CSS(`button[type="submit"]`)))
}

// tab opens a tab, with JavaScript or without.
func (b *browser) tab(t *testing.T, javascript bool) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(cancelTimeout)
	tb := &tab{t: t, ctx: ctx}
	if !javascript {
		tb.do(chromedp.Func(func(ctx context.Context, target *chromedp.Target) error {
			_, err := cdp.Call(ctx, target, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return err
		}))
	}
	return tb
}

func (tb *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	if err := chromedp.Do(tb.ctx, steps...); err != nil {
		tb.t.Fatal(err)
	}
}

// fill types into the form as a person would; empty fields are skipped.
func (tb *tab) fill(email, name, subject, message string) {
	tb.t.Helper()
	for id, v := range map[string]string{"email": email, "name": name, "subject": subject, "message": message} {
		if v != "" {
			tb.do(chromedp.SendKeys(chromedp.ID(id), v))
		}
	}
}

// doubleClick double-clicks the element as a mouse does: two presses, the
// second with a click count of 2, each of which clicks (chromedp's
// DoubleClick sends only the second, one click).
func (tb *tab) doubleClick(selector string) {
	tb.t.Helper()
	sel, _ := json.Marshal(selector)
	// Both clicks in one task, as the fastest double-click: two mouse
	// events sent over the DevTools protocol are separate round trips, and
	// on a loaded machine the first post's answer (which resets the form)
	// could land between them, so the second click would test nothing.
	if _, err := chromedp.Run(tb.ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`(() => { const b = document.querySelector(%s); b.click(); b.click(); return true; })()`, sel))); err != nil {
		tb.t.Fatalf("double-click %s: %v", selector, err)
	}
}

// waitText waits until the element's text contains want.
func (tb *tab) waitText(selector, want string) {
	tb.t.Helper()
	sel, _ := json.Marshal(selector)
	text, _ := json.Marshal(want)
	expr := fmt.Sprintf(`(document.querySelector(%s) || {textContent: ""}).textContent.includes(%s)`, sel, text)
	if _, err := chromedp.Run(tb.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		var got string
		got, _ = chromedp.Run(tb.ctx, chromedp.TextContent(chromedp.CSS(selector)))
		tb.t.Fatalf("%s never showed %q (it shows %q): %v", selector, want, got, err)
	}
}

// waitLocation waits for the tab to arrive at url, after a form post.
func (tb *tab) waitLocation(url string) {
	tb.t.Helper()
	var loc string
	for tb.ctx.Err() == nil {
		if loc = tb.location(); loc == url {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.t.Fatalf("the tab is at %s, never reached %s", loc, url)
}

// waitBody waits until the page's visible text contains want.
func (tb *tab) waitBody(want string) {
	tb.t.Helper()
	var body string
	for tb.ctx.Err() == nil {
		body, _ = chromedp.Run(tb.ctx, chromedp.Text(chromedp.CSS("body")))
		if strings.Contains(body, want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.t.Fatalf("the page never said %q; it says:\n%s", want, body)
}

func (tb *tab) location() string {
	loc, _ := chromedp.Run(tb.ctx, chromedp.Location())
	return loc
}

func (tb *tab) text(selector string) string {
	tb.t.Helper()
	return mustRun(tb, chromedp.TextContent(chromedp.CSS(selector)))
}

func (tb *tab) value(id string) string {
	tb.t.Helper()
	return mustRun(tb, chromedp.Value(chromedp.ID(id)))
}

func (tb *tab) screenshot(path string) {
	tb.t.Helper()
	if err := os.WriteFile(path, mustRun(tb, chromedp.FullScreenshot(100)), 0o644); err != nil {
		tb.t.Fatal(err)
	}
}

// mustRun runs an action that returns a value, failing the test on an error.
func mustRun[T any](tb *tab, a chromedp.Action[T]) T {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, a)
	if err != nil {
		tb.t.Fatal(err)
	}
	return v
}

// messagesFrom counts the stored messages from email, and those stored
// under an Idempotency-Key.
func messagesFrom(t *testing.T, pool *pgxpool.Pool, email string) (n, keyed int) {
	t.Helper()
	const q = `SELECT count(*), count(*) FILTER (WHERE external_id LIKE 'key:%') FROM support_messages WHERE from_address = $1`
	if err := pool.QueryRow(t.Context(), q, email).Scan(&n, &keyed); err != nil {
		t.Fatal(err)
	}
	return n, keyed
}

// formOutcome reads support_form_submissions_total{outcome} from /metrics.
func formOutcome(t *testing.T, s *service, outcome string) float64 {
	t.Helper()
	prefix := `support_form_submissions_total{outcome="` + outcome + `"} `
	for line := range strings.SplitSeq(metricsText(t, s), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", strings.TrimSpace(prefix))
	return 0
}

// formPosts is the number of form posts the service has answered: the sum
// of support_form_submissions_total over every outcome.
func formPosts(t *testing.T, s *service) float64 {
	t.Helper()
	var sum float64
	for line := range strings.SplitSeq(metricsText(t, s), "\n") {
		if !strings.HasPrefix(line, "support_form_submissions_total{") {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += f
	}
	return sum
}

// waitFormPosts polls /metrics until the service has answered want form
// posts, and fails the test if that takes longer than bound. (A post is
// counted before it is answered, so an answered post is always counted.)
func waitFormPosts(t *testing.T, s *service, want float64, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		got := formPosts(t, s)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the service has answered %v form posts, want %v", bound, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
