package resendhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/support"
	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// sweepPage is the most List Received Emails answers at once ("Maximum
// value: 100", https://resend.com/docs/api-reference/emails/list-received-emails).
const sweepPage = 100

// listedEmail is one object of GET /emails/receiving's data, in the shape
// of the page above (id, to, from, created_at, subject, bcc, cc, reply_to,
// message_id, attachments). received_for is read when present, as the
// webhook's data has it, so that envelope recipients decide where Resend
// says what they were.
type listedEmail struct {
	ID          string          `json:"id"`
	CreatedAt   json.RawMessage `json:"created_at"`
	From        string          `json:"from"`
	To          addrList        `json:"to"`
	Cc          addrList        `json:"cc"`
	Bcc         addrList        `json:"bcc"`
	ReceivedFor addrList        `json:"received_for"`
	MessageID   string          `json:"message_id"`
	Subject     string          `json:"subject"`
}

// listPage is a page of a Resend list (https://resend.com/docs/api-reference/pagination):
// object "list", has_more, data.
type listPage struct {
	HasMore bool          `json:"has_more"`
	Data    []listedEmail `json:"data"`
}

// received is the listed email as an email.received event's data would
// carry it.
func (e listedEmail) received() receivedData {
	return receivedData{EmailID: e.ID, CreatedAt: e.CreatedAt, From: e.From, To: e.To, Cc: e.Cc, Bcc: e.Bcc,
		ReceivedFor: e.ReceivedFor, MessageID: e.MessageID, Subject: e.Subject}
}

// eventBody is the email.received event a webhook would have carried for
// the listed email. The sweep runs it as a delivery's body, so the ledger
// keeps it if the attempt fails, and events retry resend received:<id>
// runs it again as it would a kept delivery.
func (e listedEmail) eventBody() ([]byte, error) {
	data, err := json.Marshal(e.received())
	if err != nil {
		return nil, fmt.Errorf("listed email %s as an event: %w", e.ID, err)
	}
	return json.Marshal(event{Type: typeReceived, CreatedAt: e.CreatedAt, Data: data})
}

// SweepClaimPrefix begins the claim id of a swept email: "received:" and
// the email's id. A webhook delivery's claim is its svix-id, which the
// list does not say, so the two never share a claim; a delivery after a
// sweep runs the apply again, and the queue, unique on (source, external
// id), answers it unchanged: harmless, one fetch more.
const SweepClaimPrefix = "received:"

// SweepPass is the Resend sweep's pass: it lists received emails (GET
// /emails/receiving, newest first, a page of 100 at a time, after the
// last id while has_more) until one was created before from, and runs
// each that is addressed to support (the webhook's rule: envelope
// recipients first) and not yet queued through ep, exactly as an
// email.received delivery of it would run. A mail queued by the pass is
// recovered: no webhook had delivered it. One already queued costs one
// query and is counted delivered. A failed mail fails the pass, after the
// rest were tried.
func (r *Receiver) SweepPass(ep *claim.Endpoint) sweep.Pass {
	return func(ctx context.Context, from time.Time) (sweep.Counts, error) {
		h := r.h
		var n sweep.Counts
		failed := 0
		for after := ""; ; {
			page, err := h.listReceived(ctx, after)
			if err != nil {
				return n, err
			}
			for _, e := range page.Data {
				created, ok := parseTime(rawString(e.CreatedAt))
				if ok && created.Before(from) {
					return n, failures(failed)
				}
				n.Listed++
				d := e.received()
				if !validEmailID(d.EmailID) {
					h.logger.Warn("sweep: listed email without a usable id", "provider", "resend")
					continue
				}
				if _, ok := h.inbound.match(d.recipients()); !ok {
					continue
				}
				queued, err := h.queue.Queued(ctx, support.SourceEmail, d.EmailID)
				if err != nil {
					return n, err
				}
				if queued {
					n.Delivered++
					continue
				}
				body, err := e.eventBody()
				var ev claim.Event
				if err == nil {
					ev, err = h.event(SweepClaimPrefix+d.EmailID, body)
				}
				if err != nil {
					h.logger.Error("sweep: listed email not runnable", "provider", "resend", "email_id", d.EmailID, "err", err)
					failed++
					continue
				}
				res, _ := ep.Process(ctx, body, ev) // the flow logs each outcome
				switch {
				case res.Outcome == claim.Processed && res.Effect == claim.Applied:
					n.Recovered++
				case res.Outcome == claim.Processed || res.Outcome == claim.Duplicate:
					n.Delivered++ // a webhook queued it meanwhile
				default:
					failed++
				}
			}
			if !page.HasMore || len(page.Data) == 0 {
				return n, failures(failed)
			}
			after = page.Data[len(page.Data)-1].ID
		}
	}
}

func failures(n int) error {
	if n > 0 {
		return fmt.Errorf("%d received emails failed or were held by another attempt (logged above)", n)
	}
	return nil
}

// listReceived reads one page of received emails, after the id after
// ("" for the first page: the newest).
func (h *handler) listReceived(ctx context.Context, after string) (listPage, error) {
	q := url.Values{"limit": {fmt.Sprint(sweepPage)}}
	if after != "" {
		q.Set("after", after)
	}
	req, err := h.client.NewRequest(ctx, http.MethodGet, "emails/receiving?"+q.Encode(), nil)
	if err != nil {
		return listPage{}, fmt.Errorf("list received emails: %w", err)
	}
	var page listPage
	if _, err := h.client.Perform(req, &page); err != nil {
		return listPage{}, fmt.Errorf("list received emails after %q: %w", after, err)
	}
	return page, nil
}
