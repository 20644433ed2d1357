package support

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

//go:embed web
var webFiles embed.FS

// pages renders the form's HTML: the page itself (GET /support), the same
// page again with the problems of a refused post, and the short pages of a
// plain form post's other answers.
type pages struct {
	tmpl   *template.Template
	script template.JS
	style  template.CSS
	// csp allows exactly the inline script and style below (by hash), posts
	// and fetches to this service, and a redirect to redirectURL.
	csp    string
	logger *slog.Logger
}

func newPages(redirectURL string, logger *slog.Logger) *pages {
	script, _ := webFiles.ReadFile("web/form.js") // embedded: cannot fail
	style, _ := webFiles.ReadFile("web/page.css")
	formAction := "'self'"
	if u, err := url.Parse(redirectURL); err == nil && u.Scheme != "" && u.Host != "" {
		// Browsers apply form-action to the redirect after the post too.
		formAction += " " + u.Scheme + "://" + u.Host
	}
	return &pages{
		tmpl:   template.Must(template.ParseFS(webFiles, "web/page.html")),
		script: template.JS(script),
		style:  template.CSS(style),
		csp: "default-src 'none'; script-src " + hashSource(script) + "; style-src " + hashSource(style) +
			"; connect-src 'self'; form-action " + formAction + "; base-uri 'none'; frame-ancestors 'none'",
		logger: logger,
	}
}

func hashSource(b []byte) string {
	sum := sha256.Sum256(b)
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// fieldLabel names a field in the list of problems as the page's script
// does.
func fieldLabel(field string) string {
	switch field {
	case "email", "name", "subject", "message":
		return strings.ToUpper(field[:1]) + field[1:]
	}
	return field
}

// formPage is what the form template shows.
type formPage struct {
	Action string
	Values form
	Max    struct{ Email, Name, Subject, Message int }
	Errors []fieldProblem
	Script template.JS
	Style  template.CSS
	errs   fieldErrors
}

type fieldProblem struct{ Field, Label, Problem string }

// Problem says what is wrong with field ("Message is required"), "" when
// nothing is.
func (p formPage) Problem(field string) string {
	if problem, ok := p.errs[field]; ok {
		return fieldLabel(field) + " " + problem
	}
	return ""
}

// form writes the support form with status, showing values and, for each
// field in errs, its problem.
func (p *pages) form(w http.ResponseWriter, status int, values form, errs fieldErrors) {
	data := formPage{Action: "/support/messages", Values: values, Script: p.script, Style: p.style, errs: errs}
	data.Max.Email, data.Max.Name, data.Max.Subject, data.Max.Message = maxEmail, maxName, maxSubject, maxMessage
	for _, field := range []string{"email", "name", "subject", "message", headerIdemKey} {
		if problem, ok := errs[field]; ok {
			data.Errors = append(data.Errors, fieldProblem{Field: field, Label: fieldLabel(field), Problem: problem})
		}
	}
	p.render(w, status, "form", data)
}

// message writes a short page: a title and one sentence.
func (p *pages) message(w http.ResponseWriter, status int, title, text string) {
	p.render(w, status, "message", struct {
		Title, Text string
		Style       template.CSS
	}{title, text, p.style})
}

func (p *pages) render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := p.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
		p.logger.Error("support form: render page failed", "template", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", p.csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// Texts of the pages a plain form post gets back.
const (
	thanksTitle = "Message received"
	thanksText  = "Thank you: your message was received. We will reply by email."
)

// wantsHTML reports whether the client prefers text/html to JSON, as a
// browser's plain form post does. A client that names neither, or likes
// both as much, gets JSON: what every client got before the HTML answers.
func wantsHTML(r *http.Request) bool {
	// A media range named outright outranks */* (RFC 9110, 12.5.1).
	var html, json, wildcard float64
	jsonNamed := false
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if v, ok := params["q"]; ok {
			if q, err = strconv.ParseFloat(v, 64); err != nil {
				continue
			}
		}
		switch mt {
		case "text/html", "application/xhtml+xml":
			html = max(html, q)
		case "application/json":
			json, jsonNamed = max(json, q), true
		case "*/*":
			wildcard = max(wildcard, q)
		}
	}
	if !jsonNamed {
		json = wildcard
	}
	return html > json
}
