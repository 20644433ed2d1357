package stripehook

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
)

// head is what every decision starts from: the type (handled or not) and
// the object (a thin event or a snapshot event). created stays raw because
// a thin event spells it as an ISO string
// (https://docs.stripe.com/api/v2/core/events/object), and data stays raw
// until the type says how to read it.
type head struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Type    string          `json:"type"`
	Created json.RawMessage `json:"created"`
	Data    json.RawMessage `json:"data"`
	// APIVersion is the version Stripe rendered data in, for the count
	// of versions seen; the decoders read every version by shape.
	APIVersion string `json:"api_version"`
}

// versionLabel is an event's api_version as a metric label: Stripe's
// spelling (a date, then a release name from 2024-09-30.acacia on), or
// "other". Only Stripe chooses the value (the event is signed, or read
// from the API), and it publishes about one version a month, so the label
// grows by about twelve values a year; the check keeps anything else, a
// malformed or overlong string, to one value.
func versionLabel(v string) string {
	if len(v) < 10 || len(v) > 32 {
		return "other"
	}
	for i, c := range []byte(v) {
		switch {
		case i == 4 || i == 7:
			if c != '-' {
				return "other"
			}
		case i < 10:
			if c < '0' || c > '9' {
				return "other"
			}
		case i == 10:
			if c != '.' || len(v) == 11 {
				return "other"
			}
		default:
			if c < 'a' || c > 'z' {
				return "other"
			}
		}
	}
	return v
}

// objectOf decodes a handled event's data in one pass: its object into T,
// and previous_attributes (for *.updated events: the attributes the event
// changed, with their values before) kept raw.
func objectOf[T any](raw json.RawMessage) (obj T, previous json.RawMessage, err error) {
	var d struct {
		Object             *T              `json:"object"`
		PreviousAttributes json.RawMessage `json:"previous_attributes"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return obj, nil, err
	}
	if d.Object == nil {
		return obj, nil, fmt.Errorf("%w: data.object", errMissing)
	}
	return *d.Object, d.PreviousAttributes, nil
}

// thinObject is the object of a thin event: an unversioned notice that
// carries no state, only a reference to fetch
// (https://docs.stripe.com/event-destinations#thin-events).
const thinObject = "v2.core.event"

// kind is what a handled event type writes.
type kind int

const (
	kindSubscription kind = iota + 1
	kindFeatures
	kindCheckout
)

// handled is every event type this service acts on, with what it writes:
// what to subscribe to in the Stripe dashboard, and what replay asks for.
// Every other type is acknowledged and ignored. One table, read only, so
// the list and the dispatch cannot disagree.
var handled = [...]struct {
	typ  string
	kind kind
}{
	{"customer.subscription.created", kindSubscription},
	{"customer.subscription.updated", kindSubscription},
	{"customer.subscription.deleted", kindSubscription},
	{"customer.subscription.paused", kindSubscription},
	{"customer.subscription.resumed", kindSubscription},
	{"customer.subscription.pending_update_applied", kindSubscription},
	{"customer.subscription.pending_update_expired", kindSubscription},
	{"customer.subscription.trial_will_end", kindSubscription},
	{"entitlements.active_entitlement_summary.updated", kindFeatures},
	{"checkout.session.completed", kindCheckout},
	{"checkout.session.expired", kindCheckout},
	{"checkout.session.async_payment_succeeded", kindCheckout},
	{"checkout.session.async_payment_failed", kindCheckout},
}

// HandledTypes lists the event types this service acts on.
func HandledTypes() []string {
	out := make([]string, len(handled))
	for i, h := range handled {
		out[i] = h.typ
	}
	return out
}

// kindOf says what a handled type writes (0: not handled). Thirteen string
// comparisons, most ended by the length, on every delivery.
func kindOf(typ string) kind {
	for _, h := range handled {
		if h.typ == typ {
			return h.kind
		}
	}
	return 0
}

// An event's created is believable from 2010-01-01T00:00:00Z to a day
// ahead of the clock. A signed created at the int64 maximum would
// otherwise be stored as 1969 and let every later event past the guard.
const (
	earliestCreated = 1262304000
	maxAhead        = 24 * time.Hour
)

// created reads an event's created (Unix seconds) and refuses an absurd one.
func created(raw json.RawMessage, now time.Time) (time.Time, error) {
	secs, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: created", errMissing)
	}
	if secs < earliestCreated || secs > now.Add(maxAhead).Unix() {
		return time.Time{}, fmt.Errorf("created %d is before 2010 or more than a day ahead", secs)
	}
	return time.Unix(secs, 0).UTC(), nil
}

// decode reads a verified event body into what the claim runs. Only a
// handled type is read past its head; body is not kept (the intake reuses
// its buffer), only what json copies out of it.
func (r *Receiver) decode(body []byte) (claim.Event, error) {
	var h head
	if err := json.Unmarshal(body, &h); err != nil {
		return claim.Event{}, fmt.Errorf("%w: %w", claim.ErrMalformed, err)
	}
	out := claim.Event{ID: h.ID, Type: h.Type}
	if h.Object == thinObject {
		r.thin.Inc()
		return out, nil
	}
	r.apiVersions.WithLabelValues(versionLabel(h.APIVersion)).Inc()
	k := kindOf(h.Type)
	if k == 0 {
		return out, nil
	}
	at, err := created(h.Created, time.Now())
	if err != nil {
		return claim.Event{}, fmt.Errorf("%w: %s %s: %w", claim.ErrMalformed, h.Type, h.ID, err)
	}
	var apply applyFunc
	switch k {
	case kindSubscription:
		apply, err = r.subscriptionEvent(h, at)
	case kindFeatures:
		apply, err = r.featuresEvent(h, at)
	case kindCheckout:
		apply, err = r.checkoutEvent(h, at)
	}
	if err != nil {
		return claim.Event{}, fmt.Errorf("%w: %s %s: data.object: %w", claim.ErrMalformed, h.Type, h.ID, err)
	}
	out.Apply = r.applier(out, apply)
	return out, nil
}
