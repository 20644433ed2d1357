package resendhook

import (
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHTMLToText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, html, want string
	}{
		{"paragraphs", "<p>Hello,</p><p>second   paragraph</p>", "Hello,\n\nsecond paragraph"},
		{"line breaks", "one<br>two<br/>three", "one\ntwo\nthree"},
		{"entities", "fish &amp; chips &lt;3 caf&eacute; &#x263A;&nbsp;!", "fish & chips <3 café ☺ !"},
		{"inline tags keep words whole", "H<b>ell</b>o <a href=\"https://x.example/?a=1&amp;b=2\">there</a>", "Hello there"},
		{"scripts, styles and head dropped", "<html><head><title>T</title><style>p{color:red}</style></head>" +
			"<body><script>alert('<p>no</p>')</script>Body</body></html>", "Body"},
		{"comments dropped", "a<!-- <p>hidden</p> -->b", "ab"},
		{"quoted > in an attribute", `<img alt="a > b">text`, "text"},
		{"table cells", "<table><tr><td>Qty</td><td>2</td></tr><tr><td>Total</td><td>9</td></tr></table>", "Qty 2\nTotal 9"},
		{"blank lines collapse", "<div>a</div>\n\n\n\n<div>b</div>", "a\n\nb"},
		{"white space trimmed", "  \n\t <p>  x  </p> \n ", "x"},
		{"unclosed markup", "<div><p>still <b>text", "still text"},
		{"plain text", "no markup at all", "no markup at all"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := htmlToText(tc.html); got != tc.want {
				t.Errorf("htmlToText(%q) = %q, want %q", tc.html, got, tc.want)
			}
		})
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		want   time.Time
		wantOK bool
	}{
		{"2026-02-22T23:41:11.894719+00:00", time.Date(2026, 2, 22, 23, 41, 11, 894719000, time.UTC), true},
		{"2026-02-22T23:41:12.126Z", time.Date(2026, 2, 22, 23, 41, 12, 126000000, time.UTC), true},
		{"2026-02-22T23:41:12Z", time.Date(2026, 2, 22, 23, 41, 12, 0, time.UTC), true},
		{"2026-02-23T01:41:12+02:00", time.Date(2026, 2, 22, 23, 41, 12, 0, time.UTC), true},
		{"2026-02-22 23:41:11.894719+00", time.Date(2026, 2, 22, 23, 41, 11, 894719000, time.UTC), true},
		{"2026-02-22 23:41:11.894719+00:00", time.Date(2026, 2, 22, 23, 41, 11, 894719000, time.UTC), true},
		{"2026-02-22T23:41:11.894719+00", time.Date(2026, 2, 22, 23, 41, 11, 894719000, time.UTC), true},
		{"", time.Time{}, false},
		{"yesterday", time.Time{}, false},
	}
	for _, tc := range tests {
		got, ok := parseTime(tc.in)
		if ok != tc.wantOK || !got.Equal(tc.want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestReceivedAtFallsBackToNow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	if got := receivedAt(now, "", "garbage"); !got.Equal(now) {
		t.Errorf("receivedAt with nothing parseable = %v, want now %v", got, now)
	}
}

// TestAPIBase: resend-go resolves "emails/receiving/{id}" against BaseURL,
// which must therefore end in a slash to keep a path prefix.
func TestAPIBase(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
	}{
		{"https://api.resend.com", "https://api.resend.com/emails/receiving/abc"},
		{"https://api.resend.com/", "https://api.resend.com/emails/receiving/abc"},
		{"http://127.0.0.1:8025/resend", "http://127.0.0.1:8025/resend/emails/receiving/abc"},
		{"http://127.0.0.1:8025/resend/", "http://127.0.0.1:8025/resend/emails/receiving/abc"},
	}
	for _, tc := range tests {
		in, err := url.Parse(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		u, err := apiBase(in).Parse("emails/receiving/abc")
		if err != nil {
			t.Fatal(err)
		}
		if got := u.String(); got != tc.want {
			t.Errorf("apiBase(%q) resolves the email to %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestAddrList(t *testing.T) {
	t.Parallel()
	tests := []struct {
		json string
		want addrList
	}{
		{`["a@x.example", "B <B@Y.example>"]`, addrList{"a@x.example", "b@y.example"}},
		{`"a@x.example, B <b@y.example>"`, addrList{"a@x.example", "b@y.example"}},
		{`"<odd@x.example"`, addrList{"odd@x.example"}},
		{`null`, nil},
		{`[]`, nil},
		{`[42, "a@x.example", {"email": "b@y.example"}]`, addrList{"a@x.example"}},
		{`{"unexpected": "object"}`, nil},
		{`7`, nil},
	}
	for _, tc := range tests {
		var got addrList
		if err := json.Unmarshal([]byte(tc.json), &got); err != nil {
			t.Errorf("decode %s: %v, want no error (recipients are read defensively)", tc.json, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("decode %s (-want +got):\n%s", tc.json, diff)
		}
	}
}

func TestInboundMatch(t *testing.T) {
	t.Parallel()
	in, bad := ParseInbound([]string{" Support@Munchable.app ", "@Inbound.Munchable.app"})
	if len(bad) != 0 {
		t.Fatalf("refused %q", bad)
	}
	tests := []struct {
		recipients []string
		want       string
		wantOK     bool
	}{
		{[]string{"support@munchable.app"}, "support@munchable.app", true},
		{[]string{"other@munchable.app", "x@inbound.munchable.app"}, "x@inbound.munchable.app", true},
		{[]string{"x@sub.inbound.munchable.app"}, "", false},
		{[]string{"x@evilinbound.munchable.app"}, "", false},
		{[]string{"support@munchable.app.evil.example"}, "", false},
		{[]string{"inbound.munchable.app"}, "", false},
		{nil, "", false},
	}
	for _, tc := range tests {
		got, ok := in.match(tc.recipients)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("match(%q) = %q, %v; want %q, %v", tc.recipients, got, ok, tc.want, tc.wantOK)
		}
	}
	for _, entry := range []string{"", "support", "a@b@c", "@", "sup port@x.example"} {
		if _, bad := ParseInbound([]string{"ok@x.example", entry}); len(bad) != 1 || bad[0] != entry {
			t.Errorf("ParseInbound(%q) refused %q, want exactly that entry", entry, bad)
		}
	}
}
