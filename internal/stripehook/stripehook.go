// Package stripehook receives Stripe webhooks: it verifies each delivery's
// signature, reads the subscription events, and hands them to the claim
// flow to become entitlements.
package stripehook

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// Tolerance is how old a signature's timestamp may be.
const Tolerance = 300 * time.Second

// Handler answers POST /webhooks/stripe.
func Handler(ep *claim.Endpoint, secret string, store *entitlements.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pooled, err := claim.ReadPooledBody(w, r)
		if err != nil {
			ep.Reject(w, r, err)
			return
		}
		// The body's buffer is reused once this delivery is answered:
		// nothing keeps it, as decode copies what it reads and the flow
		// only fingerprints it.
		defer pooled.Release()
		body := pooled.Bytes()
		// Verify only: stripe-go's ConstructEvent would also decode the whole
		// event into its own type and refuse other API versions.
		if err := webhook.ValidatePayloadWithTolerance(body, r.Header.Get("Stripe-Signature"), secret, Tolerance); err != nil {
			ep.Reject(w, r, fmt.Errorf("stripe signature: %w", err))
			return
		}
		ev, err := decode(body)
		if err != nil {
			ep.Reject(w, r, err)
			return
		}
		if !subscriptionEvents[ev.Type] {
			ep.Ignore(w, r, ev.ID, ev.Type)
			return
		}
		ep.Serve(w, r, claim.Delivery{
			EventID:   ev.ID,
			EventType: ev.Type,
			Body:      body,
			Apply: func(ctx context.Context) error {
				ent, ref := ev.entitlement()
				_, err := store.Apply(ctx, ent, ref)
				return err
			},
		})
	})
}
