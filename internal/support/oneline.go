package support

import "strings"

// OneLine is the one cleaning of a support message's one-line fields
// (sender name and address, subject, Reply-To, Message-ID, In-Reply-To,
// References, an attachment's filename and types), for mail and the form
// alike, so that the same text typed into either is stored the same:
//
//   - every C0 control (CR, LF, NUL, TAB, ESC, ...), DEL, every C1 control
//     (U+0080 to U+009F, NEL among them), and the line and paragraph
//     separators U+2028 and U+2029 become a space. A line break in one of
//     these fields is a header injection waiting for the app that copies it
//     into a reply, ESC starts a terminal escape sequence where a log or an
//     operator's shell shows it, and NEL, U+2028 and U+2029 are line breaks
//     to some readers;
//   - the bidirectional formatting characters (ALM U+061C, LRM and RLM
//     U+200E/F, the embeddings and overrides U+202A to U+202E, the isolates
//     U+2066 to U+2069) are removed: invisible, they make a name or subject
//     read otherwise than it is stored ("Trojan Source", CVE-2021-42574),
//     and a space in their place would add what the sender never saw.
//
// Mail runs it on the decoded value, since RFC 2047 (=0D=0A) can bring
// them back; the form runs it after refusing the line breaks a person
// cannot type into a one-line field.
func OneLine(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r < 0x20 || (r >= 0x7f && r <= 0x9f) || r == '\u2028' || r == '\u2029':
			return ' '
		case r == '\u061c' || r == '\u200e' || r == '\u200f' ||
			(r >= '\u202a' && r <= '\u202e') || (r >= '\u2066' && r <= '\u2069'):
			return -1
		}
		return r
	}, s)
}
