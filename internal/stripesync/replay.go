package stripesync

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/stripehook"
)

// Window is how far back Stripe keeps events, and so how far Replay can
// reach.
const Window = 30 * 24 * time.Hour

// ReplayConfig is what Replay works with.
type ReplayConfig struct {
	API *client.API
	// Receiver decodes each listed event; Endpoint runs it through the
	// claim, with the same keys as a webhook delivery.
	Receiver *stripehook.Receiver
	Endpoint *claim.Endpoint
	// Since is the oldest creation time replayed; Undelivered asks Stripe
	// only for events whose webhook delivery has not succeeded.
	Since       time.Time
	Undelivered bool
	// A nil Logger discards; a nil Progress reports nothing.
	Logger   *slog.Logger
	Progress Progress
}

// ReplayCounts is what a replay did; its String is the summary line.
type ReplayCounts struct {
	Listed                                             int
	Processed, Duplicate, Stale, Unordered, InProgress int
	Failed, Ignored                                    int
	// Unchanged counts the processed events the store already held as its
	// last (applied before, by a delivery whose claim is gone: one that
	// ran degraded, or a Redis that lost its keys).
	Unchanged int
	Requests  int
}

func (n ReplayCounts) String() string {
	return fmt.Sprintf("%d events: %d processed, %d duplicate, %d stale, %d unordered, %d in progress, %d failed, %d ignored; %d API requests",
		n.Listed, n.Processed, n.Duplicate, n.Stale, n.Unordered, n.InProgress, n.Failed, n.Ignored, n.Requests)
}

// count adds one event's result.
func (n *ReplayCounts) count(res claim.Result) {
	switch {
	case res.Outcome == claim.Processed && res.Effect == claim.Stale:
		n.Stale++
	case res.Outcome == claim.Processed && res.Effect == claim.Unordered:
		n.Unordered++
	case res.Outcome == claim.Processed:
		n.Processed++
		if res.Effect == claim.Unchanged {
			n.Unchanged++
		}
	case res.Outcome == claim.Duplicate:
		n.Duplicate++
	case res.Outcome == claim.InProgress:
		n.InProgress++
	case res.Outcome == claim.Ignored:
		n.Ignored++
	default:
		n.Failed++
	}
}

// Replay runs the handled events created since cfg.Since through the
// claim, oldest first. Stripe lists newest first, so a first pass finds
// the oldest event and a second walks from it towards the newest with
// ending_before (stripe-go hands those pages over oldest first): two
// listings, and memory for one page, however many events the window holds.
func Replay(ctx context.Context, cfg ReplayConfig) (n ReplayCounts, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string, int, int) {}
	}
	l := stripehook.NewLister(cfg.API)
	defer func() { n.Requests = l.Requests() }()

	oldestID, oldest, total, err := findOldest(ctx, l, cfg.params())
	if err != nil {
		return n, fmt.Errorf("list events: %w", err)
	}
	if oldest == nil {
		return n, nil
	}
	cfg.Progress("events", 0, total)
	replay := func(id string, raw []byte) error {
		// Stopped (SIGTERM, a sweep's leadership lost): the rest of the
		// page is left to the next run, not run without its claims.
		if err := ctx.Err(); err != nil {
			return err
		}
		n.Listed++
		cfg.Progress("events", n.Listed, total)
		n.count(cfg.replayOne(ctx, id, raw))
		return nil
	}
	if err := replay(oldestID, oldest); err != nil {
		return n, err
	}
	p := cfg.params()
	p.EndingBefore = stripe.String(oldestID)
	if err := l.List(ctx, "/v1/events", p, replay); err != nil {
		return n, fmt.Errorf("list events after %s: %w", oldestID, err)
	}
	// An event another attempt holds is not done: after an outage its
	// holder may be a dead process, and Stripe may have stopped retrying.
	if n.Failed > 0 || n.InProgress > 0 {
		return n, fmt.Errorf("%d events failed (logged above) and %d were held by another attempt; replay again once their claims end (claims stuck): done ones are duplicates", n.Failed, n.InProgress)
	}
	return n, nil
}

// params asks for the handled events of the window, a full page at a time.
func (cfg ReplayConfig) params() *stripe.EventListParams {
	p := &stripe.EventListParams{
		Types:        stripe.StringSlice(stripehook.HandledTypes()),
		CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: cfg.Since.Unix()},
	}
	if cfg.Undelivered {
		p.DeliverySuccess = stripe.Bool(false)
	}
	p.Limit = stripe.Int64(100)
	return p
}

// findOldest walks the listing to its end, the oldest event, counting.
func findOldest(ctx context.Context, l *stripehook.Lister, p *stripe.EventListParams) (id string, raw []byte, total int, err error) {
	err = l.List(ctx, "/v1/events", p, func(eid string, eraw []byte) error {
		id, raw = eid, eraw
		total++
		return nil
	})
	return id, raw, total, err
}

// replayOne runs one event through the claim exactly as a delivery would,
// with the same key. The body goes unfingerprinted (nil): the API renders
// an event in other bytes than the webhook did, and a fingerprint would
// report every duplicate as an id reused with another body.
func (cfg ReplayConfig) replayOne(ctx context.Context, id string, raw []byte) claim.Result {
	ev, err := cfg.Receiver.Event(raw)
	if err != nil {
		cfg.Logger.Error("replay: unreadable event", "event_id", id, "err", err)
		return claim.Result{Outcome: claim.Failed}
	}
	res, _ := cfg.Endpoint.Process(ctx, nil, ev) // the flow logs each outcome
	return res
}
