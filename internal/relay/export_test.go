package relay

import (
	"context"
	"time"
)

// RegisterWithin is Register waiting at most wait for the transactions
// older than a new start.
func (r *Relay) RegisterWithin(ctx context.Context, wait time.Duration) error {
	return r.register(ctx, wait)
}
