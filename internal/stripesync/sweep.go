package stripesync

import (
	"context"
	"time"

	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// SweepPass is the Stripe sweep's pass: Replay of the handled events
// created from a time on, oldest first, through the claim with a
// delivery's key. An event whose claim the sweep took first and that
// the store had not seen (applied, stale or unordered) is recovered: no
// webhook had delivered it. One already done is a duplicate, one Redis
// call; one the store already held as its last (unchanged) was delivered
// by a webhook whose claim is gone (it ran degraded), so it is delivered
// too, or every Redis outage would read as failing webhooks. As with
// Replay, a failed event or one held by another attempt fails the pass,
// so its position stays and the next pass lists the event again.
// cfg.Since is ignored.
func SweepPass(cfg ReplayConfig) sweep.Pass {
	return func(ctx context.Context, from time.Time) (sweep.Counts, error) {
		cfg.Since = from
		n, err := Replay(ctx, cfg)
		recovered := n.Processed - n.Unchanged + n.Stale + n.Unordered
		return sweep.Counts{Listed: n.Listed, Recovered: recovered, Delivered: n.Duplicate + n.Unchanged}, err
	}
}
