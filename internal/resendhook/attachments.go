package resendhook

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/resend/resend-go/v3"

	"github.com/munchable/munchable-webhooks/internal/support"
)

// attachmentPages bounds the listing of one email's attachments (100 a
// page), so an API that keeps saying has_more cannot hold the delivery.
const attachmentPages = 50

// listAttachments lists the received email's attachments, each with its
// signed download_url, with resend-go's attachments API.
func listAttachments(ctx context.Context, c *resend.Client, emailID string) ([]resend.EmailAttachment, error) {
	limit := 100
	opts := &resend.ListOptions{Limit: &limit}
	var all []resend.EmailAttachment
	for range attachmentPages {
		page, err := c.Emails.Receiving.ListAttachmentsWithOptions(ctx, emailID, opts)
		if err != nil {
			return nil, fmt.Errorf("list attachments of %s: %w", emailID, err)
		}
		all = append(all, page.Data...)
		if !page.HasMore || len(page.Data) == 0 {
			return all, nil
		}
		after := page.Data[len(page.Data)-1].Id
		opts.After = &after
	}
	return nil, fmt.Errorf("list attachments of %s: still more after %d pages", emailID, attachmentPages)
}

// downloader fetches attachments from their signed URLs, which carry their
// own authorisation: the API key is never sent there.
type downloader struct {
	client *http.Client
	// max is the largest content stored; a larger attachment is recorded
	// without it.
	max int64
}

// store downloads a and adds it to w: with its content, streamed from the
// download into the row, when it is at most d.max bytes; else without, and
// with the reason. listedSize is the size the email listed (-1: none). A
// 404 or 410 from the download URL records the attachment without content;
// any other failure (5xx, 429, a 403 for an expired URL, a timeout) is an
// error that fails the delivery, and Svix's retry lists the attachments
// again with fresh URLs.
func (d downloader) store(ctx context.Context, a resend.EmailAttachment, listedSize int64, w *support.Attachments) error {
	at := support.Attachment{
		ExternalID:         a.Id,
		Filename:           a.Filename,
		ContentType:        a.ContentType,
		ContentDisposition: a.ContentDisposition,
		ContentID:          a.ContentId,
		Size:               listedSize,
	}
	if listedSize > d.max {
		at.NoContentReason = support.NoContentTooLarge
		return w.Add(ctx, at, nil)
	}
	u, err := url.Parse(a.DownloadUrl)
	if a.DownloadUrl == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		at.NoContentReason = support.NoContentNoDownloadURL
		return w.Add(ctx, at, nil)
	}
	// The URL as given: its signature covers it byte for byte.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.DownloadUrl, nil)
	if err != nil {
		return fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		at.NoContentReason = support.NoContentNotFound
		return w.Add(ctx, at, nil)
	case resp.StatusCode == http.StatusGone:
		at.NoContentReason = support.NoContentGone
		return w.Add(ctx, at, nil)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return fmt.Errorf("download attachment %s: %s", a.Id, resp.Status)
	}
	if resp.ContentLength > d.max {
		at.Size, at.NoContentReason = resp.ContentLength, support.NoContentTooLarge
		return w.Add(ctx, at, nil)
	}
	if resp.ContentLength >= 0 {
		at.Size = resp.ContentLength
		return w.Add(ctx, at, resp.Body)
	}
	// No Content-Length: the size is known only once read, and COPY needs
	// it first, so this one is held in memory (at most d.max bytes).
	content, size, err := readAtMost(resp.Body, d.max)
	if err != nil {
		return fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	at.Size = size
	if content == nil {
		at.NoContentReason = support.NoContentTooLarge
		return w.Add(ctx, at, nil)
	}
	return w.Add(ctx, at, bytes.NewReader(content))
}

// readAtMost reads r whole and returns its bytes and size, or, when it has
// more than max bytes, nil and the size counted to its end.
func readAtMost(r io.Reader, max int64) ([]byte, int64, error) {
	buf, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, 0, err
	}
	if int64(len(buf)) <= max {
		return buf, int64(len(buf)), nil
	}
	rest, err := io.Copy(io.Discard, r)
	if err != nil {
		return nil, 0, err
	}
	return nil, int64(len(buf)) + rest, nil
}

// storeAttachments lists the email's attachments and streams each in turn
// from its download into the message being inserted: no attachment is
// held in memory whole. An email whose answer listed no attachments costs
// no API call.
func (h *handler) storeAttachments(ctx context.Context, e *receivedEmail, w *support.Attachments) error {
	if e.Attachments != nil && len(*e.Attachments) == 0 {
		return nil
	}
	sizes := map[string]int64{}
	if e.Attachments != nil {
		for _, a := range *e.Attachments {
			if a.Size != nil {
				sizes[a.ID] = *a.Size
			}
		}
	}
	listed, err := listAttachments(ctx, h.client, e.ID)
	if err != nil {
		return err
	}
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
		if err := h.downloads.store(ctx, a, size, w); err != nil {
			return err
		}
	}
	return nil
}
