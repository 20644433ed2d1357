package support

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoAttachment: the message has no attachment of that name.
var ErrNoAttachment = errors.New("no such attachment")

// ErrNoContent: the attachment is recorded but its bytes were not stored
// (too large, or gone at the provider); the error says why.
var ErrNoContent = errors.New("content not stored")

// ThreadMessage is one message of a conversation, in Shown.Thread.
type ThreadMessage struct {
	ID       int64     `json:"id"`
	Received time.Time `json:"received"`
	From     string    `json:"from"`
	Subject  string    `json:"subject"`
}

// Shown is a whole message, as support show prints it. Every text field
// is as stored: one-line fields were cleaned on the way in (OneLine);
// Text and the HTML body are untrusted, as the sender wrote them.
type Shown struct {
	ID                  int64
	Source, ExternalID  string
	Received, Queued    time.Time
	FromAddress         string
	FromName            string
	ToAddress           string
	ReplyTo             string
	Subject             string
	MessageID           string
	InReplyTo           string
	References          []string
	AuthSPF, AuthDKIM   string
	AuthDMARC           string
	SenderAuthenticated *bool
	AutoSubmitted       string
	Text                string
	HTMLBytes           int
	// Attachments are the mail's files, without their bytes
	// (AttachmentContent); NoContentReason says why one has none.
	Attachments []Attachment
	// ThreadID is the conversation's first message; Thread lists every
	// message of it, this one included, oldest first.
	ThreadID int64
	Thread   []ThreadMessage
	Forward  Forward
}

const showSQL = `
SELECT m.id, m.source, m.external_id, m.received_at, m.created_at, m.from_address, coalesce(m.from_name, ''),
    coalesce(m.to_address, ''), coalesce(m.reply_to, ''), coalesce(m.subject, ''), coalesce(m.message_id, ''),
    coalesce(m.in_reply_to, ''), coalesce(m.message_references, '{}'), coalesce(m.auth_spf, ''),
    coalesce(m.auth_dkim, ''), coalesce(m.auth_dmarc, ''), m.sender_authenticated, coalesce(m.auto_submitted, ''),
    coalesce(m.text_body, ''), coalesce(octet_length(m.html_body), 0), coalesce(m.thread_id, m.id), ` + forwardCols + `
FROM support_messages m` + forwardJoin + `
WHERE m.id = $1`

const attachmentsSQL = `
SELECT external_id, coalesce(filename, ''), coalesce(content_type, ''), coalesce(content_disposition, ''),
    coalesce(content_id, ''), coalesce(size, -1), coalesce(no_content_reason, '')
FROM support_attachments WHERE support_message_id = $1 ORDER BY id`

// threadListSQL's (thread_id, id) index is support_messages_thread.
const threadListSQL = `
SELECT id, received_at, from_address, coalesce(subject, '')
FROM support_messages WHERE thread_id = $1 ORDER BY id`

// Show reads message id whole, but for its HTML body and attachments'
// bytes (HTML and AttachmentContent).
func Show(ctx context.Context, pool *pgxpool.Pool, id int64) (Shown, error) {
	fc, err := readForwardConsumer(ctx, pool)
	if err != nil {
		return Shown{}, err
	}
	var s Shown
	var fr forwardRow
	err = pool.QueryRow(ctx, showSQL, id).Scan(&s.ID, &s.Source, &s.ExternalID, &s.Received, &s.Queued,
		&s.FromAddress, &s.FromName, &s.ToAddress, &s.ReplyTo, &s.Subject, &s.MessageID, &s.InReplyTo,
		&s.References, &s.AuthSPF, &s.AuthDKIM, &s.AuthDMARC, &s.SenderAuthenticated, &s.AutoSubmitted,
		&s.Text, &s.HTMLBytes, &s.ThreadID,
		&fr.changeID, &fr.txid, &fr.state, &fr.f.Attempts, &fr.f.NextAttemptAt, &fr.f.LastError, &fr.f.Result, &fr.f.DeliveredAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Shown{}, fmt.Errorf("support message %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Shown{}, fmt.Errorf("read support message %d: %w", id, err)
	}
	if s.Forward, err = fc.forward(fr); err != nil {
		return Shown{}, err
	}
	rows, err := pool.Query(ctx, attachmentsSQL, id)
	if err != nil {
		return Shown{}, fmt.Errorf("read attachments of %d: %w", id, err)
	}
	s.Attachments, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attachment, error) {
		var a Attachment
		err := row.Scan(&a.ExternalID, &a.Filename, &a.ContentType, &a.ContentDisposition, &a.ContentID, &a.Size, &a.NoContentReason)
		return a, err
	})
	if err != nil {
		return Shown{}, fmt.Errorf("read attachments of %d: %w", id, err)
	}
	rows, err = pool.Query(ctx, threadListSQL, s.ThreadID)
	if err != nil {
		return Shown{}, fmt.Errorf("read thread of %d: %w", id, err)
	}
	s.Thread, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ThreadMessage, error) {
		var m ThreadMessage
		err := row.Scan(&m.ID, &m.Received, &m.From, &m.Subject)
		return m, err
	})
	if err != nil {
		return Shown{}, fmt.Errorf("read thread of %d: %w", id, err)
	}
	return s, nil
}

// HTML returns message id's HTML body as stored ("" when it has none).
func HTML(ctx context.Context, pool *pgxpool.Pool, id int64) (string, error) {
	var html string
	err := pool.QueryRow(ctx, `SELECT coalesce(html_body, '') FROM support_messages WHERE id = $1`, id).Scan(&html)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("support message %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("read support message %d: %w", id, err)
	}
	return html, nil
}

// AttachmentContent returns the bytes of message id's attachment named
// name (the first of that name, in the order the mail listed them).
func AttachmentContent(ctx context.Context, pool *pgxpool.Pool, id int64, name string) ([]byte, error) {
	var content []byte
	var reason string
	err := pool.QueryRow(ctx, `SELECT content, coalesce(no_content_reason, '') FROM support_attachments
		WHERE support_message_id = $1 AND filename = $2 ORDER BY id LIMIT 1`, id, name).Scan(&content, &reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("support message %d, attachment %q: %w", id, name, ErrNoAttachment)
	}
	if err != nil {
		return nil, fmt.Errorf("read attachment %q of %d: %w", name, id, err)
	}
	if content == nil {
		return nil, fmt.Errorf("support message %d, attachment %q: %w (%s)", id, name, ErrNoContent, reason)
	}
	return content, nil
}
