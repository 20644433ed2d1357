package resendhook

import (
	"context"
	"errors"
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

// fetch returns a as a support attachment: with its content when it is at
// most d.max bytes, else without and with the reason. listedSize is the
// size the email listed (-1: none). A 404 or 410 from the download URL
// records the attachment without content; any other failure (5xx, 429, a
// 403 for an expired URL, a timeout) is an error that fails the delivery,
// and Svix's retry lists the attachments again with fresh URLs.
func (d downloader) fetch(ctx context.Context, a resend.EmailAttachment, listedSize int64) (support.Attachment, error) {
	out := support.Attachment{
		ExternalID:         a.Id,
		Filename:           a.Filename,
		ContentType:        a.ContentType,
		ContentDisposition: a.ContentDisposition,
		ContentID:          a.ContentId,
		Size:               listedSize,
	}
	if listedSize > d.max {
		out.NoContentReason = support.NoContentTooLarge
		return out, nil
	}
	u, err := url.Parse(a.DownloadUrl)
	if a.DownloadUrl == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		out.NoContentReason = support.NoContentNoDownloadURL
		return out, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return support.Attachment{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return support.Attachment{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		out.NoContentReason = support.NoContentNotFound
		return out, nil
	case resp.StatusCode == http.StatusGone:
		out.NoContentReason = support.NoContentGone
		return out, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return support.Attachment{}, fmt.Errorf("download attachment %s: %s", a.Id, resp.Status)
	}
	if resp.ContentLength > d.max {
		out.Size, out.NoContentReason = resp.ContentLength, support.NoContentTooLarge
		return out, nil
	}
	content, size, err := readAtMost(resp.Body, resp.ContentLength, d.max)
	if err != nil {
		return support.Attachment{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	out.Size = size
	if content == nil {
		out.NoContentReason = support.NoContentTooLarge
		return out, nil
	}
	out.Content = content
	return out, nil
}

// readAtMost reads r whole and returns its bytes and size, or, when it has
// more than max bytes, nil and the size counted to its end. With the length
// known (Content-Length, else -1) the content is read into one buffer of
// exactly that size: one copy, no growing.
func readAtMost(r io.Reader, length, max int64) ([]byte, int64, error) {
	if length >= 0 {
		buf := make([]byte, length)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, 0, err
		}
		// A server that sends more than it announced is refused rather
		// than trusted.
		if n, _ := io.Copy(io.Discard, io.LimitReader(r, 1)); n > 0 {
			return nil, 0, errors.New("body longer than its Content-Length")
		}
		return buf, length, nil
	}
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

// storeAttachments lists the email's attachments, downloads each in turn
// and adds it to the message being inserted, so that at most one
// attachment's content is held at a time. An email whose answer listed no
// attachments costs no API call.
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
	for _, a := range listed {
		size, ok := sizes[a.Id]
		if !ok {
			size = -1
		}
		at, err := h.downloads.fetch(ctx, a, size)
		if err != nil {
			return err
		}
		if err := w.Add(ctx, at); err != nil {
			return err
		}
	}
	return nil
}
