package support_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/support"
)

// browserAccept is what Chromium sends when it navigates, a form post
// included.
const browserAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8"

// webForm is a form on a fresh database, with its own metrics registry.
type webForm struct {
	form *support.Form
	pool *pgxpool.Pool
	reg  *prometheus.Registry
}

func newWebForm(t *testing.T, cfg support.FormConfig) webForm {
	t.Helper()
	wf := webForm{pool: dbtest.NewPool(t), reg: prometheus.NewRegistry()}
	if cfg.Rate == 0 {
		cfg.Rate = 1000
	}
	cfg.DatabaseMaxConns = 4
	cfg.Registerer = wf.reg
	wf.form = support.NewForm(support.NewQueue(wf.pool), cfg)
	return wf
}

func countMessages(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM support_messages`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantCounts checks support_form_submissions_total: each outcome in want
// has its count, every other outcome is 0.
func wantCounts(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "support_form_submissions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 || want[m.GetLabel()[0].GetValue()] != 0 {
				got[m.GetLabel()[0].GetValue()] = v
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("support_form_submissions_total (-want +got):\n%s", diff)
	}
}

// browserPost sends fields as a browser's plain form post does.
func browserPost(t *testing.T, h http.Handler, fields url.Values) *httptest.ResponseRecorder {
	t.Helper()
	return post(t, h, "application/x-www-form-urlencoded", fields.Encode(), "Accept", browserAccept)
}

func TestFormHTMLAnswers(t *testing.T) {
	t.Parallel()
	valid := url.Values{"email": {"ada@example.com"}, "name": {"Ada"}, "message": {"Where is my order?"}}

	t.Run("thank-you page", func(t *testing.T) {
		t.Parallel()
		wf := newWebForm(t, support.FormConfig{})
		w := browserPost(t, wf.form.Submit(), valid)
		if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
			t.Fatalf("status = %d %q, want 200 text/html", w.Code, w.Header().Get("Content-Type"))
		}
		if !strings.Contains(w.Body.String(), "Thank you: your message was received.") {
			t.Errorf("page does not thank the customer:\n%s", w.Body)
		}
		if n := countMessages(t, wf.pool); n != 1 {
			t.Errorf("rows = %d, want 1", n)
		}
		wantCounts(t, wf.reg, map[string]float64{"accepted": 1})
	})

	t.Run("redirect", func(t *testing.T) {
		t.Parallel()
		wf := newWebForm(t, support.FormConfig{RedirectURL: "https://munchable.app/support/thanks"})
		w := browserPost(t, wf.form.Submit(), valid)
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "https://munchable.app/support/thanks" {
			t.Fatalf("status = %d Location %q, want 303 to the redirect URL", w.Code, w.Header().Get("Location"))
		}
		if n := countMessages(t, wf.pool); n != 1 {
			t.Errorf("rows = %d, want 1", n)
		}
	})

	t.Run("problems listed, typed text kept and escaped", func(t *testing.T) {
		t.Parallel()
		wf := newWebForm(t, support.FormConfig{})
		typed := url.Values{
			"email":   {"ada at example.com"},
			"name":    {`<script>alert("x")</script>`},
			"subject": {`"><img src=x onerror=alert(1)>`},
			"message": {"   "},
		}
		w := browserPost(t, wf.form.Submit(), typed)
		if w.Code != http.StatusUnprocessableEntity || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
			t.Fatalf("status = %d %q, want 422 text/html", w.Code, w.Header().Get("Content-Type"))
		}
		page := w.Body.String()
		for _, want := range []string{
			"Email must be a plain email address, such as name@example.com",
			`<span id="message-error" class="error">Message is required</span>`,
			`value="ada at example.com"`,
			`value="&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"`,
			`value="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"`,
			`id="email" name="email" type="email" autocomplete="email" required maxlength="254" value="ada at example.com" aria-invalid="true" aria-describedby="email-error"`,
		} {
			if !strings.Contains(page, want) {
				t.Errorf("422 page lacks %s", want)
			}
		}
		for _, raw := range []string{`<script>alert("x")`, `<img src=x`} {
			if strings.Contains(page, raw) {
				t.Errorf("422 page carries what was typed unescaped: %s", raw)
			}
		}
		if n := countMessages(t, wf.pool); n != 0 {
			t.Errorf("rows = %d, want 0", n)
		}
		wantCounts(t, wf.reg, map[string]float64{"invalid": 1})
	})

	t.Run("JSON clients keep JSON", func(t *testing.T) {
		t.Parallel()
		wf := newWebForm(t, support.FormConfig{RedirectURL: "https://munchable.app/support/thanks"})
		for _, accept := range []string{"", "*/*", "application/json", "application/json, text/html;q=0.5", "text/html, application/json"} {
			w := post(t, wf.form.Submit(), "application/json", `{"email":"ada@example.com","message":"hi"}`, "Accept", accept)
			if w.Code != http.StatusAccepted {
				t.Errorf("Accept %q: status = %d, want 202", accept, w.Code)
				continue
			}
			if got := decodeJSON[map[string]int64](t, w); got["id"] == 0 {
				t.Errorf("Accept %q: answer %s has no id", accept, w.Body)
			}
		}
	})
}

// TestFormHoneypot: a filled honeypot is answered exactly as a success,
// for JSON and for a plain post, stores nothing, and is counted.
func TestFormHoneypot(t *testing.T) {
	t.Parallel()
	wf := newWebForm(t, support.FormConfig{})
	h := wf.form.Submit()

	w := post(t, h, "application/json", `{"email":"bot@example.com","message":"cheap pills","website":"https://spam.example"}`)
	if w.Code != http.StatusAccepted {
		t.Fatalf("JSON: status = %d %s, want 202", w.Code, w.Body)
	}
	if id := decodeJSON[map[string]int64](t, w)["id"]; id <= 0 {
		t.Errorf("JSON: id = %d, want a positive id like a real answer's", id)
	}
	// Bots send whatever shape: a non-string is no less a filled honeypot.
	if w := post(t, h, "application/json", `{"email":"bot@example.com","message":"x","website":1}`); w.Code != http.StatusAccepted {
		t.Errorf("JSON with a number: status = %d, want 202", w.Code)
	}
	w = browserPost(t, h, url.Values{"email": {"bot@example.com"}, "message": {"cheap pills"}, "website": {"https://spam.example"}})
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "Thank you: your message was received.") {
		t.Errorf("form post: status = %d, want the thank-you page:\n%s", w.Code, w.Body)
	}
	if n := countMessages(t, wf.pool); n != 0 {
		t.Errorf("rows = %d after honeypot posts, want 0", n)
	}
	wantCounts(t, wf.reg, map[string]float64{"spam": 3})

	// An empty honeypot is a person.
	w = browserPost(t, h, url.Values{"email": {"ada@example.com"}, "message": {"Help"}, "website": {""}})
	if w.Code != http.StatusOK || countMessages(t, wf.pool) != 1 {
		t.Errorf("empty honeypot: status = %d, rows = %d; want 200 and 1 row", w.Code, countMessages(t, wf.pool))
	}
}

// TestFormHoneypotValidatedFirst: an invalid post with the honeypot filled
// gets the 422 a person's gets, byte for byte, JSON and form post alike:
// answering it as a success would tell the bot the honeypot caught it. It
// is counted as spam all the same.
func TestFormHoneypotValidatedFirst(t *testing.T) {
	t.Parallel()
	wf := newWebForm(t, support.FormConfig{})
	h := wf.form.Submit()
	send := func(html bool, fields map[string]string, header ...string) *httptest.ResponseRecorder {
		t.Helper()
		if html {
			vals := url.Values{}
			for k, v := range fields {
				vals.Set(k, v)
			}
			return post(t, h, "application/x-www-form-urlencoded", vals.Encode(), append([]string{"Accept", browserAccept}, header...)...)
		}
		m := map[string]any{}
		for k, v := range fields {
			m[k] = v
		}
		return postJSON(t, h, m, header...)
	}
	tests := []struct {
		name   string
		html   bool
		fields map[string]string
		header []string
	}{
		{"JSON, email invalid", false, map[string]string{"email": "bot at example.com", "message": "cheap pills"}, nil},
		{"JSON, message missing", false, map[string]string{"email": "bot@example.com"}, nil},
		{"JSON, subject over 300 characters", false, map[string]string{"email": "bot@example.com", "subject": strings.Repeat("s", 301), "message": "cheap pills"}, nil},
		{"JSON, idempotency key too long", false, map[string]string{"email": "bot@example.com", "message": "cheap pills"}, []string{"Idempotency-Key", strings.Repeat("k", 256)}},
		{"form post, email invalid", true, map[string]string{"email": "bot at example.com", "message": "cheap pills"}, nil},
		{"form post, message missing", true, map[string]string{"email": "bot@example.com", "name": "Bot"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			person := send(tc.html, tc.fields, tc.header...)
			bot := map[string]string{"website": "https://spam.example"}
			for k, v := range tc.fields {
				bot[k] = v
			}
			w := send(tc.html, bot, tc.header...)
			if person.Code != http.StatusUnprocessableEntity || w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("status = %d with the honeypot filled, %d without; want 422 for both", w.Code, person.Code)
			}
			if got, want := w.Header().Get("Content-Type"), person.Header().Get("Content-Type"); got != want {
				t.Errorf("Content-Type = %q, want a person's %q", got, want)
			}
			if diff := cmp.Diff(person.Body.String(), w.Body.String()); diff != "" {
				t.Errorf("answer differs from a person's (-person +bot):\n%s", diff)
			}
		})
	}
	if n := countMessages(t, wf.pool); n != 0 {
		t.Errorf("rows = %d, want 0", n)
	}
	wantCounts(t, wf.reg, map[string]float64{"invalid": float64(len(tests)), "spam": float64(len(tests))})
}

// TestFormHoneypotIdempotencyKey: with the honeypot filled, the same
// Idempotency-Key is answered with the same id, as a real repeat is, and
// other keys with other ids, above the latest real one. A plain post is
// answered with the page a person's gets.
func TestFormHoneypotIdempotencyKey(t *testing.T) {
	t.Parallel()
	wf := newWebForm(t, support.FormConfig{})
	h := wf.form.Submit()
	w := postJSON(t, h, map[string]any{"email": "ada@example.com", "message": "Where is my order?"}, "Idempotency-Key", "ada-1")
	if w.Code != http.StatusAccepted {
		t.Fatalf("real post: status = %d %s, want 202", w.Code, w.Body)
	}
	latest := decodeJSON[map[string]int64](t, w)["id"]

	bot := map[string]any{"email": "bot@example.com", "message": "cheap pills", "website": "https://spam.example"}
	spamID := func(header ...string) int64 {
		t.Helper()
		w := postJSON(t, h, bot, header...)
		if w.Code != http.StatusAccepted {
			t.Fatalf("honeypot post: status = %d %s, want 202", w.Code, w.Body)
		}
		return decodeJSON[map[string]int64](t, w)["id"]
	}
	first := spamID("Idempotency-Key", "bot-1")
	if again := spamID("Idempotency-Key", "bot-1"); again != first {
		t.Errorf("the same key answered ids %d and %d, want the first one again as a real repeat gets", first, again)
	}
	ids := map[int64]bool{first: true}
	for i := range 10 {
		ids[spamID("Idempotency-Key", "bot-key-"+strconv.Itoa(i))] = true
	}
	ids[spamID()] = true
	if len(ids) != 12 {
		t.Errorf("twelve keys and a post without one answered %d ids, want each its own as real posts get", len(ids))
	}
	for id := range ids {
		if id <= latest {
			t.Errorf("honeypot id %d, want one above the latest real id %d", id, latest)
		}
	}

	person := browserPost(t, h, url.Values{"email": {"ada@example.com"}, "message": {"Where is my order?"}})
	for range 2 {
		w := post(t, h, "application/x-www-form-urlencoded",
			url.Values{"email": {"bot@example.com"}, "message": {"cheap pills"}, "website": {"https://spam.example"}}.Encode(),
			"Accept", browserAccept, "Idempotency-Key", "bot-html")
		if w.Code != person.Code || w.Header().Get("Content-Type") != person.Header().Get("Content-Type") || w.Body.String() != person.Body.String() {
			t.Errorf("form post: %d %q, want a person's %d %q, the same page", w.Code, w.Header().Get("Content-Type"), person.Code, person.Header().Get("Content-Type"))
		}
	}
	if n := countMessages(t, wf.pool); n != 2 {
		t.Errorf("rows = %d, want the 2 real posts", n)
	}
	wantCounts(t, wf.reg, map[string]float64{"accepted": 2, "spam": 15})
}

// TestFormHoneypotIDsClimb: a bot that mixes caught posts with real ones
// (say, with and without the website field) sees ids that behave as real
// ones do: they only climb, a real post after a caught one gets a higher
// id, no id is answered twice, and the answers have the same shape. On
// main a caught post's id was drawn at random from the window holding the
// latest real id: it went backwards between two caught posts, and below
// the id of the real post before it.
func TestFormHoneypotIDsClimb(t *testing.T) {
	t.Parallel()
	wf := newWebForm(t, support.FormConfig{})
	h := wf.form.Submit()
	person := map[string]any{"email": "ada@example.com", "message": "Where is my order?"}
	bot := map[string]any{"email": "ada@example.com", "message": "Where is my order?", "website": "https://spam.example"}
	var last int64
	seen := map[int64]bool{}
	var shape string
	for i, caught := range []bool{true, false, true, true, false, true, false, false, true, true} {
		fields := person
		if caught {
			fields = bot
		}
		w := postJSON(t, h, fields)
		if w.Code != http.StatusAccepted {
			t.Fatalf("post %d (caught %v): status = %d %s, want 202", i, caught, w.Code, w.Body)
		}
		got := decodeJSON[map[string]int64](t, w)
		id := got["id"]
		if id <= last || seen[id] {
			t.Errorf("post %d (caught %v): id %d after %d, want a new, higher one", i, caught, id, last)
		}
		last, seen[id] = id, true
		s := fmt.Sprintf("%d %s %d", w.Code, w.Header().Get("Content-Type"), len(got))
		if shape != "" && s != shape {
			t.Errorf("post %d (caught %v): answer %q, want the shape %q of the others", i, caught, s, shape)
		}
		shape = s
	}
	if n := countMessages(t, wf.pool); n != 4 {
		t.Errorf("rows = %d, want the 4 real posts", n)
	}
}

func TestFormCORS(t *testing.T) {
	t.Parallel()
	wf := newWebForm(t, support.FormConfig{Origins: []string{"https://munchable.app", " https://www.Munchable.app"}})
	preflight := func(origin string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodOptions, "http://forms.example/support/messages", nil)
		r.Header.Set("Origin", origin)
		r.Header.Set("Access-Control-Request-Method", "POST")
		r.Header.Set("Access-Control-Request-Headers", "content-type,idempotency-key")
		w := httptest.NewRecorder()
		wf.form.Preflight().ServeHTTP(w, r)
		return w
	}
	for _, origin := range []string{"https://munchable.app", "https://www.munchable.app"} {
		w := preflight(origin)
		if w.Code != http.StatusNoContent {
			t.Errorf("preflight from %s: status = %d, want 204", origin, w.Code)
		}
		h := w.Header()
		if got := h.Get("Access-Control-Allow-Origin"); got != origin {
			t.Errorf("preflight from %s: Allow-Origin = %q, want the origin itself", origin, got)
		}
		if got := h.Get("Access-Control-Allow-Methods"); !strings.Contains(got, "POST") {
			t.Errorf("Allow-Methods = %q, want POST", got)
		}
		allowHeaders := strings.ToLower(h.Get("Access-Control-Allow-Headers"))
		for _, want := range []string{"content-type", "idempotency-key"} {
			if !strings.Contains(allowHeaders, want) {
				t.Errorf("Allow-Headers = %q, want %s", allowHeaders, want)
			}
		}
		if s, err := strconv.Atoi(h.Get("Access-Control-Max-Age")); err != nil || s <= 0 {
			t.Errorf("Max-Age = %q, want seconds", h.Get("Access-Control-Max-Age"))
		}
		if !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
			t.Errorf("Vary = %q, want Origin", h.Values("Vary"))
		}
	}
	for _, origin := range []string{"https://evil.example", "https://munchable.app.evil.example", "null", "*"} {
		w := preflight(origin)
		for k := range w.Header() {
			if strings.HasPrefix(k, "Access-Control-") {
				t.Errorf("preflight from %s answered %s: %q", origin, k, w.Header().Get(k))
			}
		}
	}

	// The post from a listed origin carries Allow-Origin, so its script may
	// read the answer.
	w := post(t, wf.form.Submit(), "application/json", `{"email":"ada@example.com","message":"hi"}`, "Origin", "https://munchable.app")
	if w.Code != http.StatusAccepted || w.Header().Get("Access-Control-Allow-Origin") != "https://munchable.app" {
		t.Errorf("post from the site: status = %d, Allow-Origin %q; want 202 and the origin", w.Code, w.Header().Get("Access-Control-Allow-Origin"))
	}

	// No origins configured: no CORS at all, and no * either.
	none := newWebForm(t, support.FormConfig{})
	r := httptest.NewRequest(http.MethodOptions, "http://forms.example/support/messages", nil)
	r.Header.Set("Origin", "https://munchable.app")
	r.Header.Set("Access-Control-Request-Method", "POST")
	w = httptest.NewRecorder()
	none.form.Preflight().ServeHTTP(w, r)
	if got := w.Header().Get("Access-Control-Allow-Origin"); got != "" {
		t.Errorf("without SUPPORT_FORM_ORIGINS: Allow-Origin = %q, want none", got)
	}
}

// TestFormOriginRule: with origins configured, a browser post from any
// other page is refused before it is read; a post naming no page is left
// to the rate limit.
func TestFormOriginRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		origins []string
		header  []string
		want    int
	}{
		{"listed origin", []string{"https://munchable.app"}, []string{"Origin", "https://munchable.app"}, http.StatusAccepted},
		{"listed origin, other case", []string{"https://munchable.app"}, []string{"Origin", "https://Munchable.APP"}, http.StatusAccepted},
		{"other origin", []string{"https://munchable.app"}, []string{"Origin", "https://evil.example"}, http.StatusForbidden},
		{"other port", []string{"https://munchable.app"}, []string{"Origin", "https://munchable.app:8443"}, http.StatusForbidden},
		{"opaque origin", []string{"https://munchable.app"}, []string{"Origin", "null"}, http.StatusForbidden},
		{"empty origin", []string{"https://munchable.app"}, []string{"Origin", ""}, http.StatusForbidden},
		{"Origin outranks Referer", []string{"https://munchable.app"}, []string{"Origin", "https://evil.example", "Referer", "https://munchable.app/help"}, http.StatusForbidden},
		{"Referer on a listed origin", []string{"https://munchable.app"}, []string{"Referer", "https://munchable.app/help?x=1"}, http.StatusAccepted},
		{"Referer on another origin", []string{"https://munchable.app"}, []string{"Referer", "https://evil.example/munchable.app"}, http.StatusForbidden},
		{"this service's own page", []string{"https://munchable.app"}, []string{"Origin", "http://example.com"}, http.StatusAccepted},
		{"neither header", []string{"https://munchable.app"}, nil, http.StatusAccepted},
		{"no origins configured", nil, []string{"Origin", "https://evil.example"}, http.StatusAccepted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wf := newWebForm(t, support.FormConfig{Origins: tc.origins})
			w := post(t, wf.form.Submit(), "application/x-www-form-urlencoded", "email=ada%40example.com&message=hi", tc.header...)
			if w.Code != tc.want {
				t.Fatalf("status = %d %s, want %d", w.Code, w.Body, tc.want)
			}
			wantRows := 0
			if tc.want == http.StatusAccepted {
				wantRows = 1
			} else {
				wantCounts(t, wf.reg, map[string]float64{"forbidden": 1})
			}
			if n := countMessages(t, wf.pool); n != wantRows {
				t.Errorf("rows = %d, want %d", n, wantRows)
			}
		})
	}
}

// TestFormPage checks GET /support against what the page promises: labels
// tied to inputs, the server's limits as maxlength, no external asset, and
// a Content-Security-Policy that allows its own inline script and style by
// hash and nothing else.
func TestFormPage(t *testing.T) {
	t.Parallel()
	f := support.NewForm(nil, support.FormConfig{Rate: 1, RedirectURL: "https://munchable.app/thanks"})
	w := httptest.NewRecorder()
	f.Page().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/support", nil))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("status = %d %q, want 200 text/html", w.Code, w.Header().Get("Content-Type"))
	}
	page := w.Body.String()

	for _, field := range []struct {
		id, maxlength string
		required      bool
	}{{"email", "254", true}, {"name", "200", false}, {"subject", "300", false}, {"message", "20000", true}} {
		if !strings.Contains(page, `<label for="`+field.id+`">`) {
			t.Errorf("no label for %s", field.id)
		}
		input := regexp.MustCompile(`<(input|textarea) id="` + field.id + `"[^>]*>`).FindString(page)
		if !strings.Contains(input, `name="`+field.id+`"`) || !strings.Contains(input, `maxlength="`+field.maxlength+`"`) {
			t.Errorf("%s: %s, want name and maxlength %s", field.id, input, field.maxlength)
		}
		if strings.Contains(input, " required") != field.required {
			t.Errorf("%s: %s, want required = %v", field.id, input, field.required)
		}
	}
	if !strings.Contains(page, `<form id="support-form" method="post" action="/support/messages"`) {
		t.Error("the form does not post to /support/messages without JavaScript")
	}
	if !regexp.MustCompile(`<p class="website" aria-hidden="true">\s*<label for="website">[^<]*</label>\s*<input id="website" name="website" type="text" tabindex="-1" autocomplete="off">`).MatchString(page) {
		t.Error("the honeypot is not hidden from people and assistive technology")
	}
	if regexp.MustCompile(`(src|href)="?(https?:)?//`).MatchString(page) {
		t.Error("the page loads an external asset")
	}

	csp := w.Header().Get("Content-Security-Policy")
	script := regexp.MustCompile(`(?s)<script>(.*)</script>`).FindStringSubmatch(page)
	style := regexp.MustCompile(`(?s)<style>(.*)</style>`).FindStringSubmatch(page)
	if script == nil || style == nil {
		t.Fatal("page has no inline script or style")
	}
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	want := "default-src 'none'; script-src " + hash(script[1]) + "; style-src " + hash(style[1]) +
		"; connect-src 'self'; form-action 'self' https://munchable.app; base-uri 'none'; frame-ancestors 'none'"
	if csp != want {
		t.Errorf("Content-Security-Policy:\n got %s\nwant %s", csp, want)
	}
}
