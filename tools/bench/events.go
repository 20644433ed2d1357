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

// fixture is the bundled customer.subscription.updated event, compacted as
// Stripe sends it: about 3 KiB.
type fixture []byte

func loadFixture() (fixture, error) {
	raw, err := os.ReadFile(filepath.Join("testdata", "events", "customer.subscription.updated.json"))
	if err != nil {
		return nil, fmt.Errorf("run bench from the module's root: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, fmt.Errorf("fixture: %w", err)
	}
	b := buf.Bytes()
	if bytes.Count(b, []byte(fixtureEventID)) != 1 || !bytes.Contains(b, []byte(fixtureSubID)) {
		return nil, fmt.Errorf("fixture no longer holds %s once and %s", fixtureEventID, fixtureSubID)
	}
	return b, nil
}

// event returns the fixture with its event id and subscription id made
// unique by tag and n.
func (f fixture) event(tag string, n int) []byte {
	suffix := tag + strconv.Itoa(n)
	b := bytes.Replace(f, []byte(fixtureEventID), []byte("evt_bench_"+suffix), 1)
	return bytes.ReplaceAll(b, []byte(fixtureSubID), []byte("sub_bench_"+suffix))
}

// request renders one complete HTTP/1.1 request, with the headers Stripe
// sends, signed with secret at signedAt.
func request(body []byte, secret string, signedAt time.Time) []byte {
	sig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: signedAt})
	head := "POST /webhooks/stripe HTTP/1.1\r\n" +
		"Host: 127.0.0.1\r\n" +
		"User-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n" +
		"Accept: */*; q=0.5, application/xml\r\n" +
		"Cache-Control: no-cache\r\n" +
		"Content-Type: application/json; charset=utf-8\r\n" +
		"Stripe-Signature: " + sig.Header + "\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	return append([]byte(head), body...)
}

// firstDeliveries pre-generates n signed requests, each a new event for a
// new subscription. Signatures are made now, so the set must be used within
// the service's 300 s tolerance.
func (f fixture) firstDeliveries(secret, tag string, n int) [][]byte {
	now := time.Now()
	reqs := make([][]byte, n)
	for i := range reqs {
		reqs[i] = request(f.event(tag, i), secret, now)
	}
	return reqs
}
