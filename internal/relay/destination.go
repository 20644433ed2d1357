package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// Destination is one consumer's far side: it delivers a change and knows
// nothing of the loop that drives it. A delivery's identity is fixed by the
// change (Resend's Idempotency-Key support-message/<id>, the webhook-id
// chg_<id>), so every retry of one change repeats the same identity and a
// receiver that dedupes by it sees one delivery.
type Destination interface {
	// Deliver sends ch. result is what the far side answered that
	// identifies the delivery (Resend's email id, the app's status code).
	// A nil error means delivered. An error wrapping ErrPermanent is dead
	// at once (a 4xx other than 408 and 429); one wrapping ErrSkip is
	// skipped (never sent, the error is the reason); a *RetryAfterError is
	// retried no sooner than its After; any other error is retried on the
	// relay's schedule.
	Deliver(ctx context.Context, ch ledger.Change) (result string, err error)
}

// ErrPermanent marks a failure that no retry can mend.
var ErrPermanent = errors.New("permanent failure")

// ErrSkip marks a change the destination does not send, on purpose.
var ErrSkip = errors.New("skipped")

// RetryAfterError is a failure whose far side said when to come back
// (a 429's or 503's Retry-After).
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.After)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }
