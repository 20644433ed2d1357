package stripehook

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary verified bodies to the decoder: it must never
// panic, and what it accepts as a subscription event must carry everything
// the upsert needs.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob("../../testdata/events/*.json")
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"id":"evt_1","type":"invoice.paid"}`))
	f.Add([]byte(`{"id":"evt_1","type":"customer.subscription.updated","created":1,"data":{"object":{"id":"sub","customer":{"id":"cus"},"status":"active","items":{"data":[{"current_period_end":5}]}}}}`))
	f.Add([]byte(`{"id":"evt_1","type":"customer.subscription.updated","created":1,"data":{"object":{"id":"sub","customer":null,"status":"active"}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := decode(body)
		if err != nil {
			return
		}
		if ev.ID == "" || ev.Type == "" {
			t.Fatalf("accepted an event without id or type: %q", body)
		}
		if !subscriptionEvents[ev.Type] {
			return
		}
		ent, ref := ev.entitlement()
		if ent.SubscriptionID == "" || ent.CustomerID == "" || ent.Status == "" || ref.ID == "" || ref.Created.Unix() <= 0 {
			t.Fatalf("accepted an incomplete subscription event: %+v %+v from %q", ent, ref, body)
		}
	})
}
