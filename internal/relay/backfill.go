package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/munchable/munchable-webhooks/internal/access"
)

// BackfillConfig is what Backfill runs on.
type BackfillConfig struct {
	App     *AppWebhook
	Answers *access.Store
	// Rate is how many answers a second it sends at most (0: 10).
	Rate float64
	// Tries is how many times one answer is tried before it is counted
	// failed and the backfill goes on (0: 3); Wait is the pause between
	// tries (0: 5 s), longer when the app said Retry-After.
	Tries int
	Wait  time.Duration
	// Progress, when not nil, hears the counts after every page.
	Progress func(BackfillResult)
}

// BackfillResult counts what a backfill did. Failed lists the customers
// whose answer the app did not take, for a second run or a look.
type BackfillResult struct {
	Customers int      `json:"customers"`
	Delivered int      `json:"delivered"`
	Failed    []string `json:"failed"`
	// Next is the page cursor the backfill stopped before ("" once it
	// went through every customer).
	Next string `json:"next"`
}

// backfillPage is how many customers one read takes.
const backfillPage = 200

// Backfill sends every customer's current answer to the app once, as
// access.changed, in stripe_customer_id order and paced: for an app that
// turns access on after the fact. Each answer is read just before it
// goes, so it is as new as the relay's; an app that keeps the highest
// version per customer may take both in any order. It starts after the
// cursor after ("" : the first customer) and returns when every customer
// has been tried or ctx ends.
func Backfill(ctx context.Context, cfg BackfillConfig, after string) (BackfillResult, error) {
	if cfg.Tries <= 0 {
		cfg.Tries = 3
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 5 * time.Second
	}
	limit := newLimiter(cfg.Rate)
	if cfg.Rate <= 0 {
		limit = newLimiter(10)
	}
	res := BackfillResult{Failed: []string{}, Next: after}
	for {
		page, next, err := cfg.Answers.Page(ctx, res.Next, backfillPage)
		if err != nil {
			return res, err
		}
		for _, stale := range page {
			if err := limit.wait(ctx); err != nil {
				return res, err
			}
			res.Customers++
			if err := backfillOne(ctx, cfg, stale.StripeCustomerID); err != nil {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				res.Failed = append(res.Failed, stale.StripeCustomerID)
				continue
			}
			res.Delivered++
		}
		res.Next = next
		if cfg.Progress != nil {
			cfg.Progress(res)
		}
		if next == "" {
			return res, nil
		}
	}
}

// backfillOne sends customer's answer, read again at each try.
func backfillOne(ctx context.Context, cfg BackfillConfig, customer string) error {
	var err error
	for try := 1; try <= cfg.Tries; try++ {
		var ans access.Answer
		ans, err = cfg.Answers.Customer(ctx, customer)
		if err == nil {
			_, err = cfg.App.SendAnswer(ctx, ans)
		}
		if err == nil || errors.Is(err, ErrPermanent) || try == cfg.Tries {
			break
		}
		wait := cfg.Wait
		if ra, ok := errors.AsType[*RetryAfterError](err); ok && ra.After > wait {
			wait = ra.After
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	if err != nil {
		return fmt.Errorf("backfill %s: %w", customer, err)
	}
	return nil
}
