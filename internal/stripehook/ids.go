package stripehook

import (
	"errors"
	"fmt"

	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// Bounds on the ids an event names. Stripe says the ids it generates
// never exceed 255 characters (they are ASCII: sub_, cus_, cs_, si_,
// price_, prod_, acct_ and some 24 to 66 more); client_reference_id is the
// integration's own string, at most 200 characters, so 800 bytes of UTF-8
// (https://docs.stripe.com/api/checkout/sessions/create#create_checkout_session-client_reference_id).
// These ids are keys: primary keys, indexed columns (customer, client
// reference, the relay's order key), a btree entry of which Postgres
// refuses past about 2,700 bytes. A signed event naming a longer one was
// stored while it compressed under that limit, and one that did not
// failed every retry into a poison event. Refused before the claim
// instead, as a malformed event: 400, no claim, no write.
const (
	maxObjectID        = 255
	maxClientReference = 800
)

var errTooLong = errors.New("too long")

// checkID refuses id when it is longer than limit bytes.
func checkID(field, id string, limit int) error {
	if len(id) > limit {
		return fmt.Errorf("%w: %s is %d bytes, over %d", errTooLong, field, len(id), limit)
	}
	return nil
}

// subscriptionIDs checks the ids a subscription's write keeps: its own, its
// customer's, and each item's, price's and product's.
func subscriptionIDs(s entitlements.Subscription) error {
	errs := []error{checkID("subscription id", s.ID, maxObjectID), checkID("customer", s.CustomerID, maxObjectID)}
	for i, it := range s.Items {
		errs = append(errs,
			checkID(fmt.Sprintf("items.data[%d].id", i), it.ID, maxObjectID),
			checkID(fmt.Sprintf("items.data[%d].price.id", i), it.PriceID, maxObjectID),
			checkID(fmt.Sprintf("items.data[%d].price.product", i), it.ProductID, maxObjectID))
	}
	return errors.Join(errs...)
}

// checkoutIDs checks the ids a checkout session's write keeps.
func checkoutIDs(cs entitlements.CheckoutSession) error {
	return errors.Join(
		checkID("checkout session id", cs.ID, maxObjectID),
		checkID("customer", cs.CustomerID, maxObjectID),
		checkID("subscription", cs.SubscriptionID, maxObjectID),
		checkID("client_reference_id", cs.ClientReferenceID, maxClientReference))
}
