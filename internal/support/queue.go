// Package support is the support queue: the messages customers send us, by
// mail (through the Resend webhook) or through the site's support form.
package support

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/ledger"
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

	// ReplyTo is the first Reply-To address: where an answer goes.
	ReplyTo string
	// InReplyTo and References are the mail's headers as sent: the raw
	// In-Reply-To value, and the Message-IDs of References in their order
	// (oldest first). Enqueue threads the message through them.
	InReplyTo  string
	References []string
	// AuthSPF, AuthDKIM and AuthDMARC are the receiving server's verdicts,
	// as the provider reports them ("" when it reports none).
	AuthSPF, AuthDKIM, AuthDMARC string
	// AuthSkipped is true when the provider sent its verdicts but they were
	// not read (skipped to keep memory bounded; the Auth fields are then
	// ""). Unlike no verdicts at all (mail from before the provider had
	// them), a skipped verdict may be a DMARC fail, so the message joins
	// no thread.
	AuthSkipped bool
	// SenderAuthenticated is true when DMARC passed, false when it failed,
	// nil otherwise. Only true makes FromAddress trustworthy.
	SenderAuthenticated *bool
	// AutoSubmitted is the mail's Auto-Submitted header (RFC 3834) as
	// sent, "" when absent: anything but "no" marks an automatic message
	// (an auto-reply, a bounce), which the forward to the team skips.
	AutoSubmitted string
}

// Queue stores support messages in Postgres.
type Queue struct {
	pool *pgxpool.Pool
}

// NewQueue returns a Queue on pool.
func NewQueue(pool *pgxpool.Pool) *Queue {
	return &Queue{pool: pool}
}

// threadSQL finds the conversation of the first candidate Message-ID that a
// stored mail has, candidates in order of preference: In-Reply-To, then
// References newest first, among the conversations the sender ($2) takes
// part in: one where that address already wrote, or where a message asked
// for answers to it (its Reply-To: our reply went there). Naming a
// Message-ID is not enough, as anyone who has seen one (a Cc, a forward, a
// guess) can name it. support_messages_email_message (leading column
// message_id) serves the lookup, and the (thread_id, id) index the
// participant check.
const threadSQL = `
SELECT c.thread FROM (
    SELECT coalesce(thread_id, id) AS thread, array_position($1::text[], message_id) AS rank, id
    FROM support_messages
    WHERE source = 'email' AND message_id = ANY($1::text[])
) c
WHERE EXISTS (
    SELECT 1 FROM support_messages p
    WHERE (p.thread_id = c.thread OR p.id = c.thread)
      AND (lower(p.from_address) = lower($2) OR lower(p.reply_to) = lower($2)))
ORDER BY c.rank, c.id
LIMIT 1`

// insertSQL leaves the duplicate check to the table's unique indexes, so
// two concurrent deliveries of one message cannot both pass a look-then-
// insert: one inserts, the other waits for it to commit and gets no row.
// The id is drawn first so that a message starting its own thread can name
// itself in thread_id within the one statement (a volatile CTE runs once).
const insertSQL = `
WITH next AS (SELECT nextval(pg_get_serial_sequence('support_messages', 'id')) AS id)
INSERT INTO support_messages (
    id, thread_id, source, external_id, from_address, from_name, to_address,
    subject, text_body, html_body, message_id, content_hash, received_at,
    reply_to, in_reply_to, message_references, auth_spf, auth_dkim, auth_dmarc,
    sender_authenticated, auto_submitted)
VALUES ((SELECT id FROM next), coalesce($1, (SELECT id FROM next)), $2, $3, $4, $5, $6,
    $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
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

// errConflictGone: the insert conflicted with a row the lookup then did not
// find (deleted in between); the attempt is repeated.
var errConflictGone = errors.New("conflicting row disappeared")

// Enqueue inserts m unless it is already queued, and returns the id of the
// row that holds it. It is idempotent at the store: one row per (source,
// external id), and for email one row per (Message-ID, content hash) where
// the Message-ID is present, so the same mail under two Resend ids is one
// message while another mail reusing a Message-ID is kept.
func (q *Queue) Enqueue(ctx context.Context, m Message) (id int64, inserted bool, err error) {
	return q.EnqueueWith(ctx, m, nil)
}

// EnqueueWith is Enqueue, and when m is newly inserted it also runs attach in
// the insert's transaction: the message and what attach writes commit
// together, or (attach failed) neither does. A message already queued runs
// no attach, so a redelivery cannot write its attachments twice.
// attach runs while the transaction holds a pooled connection: it must only
// write what is already at hand (downloads happen before EnqueueWith), never
// wait on a network call.
func (q *Queue) EnqueueWith(ctx context.Context, m Message, attach func(context.Context, *Attachments) error) (id int64, inserted bool, err error) {
	return q.EnqueueFor(ctx, nil, m, attach)
}

// EnqueueFor is EnqueueWith for the event e (a Resend delivery; nil for a
// form post), whose ledger row it writes in the same transaction: applied
// when the message was inserted, unchanged when it was already queued.
func (q *Queue) EnqueueFor(ctx context.Context, e *ledger.Entry, m Message, attach func(context.Context, *Attachments) error) (id int64, inserted bool, err error) {
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
	for range enqueueAttempts {
		err := pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
			var err error
			id, inserted, err = enqueue(ctx, tx, m)
			if err != nil {
				return err
			}
			if err := record(ctx, tx, e, id, inserted); err != nil {
				return err
			}
			if !inserted || attach == nil {
				return nil
			}
			return attach(ctx, &Attachments{tx: tx, messageID: id})
		})
		if !errors.Is(err, errConflictGone) {
			if err != nil {
				return 0, false, fmt.Errorf("enqueue %s message %s: %w", m.Source, m.ExternalID, err)
			}
			return id, inserted, nil
		}
	}
	return 0, false, fmt.Errorf("enqueue %s message %s: %w, %d times", m.Source, m.ExternalID, errConflictGone, enqueueAttempts)
}

// enqueue threads and inserts m within tx, or finds the row it conflicts
// with.
func enqueue(ctx context.Context, tx pgx.Tx, m Message) (id int64, inserted bool, err error) {
	var hash []byte // NULL for the form: its duplicates are caught by the idempotency key
	if m.Source == SourceEmail {
		hash = contentHash(m)
	}
	var thread *int64
	if candidates := threadCandidates(m); len(candidates) > 0 {
		var t int64
		err := tx.QueryRow(ctx, threadSQL, candidates, m.FromAddress).Scan(&t)
		switch {
		case err == nil:
			thread = &t
		case !errors.Is(err, pgx.ErrNoRows):
			return 0, false, fmt.Errorf("find thread: %w", err)
		}
	}
	msgID := nullString(m.MessageID)
	err = tx.QueryRow(ctx, insertSQL,
		thread, m.Source, m.ExternalID, m.FromAddress, nullString(m.FromName),
		nullString(m.ToAddress), nullString(m.Subject), nullString(m.TextBody),
		nullString(m.HTMLBody), msgID, hash, m.ReceivedAt,
		nullString(m.ReplyTo), nullString(m.InReplyTo), nullStrings(m.References),
		nullString(m.AuthSPF), nullString(m.AuthDKIM), nullString(m.AuthDMARC),
		m.SenderAuthenticated, nullString(m.AutoSubmitted),
	).Scan(&id)
	if err == nil {
		return id, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, false, err
	}
	err = tx.QueryRow(ctx, existingSQL, m.Source, m.ExternalID, msgID, hash).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, errConflictGone
	}
	if err != nil {
		return 0, false, fmt.Errorf("look up queued message: %w", err)
	}
	return id, false, nil
}

// recordSQL appends the feed's change for a message just inserted ($3)
// and, for a delivery ($2 not null), writes its ledger row, with the
// ledger's fragments. It runs in the enqueue's transaction after the
// insert: the message, its change and its event's row commit together.
// The change leaves out the bodies and the content hash: the app reads a
// message by its id (the change's subject), and the feed stays small.
const recordSQL = `
WITH old(j) AS (SELECT NULL::jsonb WHERE false),
new(kind, subject, customer, event_id, j) AS (
    SELECT '` + ledger.KindSupportMessage + `', m.id::text, NULL::text, $2::text,
        to_jsonb(m) - '{text_body,html_body,content_hash}'::text[]
    FROM support_messages m WHERE m.id = $1::bigint AND $3::boolean
), judged(provider, event_id, event_type, subject, outcome) AS (
    VALUES ($4::text, $2::text, $5::text, $1::bigint::text,
        CASE WHEN $3::boolean THEN 'applied' ELSE 'unchanged' END)
),` + ledger.AppendCTE + `,` + ledger.RecordCTE + `
SELECT`

// record runs recordSQL when there is something to write: a new message
// (its change), or a delivery (its ledger row).
func record(ctx context.Context, tx pgx.Tx, e *ledger.Entry, id int64, inserted bool) error {
	if e == nil && !inserted {
		return nil
	}
	var provider, eventID, eventType *string
	if e != nil {
		provider, eventID, eventType = &e.Provider, &e.EventID, nullString(e.Type)
	}
	if err := ledger.SetTrace(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, recordSQL, id, eventID, inserted, provider, eventType); err != nil {
		return fmt.Errorf("record message %d: %w", id, err)
	}
	return nil
}

// threadCandidates lists the Message-IDs m answers, most direct first: those
// of In-Reply-To, then References from the newest (last) back. Only a mail
// whose sender is authenticated answers any (SenderProven); a form message,
// a mail with any other verdict or none, one whose verdicts were skipped,
// or one that names no sender starts its own thread, keeping In-Reply-To
// as sent.
func threadCandidates(m Message) []string {
	if m.Source != SourceEmail || m.FromAddress == "" || !m.SenderProven() {
		return nil
	}
	out := MessageIDs(m.InReplyTo)
	for _, ref := range slices.Backward(m.References) {
		out = append(out, ref)
	}
	return out
}

// SenderProven reports whether the receiving server authenticated the
// mail's sender: DMARC pass, or DMARC none (the domain publishes no
// policy) with SPF and DKIM both pass. Anything else (fail, none alone,
// temperror, an unknown word, no verdict, verdicts skipped for size) may
// be a spoof of the From address, which a thread must not believe.
func (m Message) SenderProven() bool {
	if m.AuthSkipped {
		return false
	}
	is := func(v, want string) bool { return strings.EqualFold(strings.TrimSpace(v), want) }
	return is(m.AuthDMARC, "pass") || (is(m.AuthDMARC, "none") && is(m.AuthSPF, "pass") && is(m.AuthDKIM, "pass"))
}

// MessageIDs returns the "<...>" Message-IDs of an In-Reply-To or References
// header value, in order. A value with no angle brackets is taken as one id
// as it stands (some mailers drop them).
func MessageIDs(header string) []string {
	header = strings.TrimSpace(header)
	var out []string
	for rest := header; ; {
		start := strings.IndexByte(rest, '<')
		if start < 0 {
			break
		}
		end := strings.IndexByte(rest[start:], '>')
		if end < 0 {
			break
		}
		out = append(out, rest[start:start+end+1])
		rest = rest[start+end+1:]
	}
	if len(out) == 0 && header != "" && !strings.ContainsAny(header, "<> \t\r\n") {
		out = append(out, header)
	}
	return out
}

// Attachment is one file of a queued mail, as Attachments.Add stores it.
type Attachment struct {
	// ExternalID is the provider's attachment id, unique per message.
	ExternalID         string
	Filename           string
	ContentType        string
	ContentDisposition string
	// ContentID matches a "cid:" reference in the message's HTML.
	ContentID string
	// Size is the content's length in bytes, -1 when unknown.
	Size int64
	// NoContentReason says why the content is not stored; "" when it is.
	NoContentReason string
}

// Reasons an attachment has no content.
const (
	NoContentTooLarge      = "too_large"
	NoContentNotFound      = "not_found"
	NoContentGone          = "gone"
	NoContentNoDownloadURL = "no_download_url"
	// NoContentRefused: the download URL, or a redirect from it, was not
	// https or led to an address that is not public.
	NoContentRefused = "refused"
)

// Attachments writes the attachments of a message EnqueueWith has just
// inserted, in its transaction.
type Attachments struct {
	tx        pgx.Tx
	messageID int64
}

// copyAttachmentSQL streams one row in COPY's binary format (see
// attachmentCopy): a bytea parameter of an INSERT would be copied whole
// into pgx's buffers twice, while COPY sends the content on in 64 KiB
// pieces as it is read.
const copyAttachmentSQL = `COPY support_attachments (
    support_message_id, external_id, filename, content_type, content_disposition,
    content_id, size, no_content_reason, content, sha256) FROM STDIN WITH (FORMAT binary)`

// Add stores at. With content non-nil, exactly at.Size bytes of it are
// streamed into the row as they are read, and their SHA-256 beside them;
// fewer bytes (a download cut short) fail the whole transaction. With
// content nil, the row records the attachment without it.
func (a *Attachments) Add(ctx context.Context, at Attachment, content io.Reader) error {
	if content != nil && (at.Size < 0 || at.Size > math.MaxInt32) {
		return fmt.Errorf("store attachment %s: content of size %d", at.ExternalID, at.Size)
	}
	if _, err := a.tx.Conn().PgConn().CopyFrom(ctx, attachmentCopy(a.messageID, at, content), copyAttachmentSQL); err != nil {
		return fmt.Errorf("store attachment %s: %w", at.ExternalID, err)
	}
	return nil
}

// attachmentCopy is the COPY binary stream of one support_attachments row:
// the header, the fields before the content, the content as it is read,
// then its SHA-256 (known only once the content is through) and the
// trailer.
func attachmentCopy(messageID int64, at Attachment, content io.Reader) io.Reader {
	b := append([]byte("PGCOPY\n\xff\r\n\x00"), 0, 0, 0, 0, 0, 0, 0, 0) // signature, flags, no extension
	b = binary.BigEndian.AppendUint16(b, 10)                            // fields
	b = appendInt8(b, messageID)
	for _, s := range []string{at.ExternalID, at.Filename, at.ContentType, at.ContentDisposition, at.ContentID} {
		b = appendText(b, cleanText(s))
	}
	if at.Size < 0 {
		b = appendNull(b)
	} else {
		b = appendInt8(b, at.Size)
	}
	b = appendText(b, at.NoContentReason)
	if content == nil {
		b = appendNull(b) // content
		b = appendNull(b) // sha256
		return bytes.NewReader(binary.BigEndian.AppendUint16(b, 0xffff))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(at.Size))
	h := sha256.New()
	tail := func() []byte {
		t := binary.BigEndian.AppendUint32(nil, sha256.Size)
		return binary.BigEndian.AppendUint16(h.Sum(t), 0xffff)
	}
	return io.MultiReader(bytes.NewReader(b), io.TeeReader(&exactly{r: content, left: at.Size}, h), &lazyReader{make: tail})
}

func appendInt8(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(b, 8), uint64(v))
}

// appendText appends a text field, NULL for "".
func appendText(b []byte, s string) []byte {
	if s == "" {
		return appendNull(b)
	}
	return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
}

func appendNull(b []byte) []byte {
	return binary.BigEndian.AppendUint32(b, 0xffffffff)
}

// exactly reads left bytes of r, and fails with io.ErrUnexpectedEOF if r
// ends before.
type exactly struct {
	r    io.Reader
	left int64
}

func (e *exactly) Read(p []byte) (int, error) {
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if e.left > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	return n, err
}

// lazyReader reads what make returns, called at the first Read: after the
// readers before it in an io.MultiReader are done.
type lazyReader struct {
	make func() []byte
	r    *bytes.Reader
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil {
		l.r = bytes.NewReader(l.make())
	}
	return l.r.Read(p)
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

// nextIDSQL takes the next value of the id sequence, as an insert does.
const nextIDSQL = `SELECT nextval(pg_get_serial_sequence('support_messages', 'id'))`

// nextID takes the id the next inserted message would have had: it is no
// message's, and none will ever have it.
func (q *Queue) nextID(ctx context.Context) (int64, error) {
	var id int64
	if err := q.pool.QueryRow(ctx, nextIDSQL).Scan(&id); err != nil {
		return 0, fmt.Errorf("next support message id: %w", err)
	}
	return id, nil
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
		&m.TextBody, &m.HTMLBody, &m.MessageID, &m.ReplyTo, &m.InReplyTo,
		&m.AuthSPF, &m.AuthDKIM, &m.AuthDMARC, &m.AutoSubmitted} {
		*s = cleanText(*s)
	}
	refs := make([]string, len(m.References))
	for i, r := range m.References {
		refs[i] = cleanText(r)
	}
	m.References = refs
	return m
}

func cleanText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
}

// nullStrings is NULL for an empty list.
func nullStrings(ss []string) []string {
	if len(ss) == 0 {
		return nil
	}
	return ss
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
