package stripehook

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary verified bodies to the decoder: it must never
// panic, and what it accepts as a handled event must carry an id and a
// type, and an effect.
func FuzzDecode(f *testing.F) {
	for _, glob := range []string{"../../testdata/events/*.json", "../../testdata/stripe/*.json"} {
		files, _ := filepath.Glob(glob)
		for _, name := range files {
			if b, err := os.ReadFile(name); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte(`{"id":"evt_1","type":"invoice.paid"}`))
	f.Add([]byte(`{"id":"evt_1","type":"customer.subscription.updated","created":1764590400,"data":{"object":{"id":"sub","customer":{"id":"cus"},"status":"active","items":{"data":[{"id":"si","price":{"id":"p"},"current_period_end":5}]}}}}`))
	f.Add([]byte(`{"id":"evt_1","type":"customer.subscription.updated","created":1764590400,"data":{"object":{"id":"sub","customer":null,"status":"active"}}}`))
	r := New(Config{})
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := r.decode(body)
		if err != nil {
			return
		}
		if kindOf(ev.Type) != 0 && ev.Apply == nil && !isThin(body) {
			t.Fatalf("a handled event without an effect: %q", body)
		}
	})
}

func isThin(body []byte) bool {
	var h head
	return json.Unmarshal(body, &h) == nil && h.Object == thinObject
}
