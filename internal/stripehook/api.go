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
	"go.opentelemetry.io/otel/trace"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// APIVersion is the Stripe API version every request names, so that
// Stripe renders each answer in it whatever the account's default and
// whatever stripe-go pins (v79 sends 2024-06-20, in which subscription
// items have no period of their own). It is the newest version whose
// Stripe fixtures the corpus is built from (testdata/stripe), and one the
// version tests (internal/stripesync) cover; releases after it within
// dahlia only add fields. Answers are decoded raw with the webhook's rules
// (subscriptionJSON), never with stripe-go's types, so a version newer
// than stripe-go knows is read like a webhook of that version.
// docs/STRIPE.md says what to do when Stripe retires it.
const APIVersion = "2026-07-29.dahlia"

// NewAPI returns a stripe-go client on key whose backends all point at
// baseURL (STRIPE_API_URL; tests point it at a local server) and name
// APIVersion on every request, with stripe-go's own log lines routed into
// logger as JSON (nil: dropped), so that every line the process writes is
// one JSON object. Under tp (nil: not traced) each request is a client
// span, a child of the caller's (the delivery's apply, a sweep's job),
// and carries traceparent. Whether to call it at all when key is "" is
// the caller's decision.
func NewAPI(key string, baseURL *url.URL, logger *slog.Logger, tp trace.TracerProvider) *client.API {
	cfg := &stripe.BackendConfig{
		URL: stripe.String(baseURL.String()),
		// Requests carry the caller's context: the handler deadline bounds
		// a revalidation. The client's own timeout is a backstop.
		HTTPClient: &http.Client{
			Timeout:   80 * time.Second,
			Transport: versioned{tracing.Transport(tp, http.DefaultTransport)},
		},
		LeveledLogger: leveledLogger{logger},
	}
	api := &client.API{}
	api.Init(key, stripe.NewBackendsWithConfig(cfg))
	return api
}

// versioned names APIVersion on every request of the client, whichever
// call sends it: stripe-go sets its pinned version first and offers no
// per-backend setting, and a header set per request would have to be
// repeated at every call site.
type versioned struct{ next http.RoundTripper }

func (v versioned) RoundTrip(req *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the request it is given.
	req = req.Clone(req.Context())
	req.Header.Set("Stripe-Version", APIVersion)
	return v.next.RoundTrip(req)
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
	l := r.lister()
	raw, err := l.Retrieve(ctx, "/v1/subscriptions/"+url.PathEscape(id))
	if err != nil {
		return entitlements.Subscription{}, fmt.Errorf("retrieve subscription %s: %w", id, err)
	}
	return l.Subscription(ctx, raw)
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
