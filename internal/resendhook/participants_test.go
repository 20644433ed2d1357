package resendhook_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestThreadParticipants: naming a Message-ID is not enough to join a
// conversation. The customer's reply joins, and so does one from the
// address the customer asked answers to go to (Reply-To); a DMARC-failing
// spoof of the customer, and an unrelated sender, start their own thread,
// keeping In-Reply-To as sent.
func TestThreadParticipants(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	customer := "<order@mail.example.com>"
	mailIn(t, h, "order", customer, nil, func(e map[string]any) {
		e["reply_to"] = []string{"Ada at home <ada@home.example>"}
	})
	from := func(addr, dmarc string) func(e map[string]any) {
		return func(e map[string]any) {
			e["from"] = addr
			e["headers"].(map[string]any)["from"] = addr
			e["authentication"] = map[string]any{"spf": "pass", "dkim": "pass", "dmarc": dmarc}
		}
	}
	answering := map[string]any{"in-reply-to": customer, "references": customer}
	mailIn(t, h, "customer-reply", "<r1@mail.example.com>", answering, from("ADA@example.com", "pass"))
	mailIn(t, h, "reply-to-address", "<r2@home.example>", answering, from("ada@home.example", "none"))
	mailIn(t, h, "spoof", "<s1@evil.example>", answering, from("ada@example.com", "fail"))
	mailIn(t, h, "stranger", "<s2@evil.example>", answering, from("mallory@evil.example", "pass"))

	got := map[string][2]string{}
	for _, r := range h.rows(t) {
		got[r.ExternalID] = [2]string{r.Thread, r.InReplyTo}
	}
	want := map[string][2]string{
		"order":            {"order", ""},
		"customer-reply":   {"order", customer},
		"reply-to-address": {"order", customer},
		"spoof":            {"spoof", customer},
		"stranger":         {"stranger", customer},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("thread, in_reply_to (-want +got):\n%s", diff)
	}
}

// TestThreadVerdictKnown: the DMARC verdict a thread rests on is read
// whatever the sender makes of the other fields. Headers padded to fill
// the answer's shared field cap up to authentication do not crowd the
// verdict out: a padded spoof of the customer still fails DMARC and starts
// its own thread, and a padded reply of the customer's still joins, as
// they do unpadded. A verdict that is skipped all the same (larger than
// its own cap) is not taken for no verdict: the mail joins no thread, and
// the skip is logged.
func TestThreadVerdictKnown(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := newHarness(t, options{logs: &logs})
	customer := "<order@mail.example.com>"
	mailIn(t, h, "order", customer, nil, nil)
	answering := map[string]any{"in-reply-to": customer, "references": customer}
	verdict := func(dmarc string) map[string]any {
		return map[string]any{"spf": "pass", "dkim": dmarc, "dmarc": dmarc}
	}
	// crowd pads the headers so that the fields before authentication,
	// as raw JSON and the bodies aside, come within a few bytes of the
	// shared 1 MiB cap: too few for the verdict, were it to share them.
	crowd := func(e map[string]any) {
		used := len("{")
		for _, k := range h.api.order {
			if k == "authentication" {
				break
			}
			if v, ok := e[k]; ok && k != "text" && k != "html" {
				entry, err := json.Marshal(map[string]any{k: v}) // {"k":v}: the entry and its comma
				if err != nil {
					t.Fatal(err)
				}
				used += len(entry) - 1
			}
		}
		e["headers"].(map[string]any)["x-pad"] = strings.Repeat("a", 1<<20-used-8)
	}
	mailIn(t, h, "spoof", "<s1@evil.example>", answering, func(e map[string]any) {
		e["authentication"] = verdict("fail")
	})
	mailIn(t, h, "padded-spoof", "<s2@evil.example>", answering, func(e map[string]any) {
		e["authentication"] = verdict("fail")
		crowd(e)
	})
	mailIn(t, h, "reply", "<r1@mail.example.com>", answering, func(e map[string]any) {
		e["authentication"] = verdict("pass")
	})
	mailIn(t, h, "padded-reply", "<r2@mail.example.com>", answering, func(e map[string]any) {
		e["authentication"] = verdict("pass")
		crowd(e)
	})
	mailIn(t, h, "verdict-skipped", "<s3@evil.example>", answering, func(e map[string]any) {
		v := verdict("fail")
		v["x-pad"] = strings.Repeat("a", 1<<20)
		e["authentication"] = v
	})

	type threaded struct{ Thread, InReplyTo, AuthDMARC string }
	got := map[string]threaded{}
	for _, r := range h.rows(t) {
		got[r.ExternalID] = threaded{r.Thread, r.InReplyTo, r.AuthDMARC}
	}
	want := map[string]threaded{
		"order":           {"order", "", "pass"},
		"spoof":           {"spoof", customer, "fail"},
		"padded-spoof":    {"padded-spoof", customer, "fail"},
		"reply":           {"order", customer, "pass"},
		"padded-reply":    {"order", customer, "pass"},
		"verdict-skipped": {"verdict-skipped", customer, ""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("thread, in_reply_to, auth_dmarc (-want +got):\n%s", diff)
	}
	var skipped []string
	for line := range strings.Lines(logs.String()) {
		var l struct {
			Msg     string   `json:"msg"`
			EmailID string   `json:"email_id"`
			Fields  []string `json:"fields"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "mail fields skipped" && l.EmailID == "verdict-skipped" {
			skipped = l.Fields
		}
	}
	if diff := cmp.Diff([]string{"authentication"}, skipped); diff != "" {
		t.Errorf("fields logged skipped for verdict-skipped (-want +got):\n%s", diff)
	}
}

// TestEnvelopeRecipientsDecide: when Resend names the envelope recipients,
// a forged Cc of the support address does not bring a mail for sales into
// the support queue; without them, To and Cc still decide.
func TestEnvelopeRecipientsDecide(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	h.api.addEmail(t, emailID, nil)
	forged := receivedEvent(t, emailID, func(d map[string]any) {
		d["to"] = []string{"sales@munchable.app"}
		d["cc"] = []string{"support@munchable.app"}
		d["received_for"] = []string{"sales@munchable.app"}
	})
	checkAnswer(t, "forged cc", answerOf(t, h.deliver(t, "msg_forged", forged)), ignored)
	if got := h.api.totalFetches(); got != 0 {
		t.Errorf("fetches = %d, want 0", got)
	}
	checkRows(t, h, nil)

	noEnvelope := receivedEvent(t, emailID, func(d map[string]any) {
		d["to"] = []string{"sales@munchable.app"}
		d["cc"] = []string{"support@munchable.app"}
		d["received_for"] = []string{}
	})
	checkAnswer(t, "cc without envelope", answerOf(t, h.deliver(t, "msg_cc", noEnvelope)), processed)
}
