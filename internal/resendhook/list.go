package resendhook

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"
)

// listCaps bound what a page of a Resend list (an attachment list, a page
// of received emails) keeps: the page is read as a stream, so a page
// costs memory of the order of these caps, never of what the sender put
// in a filename or a Cc.
type listCaps struct {
	// str is the most kept of a string value (decoded); a longer one is
	// cut at a character boundary and marked cut.
	str int
	// raw is the most kept of any other value (raw JSON); a longer one is
	// dropped and marked cut.
	raw int
	// page is the most kept of the whole page: a field past it is dropped
	// and marked cut.
	page int
}

// listField is one field of a listed object.
type listField struct {
	// str is a string value, decoded, cut to listCaps.str.
	str string
	// raw is any other value as raw JSON; nil when dropped.
	raw json.RawMessage
	// cut: the value was longer than what is kept.
	cut bool
}

// listObject is one object of a list's data, by field name.
type listObject map[string]listField

// string returns the named string field and whether it was cut.
func (o listObject) string(name string) (string, bool) {
	f := o[name]
	return f.str, f.cut
}

// readList reads one page of a Resend list
// (https://resend.com/docs/api-reference/pagination: object, has_more,
// data) from r, calling each for every object of data as it is read. It
// returns has_more and the bytes kept of the page.
func readList(r io.Reader, caps listCaps, each func(listObject) error) (hasMore bool, kept int, err error) {
	br := bufio.NewReaderSize(r, 32<<10)
	if err := expect(br, '{'); err != nil {
		return false, 0, err
	}
	err = readObjectFields(br, func(name string) error {
		switch name {
		case "has_more":
			raw := &capped{limit: 16}
			if err := skipValue(br, raw); err != nil {
				return err
			}
			hasMore = string(raw.buf) == "true"
			return nil
		case "data":
			return readArray(br, func() error {
				obj, n, err := readListObject(br, caps, caps.page-kept)
				if err != nil {
					return err
				}
				kept += n
				return each(obj)
			})
		}
		return skipValue(br, &capped{})
	})
	return hasMore, kept, err
}

// readObjectFields reads the fields of an object whose '{' has been read,
// calling field with each name, which must read the value. A name over
// maxKeyBytes is skipped with its value.
func readObjectFields(br *bufio.Reader, field func(name string) error) error {
	for first := true; ; first = false {
		c, err := nextByte(br)
		if err != nil {
			return err
		}
		if c == '}' {
			return nil
		}
		if !first {
			if c != ',' {
				return fmt.Errorf("list: want ',' or '}', got %q", c)
			}
			if c, err = nextByte(br); err != nil {
				return err
			}
		}
		if c != '"' {
			return fmt.Errorf("list: want a field name, got %q", c)
		}
		key := &capped{limit: maxKeyBytes}
		if err := readString(br, key); err != nil {
			return err
		}
		if err := expect(br, ':'); err != nil {
			return err
		}
		if key.total > maxKeyBytes {
			if err := skipValue(br, &capped{}); err != nil {
				return err
			}
			continue
		}
		if err := field(string(key.buf)); err != nil {
			return err
		}
	}
}

// readArray reads an array, calling elem for each element, which must
// read it; null is an empty array.
func readArray(br *bufio.Reader, elem func() error) error {
	c, err := nextByte(br)
	if err != nil {
		return err
	}
	if c == 'n' {
		_ = br.UnreadByte()
		return skipValue(br, &capped{})
	}
	if c != '[' {
		return fmt.Errorf("list: want an array, got %q", c)
	}
	for first := true; ; first = false {
		c, err := nextByte(br)
		if err != nil {
			return err
		}
		if c == ']' {
			return nil
		}
		if !first {
			if c != ',' {
				return fmt.Errorf("list: want ',' or ']', got %q", c)
			}
		} else {
			_ = br.UnreadByte()
		}
		if err := elem(); err != nil {
			return err
		}
	}
}

// readListObject reads one object of a list's data within caps, keeping at
// most left bytes, and returns it with the bytes it kept.
func readListObject(br *bufio.Reader, caps listCaps, left int) (listObject, int, error) {
	if err := expect(br, '{'); err != nil {
		return nil, 0, err
	}
	obj := listObject{}
	kept := 0
	err := readObjectFields(br, func(name string) error {
		room := max(left-kept, 0)
		c, err := nextByte(br)
		if err != nil {
			return err
		}
		if c == '"' {
			v := &capped{limit: min(caps.str+utf8.UTFMax, room)}
			if err := readString(br, v); err != nil {
				return err
			}
			s, _ := cutAt(string(v.buf), min(caps.str, room))
			kept += len(s) + len(name)
			obj[name] = listField{str: s, cut: v.total > int64(len(s))}
			return nil
		}
		_ = br.UnreadByte()
		v := &capped{limit: min(caps.raw, room)}
		if err := skipValue(br, v); err != nil {
			return err
		}
		if v.total > int64(v.limit) {
			obj[name] = listField{cut: true}
			return nil
		}
		kept += len(v.buf) + len(name)
		obj[name] = listField{raw: v.buf}
		return nil
	})
	return obj, kept, err
}
