package support

import (
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"html"
	"io"
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
//
// Not html/template: its reflection (text/template calls MethodByName)
// makes the linker keep every exported method of every type in the binary,
// which grew it by 10 MB (go-redis's client alone by 3.6 MB) and the
// service's resident memory with it. The pages are two fixed files whose
// {{name}} places are filled in one pass, every value HTML-escaped but the
// embedded script and style.
type pages struct {
	formHTML, messageHTML string
	script, style         string
	// csp allows exactly the inline script and style below (by hash), posts
	// and fetches to this service, and a redirect to redirectURL.
	csp string
}

func newPages(redirectURL string) *pages {
	read := func(name string) string {
		b, _ := webFiles.ReadFile("web/" + name) // embedded: cannot fail
		return string(b)
	}
	script, style := read("form.js"), read("page.css")
	formAction := "'self'"
	if u, err := url.Parse(redirectURL); err == nil && u.Scheme != "" && u.Host != "" {
		// Browsers apply form-action to the redirect after the post too.
		formAction += " " + u.Scheme + "://" + u.Host
	}
	return &pages{
		formHTML:    read("form.html"),
		messageHTML: read("message.html"),
		script:      script,
		style:       style,
		csp: "default-src 'none'; script-src " + hashSource([]byte(script)) + "; style-src " + hashSource([]byte(style)) +
			"; connect-src 'self'; form-action " + formAction + "; base-uri 'none'; frame-ancestors 'none'",
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

// form writes the support form with status, showing values and, for each
// field in errs, its problem.
func (p *pages) form(w http.ResponseWriter, status int, values form, errs fieldErrors) {
	esc := html.EscapeString
	fill := []string{"{{style}}", p.style, "{{script}}", p.script, "{{action}}", "/support/messages"}
	for _, f := range values.fields() {
		problem, invalid := "", ""
		if text, ok := errs[f.name]; ok {
			problem = fieldLabel(f.name) + " " + text
			invalid = ` aria-invalid="true" aria-describedby="` + f.name + `-error"`
		}
		fill = append(fill,
			"{{max-"+f.name+"}}", strconv.Itoa(f.max),
			"{{value-"+f.name+"}}", esc(*f.value),
			"{{invalid-"+f.name+"}}", invalid,
			"{{problem-"+f.name+"}}", esc(problem))
	}
	var problems strings.Builder
	for _, field := range []string{"email", "name", "subject", "message", headerIdemKey} {
		if text, ok := errs[field]; ok {
			fmt.Fprintf(&problems, `<li><a href="#%s">%s %s</a></li>`, esc(field), esc(fieldLabel(field)), esc(text))
		}
	}
	prefix, list := "", ""
	if problems.Len() > 0 {
		prefix = "Please check your message - "
		list = `<div id="support-problems" class="problems" role="alert" tabindex="-1">
<h2>Your message was not sent</h2>
<ul>` + problems.String() + "</ul>\n</div>"
	}
	fill = append(fill, "{{title-prefix}}", prefix, "{{problems}}", list)
	p.write(w, status, strings.NewReplacer(fill...).Replace(p.formHTML))
}

// message writes a short page: a title and one sentence.
func (p *pages) message(w http.ResponseWriter, status int, title, text string) {
	page := strings.NewReplacer("{{style}}", p.style,
		"{{title}}", html.EscapeString(title), "{{text}}", html.EscapeString(text)).Replace(p.messageHTML)
	p.write(w, status, page)
}

func (p *pages) write(w http.ResponseWriter, status int, page string) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", p.csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, page)
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
