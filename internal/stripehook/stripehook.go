// Package stripehook receives Stripe webhooks: it verifies each delivery's
// signature, reads the subscription events, and hands them to the claim
// flow to become entitlements.
package stripehook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// Tolerance is how old a signature's timestamp may be.
const Tolerance = 300 * time.Second

// NewHandler returns the handler of POST /webhooks/stripe.
func NewHandler(ep *claim.Endpoint, secret string, store *entitlements.Store) http.Handler {
	return ep.Handler(Decoder(secret, store))
}

// Decoder is the handler's own verify-and-decode step. It is exported for
// tools/bench, whose ceiling runs exactly this and stops before the claim.
func Decoder(secret string, store *entitlements.Store) claim.Decode {
	return func(h http.Header, body []byte) (claim.Event, error) {
		if err := verify(body, h.Get("Stripe-Signature"), secret); err != nil {
			return claim.Event{}, err
		}
		ev, err := decode(body)
		if err != nil {
			return claim.Event{}, fmt.Errorf("%w: %w", claim.ErrMalformed, err)
		}
		out := claim.Event{ID: ev.ID, Type: ev.Type}
		if subscriptionEvents[ev.Type] {
			out.Apply = func(ctx context.Context) error {
				ent, ref := ev.entitlement()
				_, err := store.Apply(ctx, ent, ref)
				return err
			}
		}
		return out, nil
	}
}

// verify checks the signature only: stripe-go's ConstructEvent would also
// decode the whole event into its own type and refuse other API versions.
func verify(body []byte, header, secret string) error {
	err := webhook.ValidatePayloadWithTolerance(body, header, secret, Tolerance)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, webhook.ErrTooOld):
		return fmt.Errorf("stripe signature: %w: %w", claim.ErrTimestamp, err)
	}
	return fmt.Errorf("stripe signature: %w: %w", claim.ErrSignature, err)
}
