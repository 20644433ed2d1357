package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"
)

// The fixture's ids, replaced in each generated event so that every event
// and its subscription are new to the service.
const (
	fixtureEventID = "evt_1QmunchableUpdated0001"
	fixtureSubID   = "sub_1QmunchableSub0001"
)

// template is the bundled customer.subscription.updated event, compacted as
// Stripe sends it: about 3 KiB.
type template struct {
	body []byte
}

func loadTemplate(root string) (template, error) {
	raw, err := os.ReadFile(filepath.Join(root, "testdata", "events", "customer.subscription.updated.json"))
	if err != nil {
		return template{}, err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return template{}, fmt.Errorf("fixture: %w", err)
	}
	b := buf.Bytes()
	if bytes.Count(b, []byte(fixtureEventID)) != 1 || !bytes.Contains(b, []byte(fixtureSubID)) {
		return template{}, fmt.Errorf("fixture no longer holds %s once and %s", fixtureEventID, fixtureSubID)
	}
	return template{body: b}, nil
}

// event returns the fixture with its event id and subscription id made
// unique by tag and n.
func (t template) event(tag string, n int) []byte {
	suffix := tag + strconv.Itoa(n)
	b := bytes.Replace(t.body, []byte(fixtureEventID), []byte("evt_bench_"+suffix), 1)
	return bytes.ReplaceAll(b, []byte(fixtureSubID), []byte("sub_bench_"+suffix))
}

// request renders one complete HTTP/1.1 request, with the headers Stripe
// sends, signed with secret at signedAt.
func request(body []byte, secret string, signedAt time.Time) []byte {
	sig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: signedAt})
	var b bytes.Buffer
	b.Grow(len(body) + 400)
	b.WriteString("POST /webhooks/stripe HTTP/1.1\r\n")
	b.WriteString("Host: 127.0.0.1\r\n")
	b.WriteString("User-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n")
	b.WriteString("Accept: */*; q=0.5, application/xml\r\n")
	b.WriteString("Cache-Control: no-cache\r\n")
	b.WriteString("Content-Type: application/json; charset=utf-8\r\n")
	b.WriteString("Stripe-Signature: " + sig.Header + "\r\n")
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	b.Write(body)
	return b.Bytes()
}

// firstDeliveries pre-generates n signed requests, each a new event for a
// new subscription. Signatures are made now, so the set must be used within
// the service's 300 s tolerance.
func (t template) firstDeliveries(secret, tag string, n int) [][]byte {
	now := time.Now()
	reqs := make([][]byte, n)
	for i := range reqs {
		reqs[i] = request(t.event(tag, i), secret, now)
	}
	return reqs
}
