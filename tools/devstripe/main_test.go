package main

import (
	"bytes"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

const eventsDir = "../../testdata/events"

// newClient is stripe-go against the stand-in, as the service builds it.
func newClient(t *testing.T, now time.Time) *client.API {
	t.Helper()
	api, err := load(eventsDir, now)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	base, _ := url.Parse(srv.URL)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:           stripe.String(base.String()),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return client.New(devKey, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
}

// Stripe's side of the sample purchase: the subscription as the last
// event left it, every sample event by id, and the customer's active
// entitlements with priority_support added, whose summary event is listed
// as undelivered.
func TestServesTheSamples(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	api := newClient(t, now)

	sub, err := api.Subscriptions.Get("sub_1QmunchableSub0001", nil)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Status != stripe.SubscriptionStatusActive || sub.Customer.ID != "cus_QmunchableCust01" || len(sub.Items.Data) != 1 {
		t.Errorf("subscription = %s, customer %s, %d items; want the active one of customer.subscription.updated.json", sub.Status, sub.Customer.ID, len(sub.Items.Data))
	}
	for _, id := range []string{"evt_1QmunchableCheckout0001", "evt_1QmunchableCreated0001", "evt_1QmunchableUpdated0001", "evt_1QmunchableSummary0001", lostEventID} {
		if _, err := api.Events.Get(id, nil); err != nil {
			t.Errorf("retrieve event %s: %v", id, err)
		}
	}

	params := &stripe.EntitlementsActiveEntitlementListParams{Customer: stripe.String("cus_QmunchableCust01")}
	var keys []string
	it := api.EntitlementsActiveEntitlements.List(params)
	for it.Next() {
		keys = append(keys, it.EntitlementsActiveEntitlement().LookupKey)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if want := []string{"api_access", "exports", "priority_support", "sso"}; !cmp.Equal(keys, want) {
		t.Errorf("active entitlements = %v, want %v", keys, want)
	}

	lost := &stripe.EventListParams{DeliverySuccess: stripe.Bool(false), CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: now.Add(-time.Hour).Unix()}}
	var undelivered []string
	events := api.Events.List(lost)
	for events.Next() {
		e := events.Event()
		undelivered = append(undelivered, e.ID+" "+string(e.Type))
	}
	if err := events.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{lostEventID + " entitlements.active_entitlement_summary.updated"}; !cmp.Equal(undelivered, want) {
		t.Errorf("undelivered events of the last hour = %v, want %v", undelivered, want)
	}
}

// With a command, devstripe hands it its URL and key, and appends both to
// the env file for a second shell; with STRIPE_API_KEY set it only runs
// the command, and the file names that key.
func TestRunsTheCommand(t *testing.T) {
	t.Parallel()
	envFile := filepath.Join(t.TempDir(), "env")
	var stderr bytes.Buffer
	script := `set -a; . "$1"; set +a
case "$STRIPE_API_URL" in http://127.0.0.1:*) ;; *) exit 1;; esac
test "$STRIPE_API_KEY" = ` + devKey + ` && exit 7`
	code, err := run([]string{"-events", eventsDir, "-env-file", envFile, "--", "sh", "-c", script, "sh", envFile},
		[]string{"PATH=" + os.Getenv("PATH")}, io.Discard, &stderr)
	if err != nil || code != 7 {
		t.Errorf("run = %d, %v, want 7 (the command and the env file had the stand-in's URL and key)\n%s", code, err, &stderr)
	}

	if err := os.WriteFile(envFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, err = run([]string{"-events", eventsDir, "-env-file", envFile, "--", "sh", "-c", `test "$STRIPE_API_KEY" = sk_test_mine`},
		[]string{"PATH=" + os.Getenv("PATH"), "STRIPE_API_KEY=sk_test_mine"}, io.Discard, &stderr)
	if err != nil || code != 0 {
		t.Errorf("run with STRIPE_API_KEY set = %d, %v, want 0 (left as set)\n%s", code, err, &stderr)
	}
	if b, _ := os.ReadFile(envFile); string(b) != "STRIPE_API_KEY='sk_test_mine'\n" {
		t.Errorf("env file with STRIPE_API_KEY set = %q, want that key alone", b)
	}
}
