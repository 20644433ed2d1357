// Package support is the support queue: the messages customers send us, by
// mail (through the Resend webhook) or through the site's support form.
package support

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sources of a message, as stored in support_messages.source.
const (
	SourceEmail = "email"
	SourceWeb   = "web"
)

// Message is one support message.
type Message struct {
	Source string
	// ExternalID identifies the message at its source: the Resend email id,
	// or the form's idempotency key. Unique per source.
	ExternalID  string
	FromAddress string
	FromName    string
	ToAddress   string
	Subject     string
	TextBody    string
	HTMLBody    string
	// MessageID is the RFC 5322 Message-ID of an email, "" for the form.
	MessageID  string
	ReceivedAt time.Time
}

// Queue stores support messages in Postgres.
type Queue struct {
	pool *pgxpool.Pool
}

// NewQueue returns a Queue on pool.
func NewQueue(pool *pgxpool.Pool) *Queue {
	return &Queue{pool: pool}
}

// insertSQL leaves the duplicate check to the table's unique indexes, so
// two concurrent deliveries of one message cannot both pass a look-then-
// insert: one inserts, the other waits for it to commit and gets no row.
const insertSQL = `
INSERT INTO support_messages (
    source, external_id, from_address, from_name, to_address, subject,
    text_body, html_body, message_id, content_hash, received_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT DO NOTHING
RETURNING id`

// existingSQL finds the row an insert conflicted with, under either unique
// key. It runs as its own statement, so (read committed) it sees the row a
// concurrent winner committed after the insert's snapshot was taken. The
// (source, external_id) match is preferred when both keys match rows.
const existingSQL = `
SELECT id FROM support_messages
WHERE (source = $1 AND external_id = $2)
   OR (source = 'email' AND $1 = 'email' AND message_id = $3 AND content_hash = $4)
ORDER BY (source = $1 AND external_id = $2) DESC, id
LIMIT 1`

// enqueueAttempts bounds the insert-then-look-up loop: the lookup comes back
// empty only if the conflicting row was deleted between the two statements.
const enqueueAttempts = 3

// Enqueue inserts m unless it is already queued, and returns the id of the
// row that holds it. It is idempotent at the store: one row per (source,
// external id), and for email one row per (Message-ID, content hash) where
// the Message-ID is present, so the same mail under two Resend ids is one
// message while another mail reusing a Message-ID is kept.
func (q *Queue) Enqueue(ctx context.Context, m Message) (id int64, inserted bool, err error) {
	if m.Source != SourceEmail && m.Source != SourceWeb {
		return 0, false, fmt.Errorf("enqueue: unknown source %q", m.Source)
	}
	if m.ExternalID == "" {
		return 0, false, errors.New("enqueue: empty external id")
	}
	m = clean(m)
	if m.ReceivedAt.IsZero() {
		m.ReceivedAt = time.Now()
	}
	var hash []byte // NULL for the form: its duplicates are caught by the idempotency key
	if m.Source == SourceEmail {
		hash = contentHash(m)
	}
	msgID := nullString(m.MessageID)
	for range enqueueAttempts {
		err := q.pool.QueryRow(ctx, insertSQL,
			m.Source, m.ExternalID, m.FromAddress, nullString(m.FromName),
			nullString(m.ToAddress), nullString(m.Subject), nullString(m.TextBody),
			nullString(m.HTMLBody), msgID, hash, m.ReceivedAt,
		).Scan(&id)
		if err == nil {
			return id, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, false, fmt.Errorf("enqueue %s message %s: %w", m.Source, m.ExternalID, err)
		}
		err = q.pool.QueryRow(ctx, existingSQL, m.Source, m.ExternalID, msgID, hash).Scan(&id)
		if err == nil {
			return id, false, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, false, fmt.Errorf("look up queued %s message %s: %w", m.Source, m.ExternalID, err)
		}
	}
	return 0, false, fmt.Errorf("enqueue %s message %s: conflicting row kept disappearing", m.Source, m.ExternalID)
}

const getSQL = `
SELECT source, external_id, from_address, coalesce(from_name, ''),
       coalesce(to_address, ''), coalesce(subject, ''), coalesce(text_body, ''),
       coalesce(html_body, ''), coalesce(message_id, ''), received_at
FROM support_messages WHERE id = $1`

// ErrNotFound is returned by Get for an id with no message.
var ErrNotFound = errors.New("support message not found")

// Get returns the message stored under id. Columns stored as NULL come back
// as "".
func (q *Queue) Get(ctx context.Context, id int64) (Message, error) {
	var m Message
	err := q.pool.QueryRow(ctx, getSQL, id).Scan(&m.Source, &m.ExternalID, &m.FromAddress,
		&m.FromName, &m.ToAddress, &m.Subject, &m.TextBody, &m.HTMLBody, &m.MessageID, &m.ReceivedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Message{}, fmt.Errorf("support message %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Message{}, fmt.Errorf("get support message %d: %w", id, err)
	}
	return m, nil
}

// contentHash is sha256 over the sender, subject and bodies, NUL-separated
// (clean has removed any NUL from the fields, so the encoding is unambiguous).
func contentHash(m Message) []byte {
	h := sha256.New()
	for i, s := range []string{m.FromAddress, m.Subject, m.TextBody, m.HTMLBody} {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(s))
	}
	return h.Sum(nil)
}

// clean makes every text field storable: Postgres text refuses NUL bytes and
// invalid UTF-8, and a message that can never be inserted would fail its
// delivery on every retry until the provider gives up on it.
func clean(m Message) Message {
	for _, s := range []*string{&m.FromAddress, &m.FromName, &m.ToAddress, &m.Subject,
		&m.TextBody, &m.HTMLBody, &m.MessageID} {
		*s = strings.ToValidUTF8(strings.ReplaceAll(*s, "\x00", ""), "\uFFFD")
	}
	return m
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
