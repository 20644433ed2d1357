package stripehook

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// NewAPI returns a stripe-go client on key whose backends all point at
// baseURL (STRIPE_API_URL; tests point it at a local server), with
// stripe-go's own log lines routed into logger as JSON (nil: dropped), so
// that every line the process writes is one JSON object. Whether to call it
// at all when key is "" is the caller's decision.
func NewAPI(key string, baseURL *url.URL, logger *slog.Logger) *client.API {
	cfg := &stripe.BackendConfig{
		URL: stripe.String(baseURL.String()),
		// Requests carry the caller's context: the handler deadline bounds
		// a revalidation. The client's own timeout is a backstop.
		HTTPClient:    &http.Client{Timeout: 80 * time.Second},
		LeveledLogger: leveledLogger{logger},
	}
	api := &client.API{}
	api.Init(key, stripe.NewBackendsWithConfig(cfg))
	return api
}

// leveledLogger adapts slog to stripe-go's logger interface.
type leveledLogger struct{ l *slog.Logger }

func (l leveledLogger) log(level slog.Level, format string, v ...any) {
	if l.l != nil {
		l.l.Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "stripe-go")
	}
}

func (l leveledLogger) Debugf(format string, v ...any) { l.log(slog.LevelDebug, format, v...) }
func (l leveledLogger) Infof(format string, v ...any)  { l.log(slog.LevelDebug, format, v...) }
func (l leveledLogger) Warnf(format string, v ...any)  { l.log(slog.LevelWarn, format, v...) }
func (l leveledLogger) Errorf(format string, v ...any) { l.log(slog.LevelError, format, v...) }

// lister is a Lister for one delivery: its counts are not shared.
func (r *Receiver) lister() *Lister { return NewLister(r.api) }

// fetch is the store's way to settle an unordered subscription event: nil
// without an API key.
func (r *Receiver) fetch() entitlements.Fetch {
	if r.api == nil {
		return nil
	}
	return r.retrieveSubscription
}

// retrieveSubscription reads a subscription from Stripe, its item list in
// full, and decodes it with the same rules as a webhook's object
// (stripe-go's own type is pinned to one API version).
func (r *Receiver) retrieveSubscription(ctx context.Context, id string) (entitlements.Subscription, error) {
	params := &stripe.SubscriptionParams{}
	params.Context = ctx
	sub, err := r.api.Subscriptions.Get(id, params)
	if err != nil {
		return entitlements.Subscription{}, fmt.Errorf("retrieve subscription %s: %w", id, err)
	}
	return r.lister().Subscription(ctx, sub.LastResponse.RawJSON)
}

func (r *Receiver) featureLister() entitlements.ListFeatures {
	if r.api == nil {
		return nil
	}
	return r.listFeatures
}

func (r *Receiver) listFeatures(ctx context.Context, customer string) ([]string, error) {
	return r.lister().LookupKeys(ctx, customer)
}
