package resendhook

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Bounds on the Resend API's answer for one email. Anyone can mail
// support, so a mail's parts are as large as its sender likes: the answer
// is read as a stream, and a mail costs memory of the order of these caps,
// never of the mail.
const (
	// maxPartBytes caps each stored body, text and HTML. With
	// html_format=cid inline images are attachments, so real mail stays far
	// below; a longer part is cut at a character boundary.
	maxPartBytes = 2 << 20
	// maxFieldsBytes caps everything else in the answer together (headers,
	// addresses, subject), as raw JSON, the fields a decision rests on
	// aside. A field that would pass the cap is skipped, and the mail is
	// queued without it.
	maxFieldsBytes = 1 << 20
	// maxDecisionBytes caps each field a decision rests on (decides) on
	// its own, outside maxFieldsBytes: the sender can make headers, To and
	// Cc as large as they like, and a field that comes after them in the
	// answer must not be crowded out. A field over it is skipped too.
	maxDecisionBytes = 64 << 10
	// maxKeyBytes is the longest field name read; a longer one is skipped
	// with its value.
	maxKeyBytes = 256
)

// decides reports whether the answer's field name is one a decision rests
// on: which email it is (id), who sent it (from) and whether that is
// proven (authentication: the thread rule), its Message-ID, where answers
// go (reply_to, also a thread's participant) and what it carries
// (attachments). Each is read within maxDecisionBytes of its own.
// In-Reply-To and References are headers, which share maxFieldsBytes:
// headers skipped, the mail answers nothing and starts its own thread,
// which is the safe side of the thread rule.
func decides(name string) bool {
	switch name {
	case "id", "from", "authentication", "message_id", "reply_to", "attachments":
		return true
	}
	return false
}

// answer is an email read from the API within the bounds above: the email,
// the full sizes of its parts (to tell a cut) and the fields skipped.
type answer struct {
	email     receivedEmail
	textBytes int64
	htmlBytes int64
	skipped   []string
	// kept is the bytes the answer keeps: both parts and the raw fields.
	kept int64
}

// textCut and htmlCut report whether a part was longer than was kept.
func (a answer) textCut() bool { return a.textBytes > int64(len(a.email.Text)) }
func (a answer) htmlCut() bool { return a.htmlBytes > int64(len(a.email.HTML)) }

// skippedField reports whether a field called name was skipped (any time
// it came, if it came more than once).
func (a answer) skippedField(name string) bool { return slices.Contains(a.skipped, name) }

// readAnswer reads a Retrieve Received Email answer
// (https://resend.com/docs/api-reference/emails/retrieve-received-email)
// from r. The top-level object is walked field by field: "text" and "html"
// are decoded as they stream in and kept up to maxPartBytes; every other
// field is kept as raw JSON, each field a decision rests on while it
// stays under maxDecisionBytes, the others while together they stay under
// maxFieldsBytes, then decoded into receivedEmail as before. A malformed
// answer is an error, as it was with encoding/json.
func readAnswer(r io.Reader) (answer, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var a answer
	if err := expect(br, '{'); err != nil {
		return answer{}, err
	}
	fields := bytes.NewBufferString("{")
	// used is what each budget holds of fields, as written there (comma
	// and name included): the shared one under "", each decision field's
	// own under its name, so a name that comes twice shares its budget.
	used := map[string]int{}
	for first := true; ; first = false {
		c, err := nextByte(br)
		if err != nil {
			return answer{}, err
		}
		if c == '}' && first {
			break
		}
		if !first {
			if c == '}' {
				break
			}
			if c != ',' {
				return answer{}, fmt.Errorf("answer: want ',' or '}', got %q", c)
			}
			if c, err = nextByte(br); err != nil {
				return answer{}, err
			}
		}
		if c != '"' {
			return answer{}, fmt.Errorf("answer: want a field name, got %q", c)
		}
		key := &capped{limit: maxKeyBytes}
		if err := readString(br, key); err != nil {
			return answer{}, err
		}
		if err := expect(br, ':'); err != nil {
			return answer{}, err
		}
		name := string(key.buf)
		switch {
		case key.total > maxKeyBytes:
			a.skipped = append(a.skipped, name+"...")
			if err := skipValue(br, &capped{}); err != nil {
				return answer{}, err
			}
		case name == "text" || name == "html":
			s, total, err := readPart(br)
			if err != nil {
				return answer{}, fmt.Errorf("answer: %s: %w", name, err)
			}
			if name == "text" {
				a.email.Text, a.textBytes = s, total
			} else {
				a.email.HTML, a.htmlBytes = s, total
			}
		default:
			budget, limit := "", maxFieldsBytes
			if decides(name) {
				budget, limit = name, maxDecisionBytes
			}
			raw := &capped{limit: max(limit-used[budget], 0)}
			if err := skipValue(br, raw); err != nil {
				return answer{}, err
			}
			if raw.total > int64(raw.limit) {
				a.skipped = append(a.skipped, name)
				continue
			}
			start := fields.Len()
			if fields.Len() > 1 {
				fields.WriteByte(',')
			}
			quoted, _ := json.Marshal(name) // a string always marshals
			fields.Write(quoted)
			fields.WriteByte(':')
			fields.Write(raw.buf)
			used[budget] += fields.Len() - start
		}
	}
	fields.WriteByte('}')
	if err := json.Unmarshal(fields.Bytes(), &a.email); err != nil {
		return answer{}, fmt.Errorf("answer: %w", err)
	}
	a.kept = int64(len(a.email.Text) + len(a.email.HTML) + fields.Len())
	return a, nil
}

// readPart reads a part's value, a string or null, and returns it cut to
// maxPartBytes at a character boundary, with its full length.
func readPart(br *bufio.Reader) (string, int64, error) {
	c, err := nextByte(br)
	if err != nil {
		return "", 0, err
	}
	if c != '"' {
		// null, or something else the API should not send: kept as no part
		// when it is small, an error when it does not parse.
		if err := br.UnreadByte(); err != nil {
			return "", 0, err
		}
		raw := &capped{limit: maxKeyBytes}
		if err := skipValue(br, raw); err != nil {
			return "", 0, err
		}
		return "", 0, nil
	}
	part := &capped{limit: maxPartBytes + utf8.UTFMax}
	if err := readString(br, part); err != nil {
		return "", 0, err
	}
	s, _ := cutAt(string(part.buf), maxPartBytes)
	return s, part.total, nil
}

// cutAt cuts s to at most n bytes at a character boundary, and reports
// whether it did.
func cutAt(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// capped keeps the first limit bytes written to it and counts them all.
type capped struct {
	limit int
	buf   []byte
	total int64
}

func (c *capped) WriteByte(b byte) error {
	if len(c.buf) < c.limit {
		c.buf = append(c.buf, b)
	}
	c.total++
	return nil
}

var errTruncated = errors.New("answer ends early")

// nextByte returns the next byte that is not JSON white space.
func nextByte(br *bufio.Reader) (byte, error) {
	for {
		c, err := br.ReadByte()
		if err != nil {
			return 0, eofIsTruncated(err)
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c, nil
	}
}

func eofIsTruncated(err error) error {
	if errors.Is(err, io.EOF) {
		return errTruncated
	}
	return err
}

func expect(br *bufio.Reader, want byte) error {
	c, err := nextByte(br)
	if err != nil {
		return err
	}
	if c != want {
		return fmt.Errorf("answer: want %q, got %q", want, c)
	}
	return nil
}

// readString decodes a JSON string whose opening quote has been read into
// w, escapes resolved, as it streams in.
func readString(br *bufio.Reader, w io.ByteWriter) error {
	var u8 [utf8.UTFMax]byte
	for {
		c, err := br.ReadByte()
		if err != nil {
			return eofIsTruncated(err)
		}
		switch {
		case c == '"':
			return nil
		case c < 0x20:
			return fmt.Errorf("answer: control character %#x in a string", c)
		case c != '\\':
			if err := w.WriteByte(c); err != nil {
				return err
			}
			continue
		}
		e, err := br.ReadByte()
		if err != nil {
			return eofIsTruncated(err)
		}
		var r rune
		switch e {
		case '"', '\\', '/':
			r = rune(e)
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			if r, err = readHex4(br); err != nil {
				return err
			}
			if utf16.IsSurrogate(r) {
				r = lowSurrogate(br, r)
			}
		default:
			return fmt.Errorf("answer: bad escape \\%c", e)
		}
		for _, b := range u8[:utf8.EncodeRune(u8[:], r)] {
			if err := w.WriteByte(b); err != nil {
				return err
			}
		}
	}
}

// lowSurrogate completes the surrogate pair that high begins, when a
// "\uDC00".."\uDFFF" escape follows; else the pair is broken and reads as
// U+FFFD, as encoding/json reads it.
func lowSurrogate(br *bufio.Reader, high rune) rune {
	next, err := br.Peek(6)
	if err != nil || next[0] != '\\' || next[1] != 'u' {
		return utf8.RuneError
	}
	low, err := strconv.ParseUint(string(next[2:6]), 16, 16)
	if err != nil {
		return utf8.RuneError
	}
	r := utf16.DecodeRune(high, rune(low))
	if r == utf8.RuneError {
		return r
	}
	_, _ = br.Discard(6)
	return r
}

func readHex4(br *bufio.Reader) (rune, error) {
	var h [4]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, eofIsTruncated(err)
	}
	v, err := strconv.ParseUint(string(h[:]), 16, 16)
	if err != nil {
		return 0, fmt.Errorf("answer: bad \\u escape %q", h[:])
	}
	return rune(v), nil
}

// skipValue copies one JSON value, raw, to w: a string, an object or array
// (nesting tracked, strings inside skipped whole), or a literal. Only its
// extent is checked here; json.Unmarshal checks what is kept.
func skipValue(br *bufio.Reader, w io.ByteWriter) error {
	c, err := nextByte(br)
	if err != nil {
		return err
	}
	switch c {
	case '"':
		_ = w.WriteByte(c)
		return copyString(br, w)
	case '{', '[':
		_ = w.WriteByte(c)
		for depth := 1; depth > 0; {
			c, err := br.ReadByte()
			if err != nil {
				return eofIsTruncated(err)
			}
			_ = w.WriteByte(c)
			switch c {
			case '"':
				if err := copyString(br, w); err != nil {
					return err
				}
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
		}
		return nil
	case '}', ']', ',', ':':
		return fmt.Errorf("answer: want a value, got %q", c)
	}
	_ = w.WriteByte(c)
	for {
		c, err := br.ReadByte()
		if err != nil {
			return eofIsTruncated(err)
		}
		switch c {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return br.UnreadByte()
		}
		_ = w.WriteByte(c)
	}
}

// copyString copies the rest of a raw JSON string, escapes as they are,
// through its closing quote.
func copyString(br *bufio.Reader, w io.ByteWriter) error {
	for {
		c, err := br.ReadByte()
		if err != nil {
			return eofIsTruncated(err)
		}
		_ = w.WriteByte(c)
		switch c {
		case '"':
			return nil
		case '\\':
			e, err := br.ReadByte()
			if err != nil {
				return eofIsTruncated(err)
			}
			_ = w.WriteByte(e)
		}
	}
}
