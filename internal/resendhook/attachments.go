package resendhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/resend/resend-go/v3"

	"github.com/munchable/munchable-webhooks/internal/support"
)

// attachmentPages bounds the listing of one email's attachments (100 a
// page), so an API that keeps saying has_more cannot hold the delivery.
const attachmentPages = 50

// attachmentCaps bound a page of the attachment list: a field's string up
// to 8 KiB (a signed download URL is long; a filename is cut to 255 bytes
// after), anything else up to 1 KiB, 2 MiB for the page.
var attachmentCaps = listCaps{str: 8 << 10, raw: 1 << 10, page: 2 << 20}

// attachmentPageShare is the most reading one page costs, at its caps:
// the page kept, and as much again while it is decoded. A smaller page
// draws twice the bytes read, as they arrive.
const attachmentPageShare = 2*(2<<20) + 32<<10

// maxAttachmentField is the longest filename, content type, disposition
// or content id kept, in bytes, as for a message's header fields.
const maxAttachmentField = 255

// listAttachments lists the received email's attachments, each with its
// signed download_url (https://resend.com/docs/api-reference/attachments/list-received-email-attachments).
// Each page is read as a stream within attachmentCaps and drawn from the
// mail budget (h), which keeps what the listed attachments hold.
func listAttachments(ctx context.Context, c *resend.Client, emailID string, h *hold) ([]resend.EmailAttachment, error) {
	var all []resend.EmailAttachment
	for after := ""; len(all) < attachmentPages*100; {
		q := url.Values{"limit": {"100"}}
		if after != "" {
			q.Set("after", after)
		}
		req, err := c.NewRequest(ctx, http.MethodGet, "emails/receiving/"+emailID+"/attachments?"+q.Encode(), nil)
		if err != nil {
			return nil, fmt.Errorf("list attachments of %s: %w", emailID, err)
		}
		base := h.n
		var page []resend.EmailAttachment
		var hasMore bool
		var kept int
		err = perform(c, req, func(r io.Reader) error {
			metered := &meteredReader{ctx: ctx, r: r, h: h, factor: 2, limit: attachmentPageShare}
			hasMore, kept, err = readList(metered, attachmentCaps, func(o listObject) error {
				if a, ok := listedAttachment(o); ok {
					page = append(page, a)
				}
				return nil
			})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list attachments of %s: %w", emailID, err)
		}
		h.shrink(base + 2*int64(kept))
		all = append(all, page...)
		if !hasMore || len(page) == 0 {
			return all, nil
		}
		after = page[len(page)-1].Id
	}
	return nil, fmt.Errorf("list attachments of %s: still more after %d pages", emailID, attachmentPages)
}

// listedAttachment is a listed attachment's fields, cut and cleaned like a
// message's header fields: filename, content type, disposition and
// content id at most 255 bytes, control characters (CR, LF, NUL, ...)
// replaced by a space. An attachment without a usable id is left out (the
// rest of the mail is queued); a download URL that was cut cannot be the
// signed one, and is dropped.
func listedAttachment(o listObject) (resend.EmailAttachment, bool) {
	id, cut := o.string("id")
	if cut || id == "" || len(id) > maxAttachmentField {
		return resend.EmailAttachment{}, false
	}
	field := func(name string) string {
		s, _ := o.string(name)
		s, _ = cutAt(support.OneLine(s), maxAttachmentField)
		return s
	}
	a := resend.EmailAttachment{
		Id:                 id,
		Filename:           field("filename"),
		ContentType:        field("content_type"),
		ContentDisposition: field("content_disposition"),
		ContentId:          field("content_id"),
	}
	if u, cut := o.string("download_url"); !cut {
		a.DownloadUrl = u
	}
	return a, true
}

// downloader fetches attachments from their signed URLs, which carry their
// own authorisation: the API key is never sent there.
type downloader struct {
	client *http.Client
	// max is the largest content stored; a larger attachment is recorded
	// without it.
	max int64
	// allowPrivate lifts the https-only rule (the client lifts the
	// address rule).
	allowPrivate bool
}

// inMemoryBytes is the most of one attachment held in memory; a larger one
// goes to a temporary file (at most downloader.max bytes), so a mail's
// attachments cost disk, not the pod's memory.
const inMemoryBytes = 64 << 10

// download is one listed attachment, downloaded before the queue's
// transaction opens: its row, and its content in memory or in a temporary
// file (none when the row records it without).
type download struct {
	at   support.Attachment
	mem  []byte
	file *os.File
}

// fetch downloads a: its content when it is at most d.max bytes, else the
// row alone, with the reason. listedSize is the size the email listed (-1:
// none). A 404 or 410 from the download URL records the attachment without
// content; any other failure (5xx, 429, a 403 for an expired URL, a
// timeout) is an error that fails the delivery, and Svix's retry lists the
// attachments again with fresh URLs. On success the caller closes the
// returned download (its file, if any).
//
// Its content is drawn from the mail budget (h) as it arrives. An
// attachment the budget could never hold beside the rest of the mail is
// recorded without content, as too large.
func (d downloader) fetch(ctx context.Context, a resend.EmailAttachment, listedSize int64, h *hold) (download, error) {
	dl := download{at: support.Attachment{
		ExternalID:         a.Id,
		Filename:           a.Filename,
		ContentType:        a.ContentType,
		ContentDisposition: a.ContentDisposition,
		ContentID:          a.ContentId,
		Size:               listedSize,
	}}
	if listedSize > d.max {
		dl.at.NoContentReason = support.NoContentTooLarge
		return dl, nil
	}
	u, err := url.Parse(a.DownloadUrl)
	if a.DownloadUrl == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		dl.at.NoContentReason = support.NoContentNoDownloadURL
		return dl, nil
	}
	if checkScheme(u, d.allowPrivate) != nil {
		dl.at.NoContentReason = support.NoContentRefused
		return dl, nil
	}
	// The URL as given: its signature covers it byte for byte.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.DownloadUrl, nil)
	if err != nil {
		return download{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	resp, err := d.client.Do(req)
	if errors.Is(err, errRefusedTarget) {
		// Not a passing failure: a retry would be refused the same way.
		dl.at.NoContentReason = support.NoContentRefused
		return dl, nil
	}
	if err != nil {
		return download{}, fmt.Errorf("download attachment %s: %w", a.Id, withoutQuery(err))
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		dl.at.NoContentReason = support.NoContentNotFound
		return dl, nil
	case resp.StatusCode == http.StatusGone:
		dl.at.NoContentReason = support.NoContentGone
		return dl, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return download{}, fmt.Errorf("download attachment %s: %s", a.Id, resp.Status)
	}
	if resp.ContentLength > d.max {
		dl.at.Size, dl.at.NoContentReason = resp.ContentLength, support.NoContentTooLarge
		return dl, nil
	}
	base := h.n
	if err := dl.receive(ctx, resp.Body, d.max, h); err != nil {
		dl.Close()
		h.shrink(base)
		if errors.Is(err, errOverBudget) {
			dl = download{at: dl.at}
			dl.at.Size, dl.at.NoContentReason = max(listedSize, resp.ContentLength), support.NoContentTooLarge
			return dl, nil
		}
		return download{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	if resp.ContentLength >= 0 && dl.at.Size != resp.ContentLength {
		dl.Close()
		return download{}, fmt.Errorf("download attachment %s: %d bytes of %d", a.Id, dl.at.Size, resp.ContentLength)
	}
	return dl, nil
}

// withoutQuery drops the query from the URL an *url.Error names: a signed
// download URL is a bearer credential, and the error reaches the log and
// webhook_events.last_error.
func withoutQuery(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	if u, perr := url.Parse(ue.URL); perr == nil {
		u.RawQuery, u.Fragment, u.User = "", "", nil
		return &url.Error{Op: ue.Op, URL: u.String() + "?[signature removed]", Err: ue.Err}
	}
	return &url.Error{Op: ue.Op, URL: "[download URL]", Err: ue.Err}
}

// receive reads body to its end: the first inMemoryBytes into memory, the
// rest, up to max in all, into a temporary file, every byte drawn from the
// mail budget (h) before it is held. Past max the content is dropped and
// counted on to its end, so the row keeps the true size.
func (dl *download) receive(ctx context.Context, body io.Reader, max int64, h *hold) error {
	base := h.n
	headCap := min(max, inMemoryBytes)
	if err := h.grow(ctx, headCap+1); err != nil {
		return err
	}
	head, err := io.ReadAll(io.LimitReader(body, headCap+1))
	if err != nil {
		return err
	}
	size := int64(len(head))
	if size <= headCap {
		h.shrink(base + size)
		dl.mem, dl.at.Size = head, size
		return nil
	}
	if max > inMemoryBytes {
		if dl.file, err = os.CreateTemp("", "munchable-attachment-*"); err != nil {
			return fmt.Errorf("temporary file: %w", err)
		}
		if _, err := dl.file.Write(head); err != nil {
			return fmt.Errorf("temporary file: %w", err)
		}
		// The head's draw now covers its bytes on disk.
		n, err := io.Copy(meteredWriter{ctx: ctx, w: dl.file, h: h}, io.LimitReader(body, max+1-size))
		if err != nil {
			return err
		}
		size += n
		if size <= max {
			dl.at.Size = size
			return nil
		}
		dl.Close() // too large after all: the file goes
	}
	h.shrink(base)
	rest, err := io.Copy(io.Discard, body)
	if err != nil {
		return err
	}
	dl.mem, dl.at.Size, dl.at.NoContentReason = nil, size+rest, support.NoContentTooLarge
	return nil
}

// content is the downloaded content from its start, nil for none.
func (dl *download) content() (io.Reader, error) {
	switch {
	case dl.file != nil:
		if _, err := dl.file.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		return dl.file, nil
	case dl.at.NoContentReason == "":
		return bytes.NewReader(dl.mem), nil
	}
	return nil, nil
}

// Close removes the temporary file, if any.
func (dl *download) Close() {
	if dl.file != nil {
		dl.file.Close()
		os.Remove(dl.file.Name())
		dl.file = nil
	}
}

// downloads are a mail's attachments, downloaded before its transaction.
type downloads []download

// write adds every attachment to the message just inserted: a write of
// what is already here, no network call, so the transaction lasts as long
// as the copy into Postgres.
func (ds downloads) write(ctx context.Context, w *support.Attachments) error {
	for i := range ds {
		content, err := ds[i].content()
		if err != nil {
			return fmt.Errorf("attachment %s: %w", ds[i].at.ExternalID, err)
		}
		if err := w.Add(ctx, ds[i].at, content); err != nil {
			return err
		}
	}
	return nil
}

// Close removes the temporary files.
func (ds downloads) Close() {
	for i := range ds {
		ds[i].Close()
	}
}

// downloadAttachments lists the email's attachments and downloads each in
// turn. An email whose answer listed no attachments costs no API call. On
// error nothing is left behind; on success the caller closes the result.
func (h *handler) downloadAttachments(ctx context.Context, e *receivedEmail, held *hold) (downloads, error) {
	if e.Attachments != nil && len(*e.Attachments) == 0 {
		return nil, nil
	}
	sizes := map[string]int64{}
	if e.Attachments != nil {
		for _, a := range *e.Attachments {
			if a.Size != nil {
				sizes[a.ID] = *a.Size
			}
		}
	}
	listed, err := listAttachments(ctx, h.client, e.ID, held)
	if err != nil {
		return nil, err
	}
	var out downloads
	seen := map[string]bool{}
	for _, a := range listed {
		if seen[a.Id] { // one row per attachment id, even if listed twice
			continue
		}
		seen[a.Id] = true
		size, ok := sizes[a.Id]
		if !ok {
			size = -1
		}
		dl, err := h.downloads.fetch(ctx, a, size, held)
		if err != nil {
			out.Close()
			return nil, err
		}
		out = append(out, dl)
	}
	return out, nil
}
