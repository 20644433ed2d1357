package main

import (
	"encoding/json"
	"io"
)

// jsonLines returns the encoder every command prints its JSON with. It
// leaves <, > and & as they are: the output is read in a terminal or by
// jq, never embedded in HTML, and a Message-ID must print as <id@host>,
// not \u003cid@host\u003e.
func jsonLines(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}
