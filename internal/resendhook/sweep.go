package resendhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// recipientsCut: a recipient list was over the page's caps.
	recipientsCut bool
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

// DefaultSweepMaxPages is SWEEP_MAX_PAGES's default: 5,000 mails a pass.
const DefaultSweepMaxPages = 50

// sweepCaps bound a page of received emails: strings (ids, from, subject,
// Message-ID, dates) up to 8 KiB, each recipient list up to 64 KiB, 4 MiB
// for the page. A mail whose recipients were cut cannot be told to be for
// support here; its webhook still can.
var sweepCaps = listCaps{str: 8 << 10, raw: 64 << 10, page: 4 << 20}

// sweepPageShare is the most one page costs, at its caps, drawn from the
// mail budget as it is read (twice the bytes read): the page kept, and as
// much again decoding it.
const sweepPageShare = 2*(4<<20) + 32<<10

// SweepPass is the Resend sweep's pass: it lists received emails (GET
// /emails/receiving, newest first, a page of 100 at a time, after the
// last id while has_more) until one was created before from, and runs
// each that is addressed to support (the webhook's rule: envelope
// recipients first) and not yet queued through ep, exactly as an
// email.received delivery of it would run. A mail queued by the pass is
// recovered: no webhook had delivered it. One already queued costs one
// query and is counted delivered. A failed mail fails the pass, after the
// rest were tried.
//
// A pass ends: it reads at most maxPages pages (0: DefaultSweepMaxPages),
// and stops at a page it has already read or an email whose creation time
// it cannot read (the window's end could not be told), Counts.Stopped
// saying which, with sweep.ErrStopped. Each page is read within sweepCaps
// and its bytes drawn from the mail budget.
func (r *Receiver) SweepPass(ep *claim.Endpoint, maxPages int) sweep.Pass {
	if maxPages <= 0 {
		maxPages = DefaultSweepMaxPages
	}
	return func(ctx context.Context, from time.Time) (sweep.Counts, error) {
		h := r.h
		var n sweep.Counts
		failed := 0
		seen := map[string]bool{}
		stop := func(why sweep.Stop) (sweep.Counts, error) {
			n.Stopped = why
			return n, errors.Join(fmt.Errorf("%w: %s", sweep.ErrStopped, why), failures(failed))
		}
		for after, pages := "", 0; ; pages++ {
			if pages == maxPages {
				return stop(sweep.StopMaxPages)
			}
			held := h.budget.hold()
			page, err := h.listReceived(ctx, after, held)
			if err != nil {
				held.release()
				return n, errors.Join(err, failures(failed))
			}
			if len(page.Data) > 0 && seen[page.Data[len(page.Data)-1].ID] {
				held.release()
				return stop(sweep.StopPageSeen)
			}
			for _, e := range page.Data {
				seen[e.ID] = true
				created, ok := parseTime(rawString(e.CreatedAt))
				if !ok {
					held.release()
					h.logger.Warn("sweep: listed email with a creation time that does not parse", "provider", "resend", "email_id", e.ID)
					return stop(sweep.StopBadDate)
				}
				if created.Before(from) {
					held.release()
					return n, failures(failed)
				}
				n.Listed++
				if r.sweepOne(ctx, ep, e, &n) {
					failed++
				}
			}
			held.release()
			if !page.HasMore || len(page.Data) == 0 {
				return n, failures(failed)
			}
			after = page.Data[len(page.Data)-1].ID
		}
	}
}

// sweepOne runs one listed email, as a delivery of it would run, when it
// is for support and not yet queued; it reports whether it failed.
func (r *Receiver) sweepOne(ctx context.Context, ep *claim.Endpoint, e listedEmail, n *sweep.Counts) (failed bool) {
	h := r.h
	d := e.received()
	if !validEmailID(d.EmailID) {
		h.logger.Warn("sweep: listed email without a usable id", "provider", "resend")
		return false
	}
	if e.recipientsCut {
		h.logger.Warn("sweep: listed email whose recipients are over the page's caps: left to its webhook", "provider", "resend", "email_id", d.EmailID)
		return false
	}
	if _, ok := h.inbound.match(d.recipients()); !ok {
		return false
	}
	queued, err := h.queue.Queued(ctx, support.SourceEmail, d.EmailID)
	if err != nil {
		h.logger.Error("sweep: queue lookup failed", "provider", "resend", "email_id", d.EmailID, "err", err)
		return true
	}
	if queued {
		n.Delivered++
		return false
	}
	body, err := e.eventBody()
	var ev claim.Event
	if err == nil {
		ev, err = h.event(SweepClaimPrefix+d.EmailID, body)
	}
	if err != nil {
		h.logger.Error("sweep: listed email not runnable", "provider", "resend", "email_id", d.EmailID, "err", err)
		return true
	}
	res, _ := ep.Process(ctx, body, ev) // the flow logs each outcome
	switch {
	case res.Outcome == claim.Processed && res.Effect == claim.Applied:
		n.Recovered++
	case res.Outcome == claim.Processed || res.Outcome == claim.Duplicate:
		n.Delivered++ // a webhook queued it meanwhile
	default:
		return true
	}
	return false
}

func failures(n int) error {
	if n > 0 {
		return fmt.Errorf("%d received emails failed or were held by another attempt (logged above)", n)
	}
	return nil
}

// listReceived reads one page of received emails, after the id after
// ("" for the first page: the newest), as a stream within sweepCaps,
// drawing its bytes from the mail budget (h).
func (h *handler) listReceived(ctx context.Context, after string, held *hold) (listPage, error) {
	q := url.Values{"limit": {fmt.Sprint(sweepPage)}}
	if after != "" {
		q.Set("after", after)
	}
	req, err := h.client.NewRequest(ctx, http.MethodGet, "emails/receiving?"+q.Encode(), nil)
	if err != nil {
		return listPage{}, fmt.Errorf("list received emails: %w", err)
	}
	var page listPage
	var kept int
	err = perform(h.client, req, func(r io.Reader) error {
		metered := &meteredReader{ctx: ctx, r: r, h: held, factor: 2, limit: sweepPageShare}
		page.HasMore, kept, err = readList(metered, sweepCaps, func(o listObject) error {
			page.Data = append(page.Data, listedEmailOf(o))
			return nil
		})
		return err
	})
	if err != nil {
		return listPage{}, fmt.Errorf("list received emails after %q: %w", after, err)
	}
	held.shrink(2 * int64(kept))
	return page, nil
}

// listedEmailOf reads a listed email's fields from a page read within
// bounds. A string over its cap is kept cut (the id then fails
// validEmailID); a recipient list over its cap marks the email.
func listedEmailOf(o listObject) listedEmail {
	e := listedEmail{}
	e.ID, _ = o.string("id")
	e.From, _ = o.string("from")
	e.MessageID, _ = o.string("message_id")
	e.Subject, _ = o.string("subject")
	if f := o["created_at"]; f.raw != nil {
		e.CreatedAt = f.raw
	} else {
		e.CreatedAt, _ = json.Marshal(f.str)
	}
	for name, l := range map[string]*addrList{"to": &e.To, "cc": &e.Cc, "bcc": &e.Bcc, "received_for": &e.ReceivedFor} {
		f, ok := o[name]
		switch {
		case !ok:
		case f.cut:
			e.recipientsCut = true
		case f.raw != nil:
			_ = l.UnmarshalJSON(f.raw)
		default:
			raw, _ := json.Marshal(f.str)
			_ = l.UnmarshalJSON(raw)
		}
	}
	return e
}
