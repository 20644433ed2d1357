package resendhook

import (
	"strings"

	"golang.org/x/net/html"
)

// skipped reports whether an element's content is not the mail's text.
func skipped(tag string) bool {
	switch tag {
	case "head", "title", "script", "style", "template", "noscript", "svg":
		return true
	}
	return false
}

// breakAt says how an element's tags break the text: a paragraph (an empty
// line), a line, a space between table cells, or nothing for inline
// elements ("H<b>ello</b>" stays one word).
func breakAt(tag string) string {
	switch tag {
	case "p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "table", "ul", "ol", "pre", "hr":
		return "\n\n"
	case "div", "li", "tr", "section", "article", "header", "footer", "dd", "dt":
		return "\n"
	case "td", "th":
		return " "
	}
	return ""
}

// textBuilder accumulates text; breaks do not pile up, so nested blocks
// ("<div><p>") make one break, not several.
type textBuilder struct {
	strings.Builder
}

func (b *textBuilder) breakWith(sep string) {
	if sep == "" || strings.HasSuffix(b.String(), sep) {
		return
	}
	if sep == "\n\n" && strings.HasSuffix(b.String(), "\n") {
		sep = "\n"
	}
	b.WriteString(sep)
}

// htmlToText renders an HTML body as plain text, for mail that came without
// a text part: tags dropped, the content of scripts, styles and the head
// dropped, entities decoded, block elements as line breaks, white space
// collapsed. It uses x/net/html's tokenizer rather than a hand-written
// stripper: mail HTML is rarely well formed, and a tokenizer gets comments,
// quoted ">" in attributes and raw-text elements right.
func htmlToText(s string) string {
	z := html.NewTokenizer(strings.NewReader(s))
	var b textBuilder
	skip := 0
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken: // io.EOF, or input the tokenizer gives up on
			return collapse(b.String())
		case html.TextToken:
			if skip == 0 {
				b.Write(z.Text()) // Text unescapes entities
			}
		case html.StartTagToken, html.SelfClosingTagToken, html.EndTagToken:
			raw, _ := z.TagName()
			name := string(raw)
			switch {
			case skipped(name) && tt == html.StartTagToken:
				skip++
			case skipped(name) && tt == html.EndTagToken && skip > 0:
				skip--
			}
			if name == "br" {
				b.WriteByte('\n') // each <br> is a line of its own, empty or not
				continue
			}
			b.breakWith(breakAt(name))
		}
	}
}

// collapse trims every line, collapses runs of white space within a line to
// one space, and keeps at most one empty line between paragraphs.
func collapse(s string) string {
	var out []string
	blank := false
	for line := range strings.SplitSeq(s, "\n") {
		// Fields splits on Unicode white space, &nbsp; (U+00A0) included.
		line = strings.Join(strings.Fields(line), " ")
		if line == "" {
			blank = len(out) > 0
			continue
		}
		if blank {
			out = append(out, "")
			blank = false
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}
