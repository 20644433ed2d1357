package resendhook

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// TestReadAnswerFixture: the documented answer reads as encoding/json
// reads it.
func TestReadAnswerFixture(t *testing.T) {
	b, err := os.ReadFile("../../testdata/resend/received_email.json")
	if err != nil {
		t.Fatal(err)
	}
	var want receivedEmail
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	var parts struct{ HTML, Text string }
	if err := json.Unmarshal(b, &parts); err != nil {
		t.Fatal(err)
	}
	want.HTML, want.Text = parts.HTML, parts.Text
	got, err := readAnswer(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.email); diff != "" {
		t.Errorf("email (-want +got):\n%s", diff)
	}
	if got.textCut() || got.htmlCut() || len(got.skipped) != 0 {
		t.Errorf("cut text %v, html %v, skipped %q; want none", got.textCut(), got.htmlCut(), got.skipped)
	}
}

func TestReadAnswer(t *testing.T) {
	big := strings.Repeat("a", maxPartBytes+10)
	tests := []struct {
		name             string
		in               string
		text, html, id   string
		dmarc            string
		textCut, htmlCut bool
		skipped          []string
		err              bool
	}{
		{name: "escapes", in: `{"id":"e1","text":"a\"b\\c\/d\n\u00e9\ud83d\ude00\ud800x","html":null}`,
			id: "e1", text: "a\"b\\c/d\né\U0001F600\uFFFDx"},
		{name: "empty object", in: ` { } `},
		{name: "text cut", in: `{"text":"` + big + `","id":"e2"}`, id: "e2", text: big[:maxPartBytes], textCut: true},
		{name: "cut between characters", in: `{"html":"` + strings.Repeat("é", maxPartBytes/2+1) + `"}`,
			html: strings.Repeat("é", maxPartBytes/2), htmlCut: true},
		{name: "field over the cap skipped", in: `{"headers":{"x":"` + strings.Repeat("h", maxFieldsBytes) + `"},"id":"e3","subject":"s"}`,
			id: "e3", skipped: []string{"headers"}},
		{name: "shared cap full, decision fields kept", in: `{"headers":{"x":"` + strings.Repeat("h", maxFieldsBytes-30) + `"},` +
			`"subject":"over what is left","authentication":{"dmarc":"fail"},"reply_to":["a@b.c"],"id":"e8"}`,
			id: "e8", dmarc: "fail", skipped: []string{"subject"}},
		{name: "decision field over its own cap skipped", in: `{"id":"e9","reply_to":["` + strings.Repeat("r", maxDecisionBytes) + `"]}`,
			id: "e9", skipped: []string{"reply_to"}},
		{name: "decision field twice shares its cap", in: `{"id":"e10","reply_to":"` + strings.Repeat("r", maxDecisionBytes/2) +
			`","reply_to":"` + strings.Repeat("r", maxDecisionBytes/2) + `"}`, id: "e10", skipped: []string{"reply_to"}},
		{name: "nested values kept", in: `{"id":"e4","reply_to":["a@b.c"],"headers":{"references":["<a>","<b>"],"x":{"y":[1,2,{"z":"]}"}]}}}`, id: "e4"},
		{name: "invalid UTF-8 field name (found by FuzzReadAnswer)", in: "{\"id\":\"e7\",\"\x80\":{}}", id: "e7"},
		{name: "truncated", in: `{"id":"e5","text":"abc`, err: true},
		{name: "not an object", in: `[]`, err: true},
		{name: "raw control character", in: "{\"text\":\"a\nb\"}", err: true},
		{name: "bad field value", in: `{"id":"e6","subject":{]}`, err: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAnswer(strings.NewReader(tc.in))
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if err != nil {
				return
			}
			type result struct {
				ID, Text, HTML, DMARC string
				TextCut, HTMLCut      bool
				Skipped               []string
			}
			var dmarc string
			if got.email.Authentication != nil {
				dmarc = got.email.Authentication.DMARC
			}
			want := result{tc.id, tc.text, tc.html, tc.dmarc, tc.textCut, tc.htmlCut, tc.skipped}
			have := result{got.email.ID, got.email.Text, got.email.HTML, dmarc, got.textCut(), got.htmlCut(), got.skipped}
			if diff := cmp.Diff(want, have); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadAnswerEarlyError: an answer broken off mid-way is the reader's
// error, not a half email.
func TestReadAnswerEarlyError(t *testing.T) {
	boom := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader(`{"id":"e","text":"abc`), iotestErr{boom})
	if _, err := readAnswer(r); !errors.Is(err, boom) {
		t.Errorf("err = %v, want %v", err, boom)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// FuzzReadAnswer: readAnswer never panics, and on a well-formed answer
// whose parts are valid UTF-8 (escapes aside) under the cap it reads the
// parts exactly as encoding/json does.
func FuzzReadAnswer(f *testing.F) {
	if b, err := os.ReadFile("../../testdata/resend/received_email.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"id":"e","text":"a\u00e9\ud83d\ude00\"","html":"<p>\/x<\/p>","headers":{"a":["b"]}}`))
	f.Add([]byte(`{"text":null,"html":"\ud800","x":[1,{"y":"}"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := readAnswer(strings.NewReader(string(body)))
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil {
			return
		}
		for _, part := range []struct {
			name string
			got  string
		}{{"text", got.email.Text}, {"html", got.email.HTML}} {
			raw, ok := fields[part.name]
			var want string
			// Invalid UTF-8 is kept as it came (clean replaces it before
			// the insert), where encoding/json replaces each bad byte.
			if !ok || !utf8.Valid(raw) || json.Unmarshal(raw, &want) != nil || len(want) > maxPartBytes {
				continue
			}
			if err != nil {
				t.Fatalf("readAnswer: %v, where encoding/json reads the object", err)
			}
			if part.got != want {
				t.Errorf("%s = %q, encoding/json reads %q", part.name, part.got, want)
			}
		}
	})
}
