package support

import (
	"context"
	"fmt"
)

const queuedSQL = `SELECT EXISTS (SELECT 1 FROM support_messages WHERE source = $1 AND external_id = $2)`

// Queued reports whether the message of source and externalID is stored
// already. It is a hint, one short query on its own connection, for work
// worth sparing before Enqueue (a redelivered mail's attachment downloads):
// Enqueue alone decides, under the table's unique keys, whether a message
// is new.
func (q *Queue) Queued(ctx context.Context, source, externalID string) (bool, error) {
	var ok bool
	if err := q.pool.QueryRow(ctx, queuedSQL, source, externalID).Scan(&ok); err != nil {
		return false, fmt.Errorf("is %s message %s queued: %w", source, externalID, err)
	}
	return ok, nil
}
