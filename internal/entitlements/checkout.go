package entitlements

import (
	"context"
	"time"
)

// CheckoutSession is a Checkout Session in the shape this service stores.
type CheckoutSession struct {
	ID                string
	ClientReferenceID string
	CustomerID        string
	SubscriptionID    string
	Mode              string
	Status            string
	PaymentStatus     string
	CustomerEmail     string
	Metadata          map[string]string
}

// ApplyCheckout upserts the session as reported by the event eventID
// created at created.
func (s *Store) ApplyCheckout(ctx context.Context, cs CheckoutSession, eventID string, created time.Time) (Result, error) {
	return Result{}, errTODO
}
