package support

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/relay"
)

// ForwardState is where a message's forward to the team stands: a relay
// delivery's state (pending, delivered, failed, dead, skipped), or one of
// the two a message with no delivery row can be in.
type ForwardState string

const (
	// ForwardOff: forwarding was never switched on (no forward consumer),
	// or it is off and never took the message.
	ForwardOff ForwardState = "off"
	// ForwardNotYet: the forward consumer has not reached the message.
	ForwardNotYet ForwardState = "not_yet"
)

// ForwardStates lists every state support list --state takes.
var ForwardStates = []ForwardState{
	ForwardState(relay.Pending), ForwardState(relay.Delivered), ForwardState(relay.Failed),
	ForwardState(relay.Dead), ForwardState(relay.Skipped), ForwardOff, ForwardNotYet,
}

// Forward is a message's forward to the team, as the relay has it.
type Forward struct {
	State ForwardState `json:"state"`
	// ChangeID is the message's change in the feed, which the forward
	// delivers (relay retry forward CHANGE_ID); nil once retention has
	// deleted it.
	ChangeID      *int64     `json:"change_id"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	LastError     *string    `json:"last_error,omitempty"`
	// Result is Resend's email id of the forward, once delivered.
	Result      *string    `json:"result,omitempty"`
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
}

// Listed is a message as support list prints it.
type Listed struct {
	ID       int64     `json:"id"`
	Source   string    `json:"source"`
	Received time.Time `json:"received"`
	From     string    `json:"from"`
	Subject  string    `json:"subject"`
	Thread   int64     `json:"thread"`
	Forward  Forward   `json:"forward"`
}

// ListQuery selects the messages List reads.
type ListQuery struct {
	// Since: messages queued at or after it.
	Since time.Time
	// Source "" is every source.
	Source string
	// States empty is every forward state.
	States []ForwardState
}

// forwardCols reads a message's change (written in the transaction that
// queued it, so at its created_at: changes_at finds it) and the forward's
// delivery of that change, if the relay wrote one.
const forwardCols = `c.id, c.txid::text, d.state, coalesce(d.attempts, 0), d.next_attempt_at, d.last_error, d.result, d.delivered_at`

const forwardJoin = `
LEFT JOIN LATERAL (
    SELECT id, txid FROM changes
    WHERE at = m.created_at AND kind = '` + ledger.KindSupportMessage + `' AND subject = m.id::text
    ORDER BY id LIMIT 1
) c ON true
LEFT JOIN relay_deliveries d ON d.consumer = '` + relay.ForwardConsumer + `' AND d.change_id = c.id`

// listSQL reads a page of messages after ($1, $3) in (created_at, id)
// order. Pages keep the plan's estimate small: a generic plan of one query
// over every message since D was priced high enough for Postgres to JIT
// compile it, which cost 0.8 s of a 0.86 s run at 2,880 messages a day
// (docs/PERFORMANCE.md).
const listSQL = `
SELECT m.id, m.source, m.received_at, m.from_address, coalesce(m.from_name, ''), coalesce(m.subject, ''),
    coalesce(m.thread_id, m.id), m.created_at, ` + forwardCols + `
FROM support_messages m` + forwardJoin + `
WHERE m.created_at >= $1 AND (m.created_at > $1 OR m.id > $3) AND ($2::text IS NULL OR m.source = $2)
ORDER BY m.created_at, m.id
LIMIT ` + listPageSQL

// listPage is how many messages listSQL reads at a time.
const (
	listPage    = 500
	listPageSQL = "500"
)

// List calls each with every message q selects, oldest first.
func List(ctx context.Context, pool *pgxpool.Pool, q ListQuery, each func(Listed) error) error {
	fc, err := readForwardConsumer(ctx, pool)
	if err != nil {
		return err
	}
	var source *string
	if q.Source != "" {
		source = &q.Source
	}
	after, afterID := q.Since, int64(0)
	for {
		page, err := listPageOf(ctx, pool, fc, after, afterID, source)
		if err != nil {
			return err
		}
		for _, p := range page {
			if len(q.States) > 0 && !containsState(q.States, p.Forward.State) {
				continue
			}
			if err := each(p.Listed); err != nil {
				return err
			}
		}
		if len(page) < listPage {
			return nil
		}
		after, afterID = page[len(page)-1].queued, page[len(page)-1].ID
	}
}

// listed is a Listed with its place in listSQL's order.
type listed struct {
	Listed
	queued time.Time
}

func listPageOf(ctx context.Context, pool *pgxpool.Pool, fc forwardConsumer, after time.Time, afterID int64, source *string) ([]listed, error) {
	rows, err := pool.Query(ctx, listSQL, after, source, afterID)
	if err != nil {
		return nil, fmt.Errorf("list support messages: %w", err)
	}
	defer rows.Close()
	var page []listed
	for rows.Next() {
		var l listed
		var name string
		var fr forwardRow
		err := rows.Scan(&l.ID, &l.Source, &l.Received, &l.From, &name, &l.Subject, &l.Thread, &l.queued,
			&fr.changeID, &fr.txid, &fr.state, &fr.f.Attempts, &fr.f.NextAttemptAt, &fr.f.LastError, &fr.f.Result, &fr.f.DeliveredAt)
		if err != nil {
			return nil, fmt.Errorf("list support messages: %w", err)
		}
		if name != "" {
			l.From = name + " <" + l.From + ">"
		}
		if l.Forward, err = fc.forward(fr); err != nil {
			return nil, err
		}
		page = append(page, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list support messages: %w", err)
	}
	return page, nil
}

func containsState(states []ForwardState, s ForwardState) bool {
	for _, x := range states {
		if x == s {
			return true
		}
	}
	return false
}

// forwardConsumer is the forward consumer's row in feed_consumers.
type forwardConsumer struct {
	exists, enabled bool
	cursor          ledger.Cursor
}

func readForwardConsumer(ctx context.Context, pool *pgxpool.Pool) (forwardConsumer, error) {
	fc := forwardConsumer{exists: true}
	var cursor string
	err := pool.QueryRow(ctx, `SELECT cursor, enabled FROM feed_consumers WHERE name = $1`, relay.ForwardConsumer).Scan(&cursor, &fc.enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return forwardConsumer{}, nil
	}
	if err != nil {
		return fc, fmt.Errorf("read the forward consumer: %w", err)
	}
	if fc.cursor, err = ledger.ParseCursor(cursor); err != nil {
		return fc, fmt.Errorf("the forward consumer's cursor: %w", err)
	}
	return fc, nil
}

// forwardRow is what forwardCols read.
type forwardRow struct {
	changeID *int64
	txid     *string
	state    *string
	f        Forward
}

// forward says where a message's forward stands. A delivery row says it
// outright. Without one, the consumer's cursor does: a change the cursor
// has passed with no row was delivered, since the relay may record a
// delivered change by moving its cursor alone, writing no row (and
// retention deletes delivered rows with their change). So the answer
// holds whether or not delivered forwards have rows. A change retention
// deleted was passed by every enabled consumer before it went. One
// reading it cannot tell apart: a message queued before forwarding was
// first switched on is also behind the cursor with no row, and reads
// delivered.
func (fc forwardConsumer) forward(r forwardRow) (Forward, error) {
	f := r.f
	f.ChangeID = r.changeID
	switch {
	case r.state != nil:
		f.State = ForwardState(*r.state)
	case !fc.exists:
		f.State = ForwardOff
	case r.changeID == nil:
		f.State = ForwardState(relay.Delivered)
		if !fc.enabled {
			f.State = ForwardOff
		}
	default:
		txid, err := strconv.ParseUint(*r.txid, 10, 64)
		if err != nil {
			return f, fmt.Errorf("change %d: txid %q: %w", *r.changeID, *r.txid, err)
		}
		switch {
		case fc.cursor.Passed(txid, *r.changeID):
			f.State = ForwardState(relay.Delivered)
		case fc.enabled:
			f.State = ForwardNotYet
		default:
			f.State = ForwardOff
		}
	}
	return f, nil
}
