package support

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzForm feeds arbitrary form bodies, JSON or urlencoded, through decoding
// and validation: it must never panic, and anything it lets through must be
// storable and safe: a bare address, no line breaks in header-bound fields,
// a message within its limits, valid UTF-8 without NUL.
func FuzzForm(f *testing.F) {
	f.Add([]byte(`{"email":"ada@example.com","name":"Ada","subject":"Hi","message":"Help"}`), true)
	f.Add([]byte(`{"email":"ada@example.com\r\nBcc: x@y.z","message":"m"}`), true)
	f.Add([]byte(`{"email":["a"],"message":{"x":1}}`), true)
	f.Add([]byte(`email=ada%40example.com&name=Ada&subject=Hi&message=Help`), false)
	f.Add([]byte(`email=Ada+%3Cada%40example.com%3E&message=%00`), false)
	f.Add([]byte(`email=a%40b.c&subject=x%0D%0ABcc:+y%40z&message=m`), false)
	f.Fuzz(func(t *testing.T, body []byte, isJSON bool) {
		errs := fieldErrors{}
		decode := decodeForm
		if isJSON {
			decode = decodeJSON
		}
		fm, err := decode(body, errs)
		if err != nil {
			return
		}
		fm = fm.validate(errs)
		if len(errs) > 0 {
			return
		}
		if !bareAddress(fm.Email) {
			t.Fatalf("accepted email %q", fm.Email)
		}
		for name, v := range map[string]string{"email": fm.Email, "name": fm.Name, "subject": fm.Subject} {
			if strings.ContainsAny(v, "\r\n") {
				t.Fatalf("accepted a line break in %s: %q", name, v)
			}
			if OneLine(v) != v {
				t.Fatalf("accepted %s %q, which mail's cleaning would change", name, v)
			}
		}
		if fm.Message == "" || utf8.RuneCountInString(fm.Message) > maxMessage || utf8.RuneCountInString(fm.Subject) > maxSubject {
			t.Fatalf("accepted message of %d and subject of %d characters", utf8.RuneCountInString(fm.Message), utf8.RuneCountInString(fm.Subject))
		}
		for _, v := range []string{fm.Email, fm.Name, fm.Subject, fm.Message} {
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				t.Fatalf("accepted an unstorable value %q", v)
			}
		}
	})
}
