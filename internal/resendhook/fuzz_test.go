package resendhook

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	svix "github.com/svix/svix-webhooks/go"
)

// FuzzEvent feeds arbitrary verified bodies through everything that reads
// them before the claim: it must never panic, and an email.received it
// accepts must name an email id that is safe in the API's URL path.
func FuzzEvent(f *testing.F) {
	if b, err := os.ReadFile("../../testdata/events/email.received.json"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"type":"email.received","created_at":"2026-01-01T00:00:00Z","data":{"email_id":"4ef9a417","from":"A <a@b.c>","to":["support@munchable.app"],"cc":"x@y.z, support@munchable.app","received_for":null}}`))
	f.Add([]byte(`{"type":"email.received","data":{"email_id":"../../domains","to":[1,2]}}`))
	f.Add([]byte(`{"type":"email.sent","data":{}}`))
	in, bad := ParseInbound([]string{"support@munchable.app", "@inbound.munchable.app"})
	if len(bad) != 0 {
		f.Fatal(bad)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := decode(body)
		if err != nil || ev.Type != typeReceived {
			return
		}
		d, err := ev.mail()
		if err != nil {
			return
		}
		if !validEmailID(d.EmailID) {
			t.Fatalf("accepted email id %q", d.EmailID)
		}
		if to, ok := in.match(d.recipients()); ok && to == "" {
			t.Fatal("matched an empty recipient")
		}
	})
}

// FuzzSignatureHeaders feeds arbitrary Svix headers: verification must never
// panic, must refuse what it did not sign, and whatever it accepts yields
// the id it verified.
func FuzzSignatureHeaders(f *testing.F) {
	wh, err := svix.NewWebhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		f.Fatal(err)
	}
	body := []byte(`{"type":"email.received","data":{}}`)
	now := time.Now()
	good, _ := wh.Sign("msg_1", now, body)
	f.Add("msg_1", strconv.FormatInt(now.Unix(), 10), good, body)
	f.Add("msg_1", "not-a-number", "v1,AAAA", body)
	f.Add("", "", "", body)
	f.Add("msg_2", strconv.FormatInt(now.Unix(), 10), "v1,"+good+" v2,x v1", body)
	f.Fuzz(func(t *testing.T, id, ts, sig string, payload []byte) {
		h := http.Header{}
		h.Set("svix-id", id)
		h.Set("svix-timestamp", ts)
		h.Set("svix-signature", sig)
		if err := wh.Verify(payload, h); err != nil {
			return
		}
		// Accepted: it must be a signature we made, over this id and body.
		unix, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			t.Fatalf("accepted unparseable timestamp %q", ts)
		}
		want, _ := wh.Sign(id, time.Unix(unix, 0), payload)
		if !strings.Contains(sig, want) {
			t.Fatalf("accepted signature %q for id %q", sig, id)
		}
		if got := messageID(h); got != id {
			t.Fatalf("messageID = %q, want the verified %q", got, id)
		}
	})
}
