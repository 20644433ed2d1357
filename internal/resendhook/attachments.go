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
func (d downloader) fetch(ctx context.Context, a resend.EmailAttachment, listedSize int64) (download, error) {
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
		return download{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
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
	if err := dl.receive(resp.Body, d.max); err != nil {
		dl.Close()
		return download{}, fmt.Errorf("download attachment %s: %w", a.Id, err)
	}
	if resp.ContentLength >= 0 && dl.at.Size != resp.ContentLength {
		dl.Close()
		return download{}, fmt.Errorf("download attachment %s: %d bytes of %d", a.Id, dl.at.Size, resp.ContentLength)
	}
	return dl, nil
}

// receive reads body to its end: the first inMemoryBytes into memory, the
// rest, up to max in all, into a temporary file. Past max the content is
// dropped and counted on to its end, so the row keeps the true size.
func (dl *download) receive(body io.Reader, max int64) error {
	head, err := io.ReadAll(io.LimitReader(body, min(max, inMemoryBytes)+1))
	if err != nil {
		return err
	}
	size := int64(len(head))
	if size <= min(max, inMemoryBytes) {
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
		n, err := io.Copy(dl.file, io.LimitReader(body, max+1-size))
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
func (h *handler) downloadAttachments(ctx context.Context, e *receivedEmail) (downloads, error) {
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
	listed, err := listAttachments(ctx, h.client, e.ID)
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
		dl, err := h.downloads.fetch(ctx, a, size)
		if err != nil {
			out.Close()
			return nil, err
		}
		out = append(out, dl)
	}
	return out, nil
}
