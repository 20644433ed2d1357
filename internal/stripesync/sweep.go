package stripesync

import (
	"context"
	"time"

	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// SweepPass is the Stripe sweep's pass: Replay of the handled events
// created from a time on, oldest first, through the claim with a
// delivery's key. An event whose claim the sweep took first (processed,
// whatever its effect) is recovered: no webhook had delivered it. One
// already done is a duplicate, one Redis call. As with Replay, a failed
// event or one held by another attempt fails the pass, so its position
// stays and the next pass lists the event again. cfg.Since is ignored.
func SweepPass(cfg ReplayConfig) sweep.Pass {
	return func(ctx context.Context, from time.Time) (sweep.Counts, error) {
		cfg.Since = from
		n, err := Replay(ctx, cfg)
		recovered := n.Processed + n.Stale + n.Unordered
		return sweep.Counts{Listed: n.Listed, Recovered: recovered, Delivered: n.Duplicate}, err
	}
}
