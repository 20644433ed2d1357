package stripehook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79/client"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/stripetest"
)

// corpus reads a file of testdata/stripe (see its README.md for sources).
func corpus(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../testdata/stripe", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// edit changes a corpus event: f gets the decoded event to change.
func edit(t *testing.T, body []byte, f func(ev map[string]any)) []byte {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatal(err)
	}
	f(ev)
	out, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func object(ev map[string]any) map[string]any {
	return ev["data"].(map[string]any)["object"].(map[string]any)
}

// Unix seconds of the corpus: 2025-12-01T12:00:00Z and days after it.
const corpusStart = 1764590400

func at(secs int64) *time.Time {
	t := time.Unix(secs, 0).UTC()
	return &t
}

func day(n int64) int64 { return corpusStart + n*86400 }

type storedSubscription struct {
	Customer          string
	Status            string
	PriceID           *string
	PeriodEnd         *time.Time
	CancelAtPeriodEnd bool
	CancelAt          *time.Time
	CanceledAt        *time.Time
	EndedAt           *time.Time
	TrialStart        *time.Time
	TrialEnd          *time.Time
	PauseCollection   *string
	AccessEndsAt      *time.Time
	Livemode          *bool
	Metadata          map[string]string
	LastEventID       string
}

type storedItem struct {
	ID, PriceID          string
	ProductID, LookupKey *string
	Quantity             *int64
	Start, End           *time.Time
}

func (h *harness) subscription(t *testing.T, id string) (storedSubscription, []storedItem) {
	t.Helper()
	var s storedSubscription
	err := h.pool.QueryRow(t.Context(), `
		SELECT stripe_customer_id, status, price_id, current_period_end, cancel_at_period_end, cancel_at,
		       canceled_at, ended_at, trial_start, trial_end, pause_collection, access_ends_at, livemode,
		       metadata, last_event_id
		FROM entitlements WHERE stripe_subscription_id = $1`, id).
		Scan(&s.Customer, &s.Status, &s.PriceID, &s.PeriodEnd, &s.CancelAtPeriodEnd, &s.CancelAt,
			&s.CanceledAt, &s.EndedAt, &s.TrialStart, &s.TrialEnd, &s.PauseCollection, &s.AccessEndsAt,
			&s.Livemode, &s.Metadata, &s.LastEventID)
	if err != nil {
		t.Fatalf("read subscription %s: %v", id, err)
	}
	rows, err := h.pool.Query(t.Context(), `
		SELECT stripe_item_id, price_id, product_id, price_lookup_key, quantity, current_period_start, current_period_end
		FROM entitlement_items WHERE stripe_subscription_id = $1 ORDER BY position`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var items []storedItem
	for rows.Next() {
		var it storedItem
		if err := rows.Scan(&it.ID, &it.PriceID, &it.ProductID, &it.LookupKey, &it.Quantity, &it.Start, &it.End); err != nil {
			t.Fatal(err)
		}
		items = append(items, it)
	}
	return s, items
}

func ptr[T any](v T) *T { return &v }

// normalise makes stored times comparable with cmp (Postgres answers in
// the local zone).
var timeUTC = cmp.Transformer("UTC", func(t time.Time) time.Time { return t.UTC() })

// TestCorpusSubscriptions delivers each subscription event of the corpus
// and checks every stored field against what Stripe documents.
func TestCorpusSubscriptions(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	monthly := storedItem{ID: "si_QmunchableBase01", PriceID: "price_1QmunchableMonthly", ProductID: ptr("prod_QmunchablePlan"),
		LookupKey: ptr("base_monthly"), Quantity: ptr[int64](1), Start: at(corpusStart), End: at(day(31))}
	tests := []struct {
		file  string
		sub   string
		want  storedSubscription
		items []storedItem
	}{
		{
			// Monthly base and yearly add-on: the period (and so the end of
			// access when canceling at period end) is the earliest item end,
			// not the add-on's a year away.
			"customer.subscription.updated.mixed_interval.json", "sub_1QmunchableMixed01",
			storedSubscription{Customer: "cus_QmunchableCust01", Status: "active", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(31)), CancelAtPeriodEnd: true, AccessEndsAt: at(day(31)), Livemode: ptr(false),
				Metadata: map[string]string{"app_user": "user_42"}, LastEventID: "evt_1QmunchableMixed01"},
			[]storedItem{monthly, {ID: "si_QmunchableAddon01", PriceID: "price_1QmunchableYearlyAddon", ProductID: ptr("prod_QmunchableAddon"),
				Quantity: ptr[int64](3), Start: at(corpusStart), End: at(day(365))}},
		},
		{
			"customer.subscription.updated.cancel_at.json", "sub_1QmunchableCancelAt01",
			storedSubscription{Customer: "cus_QmunchableCust01", Status: "active", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(31)), CancelAt: at(day(10)), AccessEndsAt: at(day(10)), Livemode: ptr(false),
				Metadata: map[string]string{}, LastEventID: "evt_1QmunchableCancelAt01"},
			[]storedItem{monthly},
		},
		{
			"customer.subscription.created.trial.json", "sub_1QmunchableTrial01",
			storedSubscription{Customer: "cus_QmunchableCust01", Status: "trialing", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(14)), TrialStart: at(corpusStart), TrialEnd: at(day(14)), Livemode: ptr(false),
				Metadata: map[string]string{}, LastEventID: "evt_1QmunchableTrial01"},
			[]storedItem{{ID: monthly.ID, PriceID: monthly.PriceID, ProductID: monthly.ProductID, LookupKey: monthly.LookupKey,
				Quantity: monthly.Quantity, Start: monthly.Start, End: at(day(14))}},
		},
		{
			"customer.subscription.updated.pause_collection.json", "sub_1QmunchablePause01",
			storedSubscription{Customer: "cus_QmunchableCust01", Status: "active", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(31)), PauseCollection: ptr("void"), Livemode: ptr(false),
				Metadata: map[string]string{}, LastEventID: "evt_1QmunchablePause01"},
			[]storedItem{monthly},
		},
		{
			"customer.subscription.created.accounts_v2.json", "sub_1QmunchableAcctV201",
			storedSubscription{Customer: "acct_1QmunchableAcct01", Status: "active", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(31)), Livemode: ptr(false), Metadata: map[string]string{}, LastEventID: "evt_1QmunchableAcctV201"},
			[]storedItem{monthly},
		},
		{
			// API 2024-06-20: the period is the subscription's, shared by its
			// items and stored on each; the customer is expanded.
			"customer.subscription.updated.2024-06-20.json", "sub_1QmunchableOldApi01",
			storedSubscription{Customer: "cus_QmunchableCust02", Status: "active", PriceID: ptr("price_1QmunchableMonthly"),
				PeriodEnd: at(day(31)), Livemode: ptr(false), Metadata: map[string]string{}, LastEventID: "evt_1QmunchableOldApi01"},
			[]storedItem{monthly},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			assertAnswer(t, h.post(t, corpus(t, tt.file), time.Now()), 200, "first")
			got, items := h.subscription(t, tt.sub)
			if d := cmp.Diff(tt.want, got, timeUTC); d != "" {
				t.Errorf("entitlements row (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.items, items, timeUTC); d != "" {
				t.Errorf("entitlement_items (-want +got):\n%s", d)
			}
		})
	}
}

// stripeAPI is the fake Stripe API and a client of it with a key.
func stripeAPI(t *testing.T) (*stripetest.API, *client.API) {
	t.Helper()
	fake := stripetest.New(t)
	return fake, NewAPI(stripetest.Key, fake.URL(), nil, nil)
}

func TestCorpusFeatures(t *testing.T) {
	t.Parallel()
	read := func(h *harness, customer string) (keys []string, complete bool) {
		t.Helper()
		if err := h.pool.QueryRow(t.Context(), `SELECT lookup_keys, complete FROM customer_features WHERE stripe_customer_id = $1`, customer).Scan(&keys, &complete); err != nil {
			t.Fatal(err)
		}
		return keys, complete
	}
	t.Run("several features, sorted", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, options{})
		assertAnswer(t, h.post(t, corpus(t, "entitlements.active_entitlement_summary.updated.json"), time.Now()), 200, "first")
		keys, complete := read(h, "cus_QmunchableCust01")
		if !cmp.Equal(keys, []string{"api_access", "exports", "sso"}) || !complete {
			t.Errorf("stored %v complete=%v, want [api_access exports sso] complete", keys, complete)
		}
	})
	t.Run("truncated, offline", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, options{})
		assertAnswer(t, h.post(t, corpus(t, "entitlements.active_entitlement_summary.updated.truncated.json"), time.Now()), 200, "first")
		keys, complete := read(h, "cus_QmunchableCust03")
		if !cmp.Equal(keys, []string{"api_access", "exports"}) || complete {
			t.Errorf("stored %v complete=%v, want what arrived, incomplete", keys, complete)
		}
		if got := h.metric(t, "customer_features_incomplete_total"); got != 1 {
			t.Errorf("customer_features_incomplete_total = %v, want 1", got)
		}
	})
	t.Run("truncated, fetched in full", func(t *testing.T) {
		t.Parallel()
		fake, api := stripeAPI(t)
		fx := stripetest.LoadFixtures(t)
		var ents [][]byte
		for i, key := range []string{"exports", "sso", "api_access", "audit_log"} {
			ents = append(ents, fx.ActiveEntitlement(fmt.Sprintf("ent_%d", i), fmt.Sprintf("feat_%d", i), key))
		}
		fake.SetActiveEntitlements("cus_QmunchableCust03", ents...)
		h := newHarness(t, options{api: api})
		// Rate limited once: the listing backs off and asks again.
		fake.FailNext(1, http.StatusTooManyRequests)
		assertAnswer(t, h.post(t, corpus(t, "entitlements.active_entitlement_summary.updated.truncated.json"), time.Now()), 200, "first")
		keys, complete := read(h, "cus_QmunchableCust03")
		if !cmp.Equal(keys, []string{"api_access", "audit_log", "exports", "sso"}) || !complete {
			t.Errorf("stored %v complete=%v, want the full list, complete", keys, complete)
		}
		if n := fake.Calls(stripetest.ListActiveEntitlements); n != 2 {
			t.Errorf("active entitlements listed %d times, want 2 (a 429, then the list)", n)
		}
	})
}

func TestCorpusCheckout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	type row struct {
		ClientReferenceID, Customer, Subscription, Email *string
		Mode, Status                                     string
		PaymentStatus                                    *string
		Metadata                                         map[string]string
		LastEventID                                      string
	}
	read := func(id string) row {
		t.Helper()
		var r row
		err := h.pool.QueryRow(t.Context(), `
			SELECT client_reference_id, stripe_customer_id, stripe_subscription_id, customer_email, mode, status,
			       payment_status, metadata, last_event_id
			FROM checkout_sessions WHERE stripe_checkout_session_id = $1`, id).
			Scan(&r.ClientReferenceID, &r.Customer, &r.Subscription, &r.Email, &r.Mode, &r.Status, &r.PaymentStatus, &r.Metadata, &r.LastEventID)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	paid := row{ClientReferenceID: ptr("user_42"), Customer: ptr("cus_QmunchableCust01"), Subscription: ptr("sub_1QmunchableMixed01"),
		Email: ptr("example@example.com"), Mode: "subscription", Status: "complete", PaymentStatus: ptr("paid"),
		Metadata: map[string]string{"plan": "pro"}, LastEventID: "evt_1QmunchableCsAsyncOk"}
	steps := []struct {
		file string
		id   string
		want row
	}{
		{"checkout.session.completed.json", "cs_test_a1QmunchableCheckout01", func() row {
			r := paid
			r.PaymentStatus, r.LastEventID = ptr("unpaid"), "evt_1QmunchableCsCompleted"
			return r
		}()},
		{"checkout.session.async_payment_succeeded.json", "cs_test_a1QmunchableCheckout01", paid},
		// The failure shares the success's second and would move payment
		// back: a same-second event is admitted only as a step forward.
		{"checkout.session.async_payment_failed.json", "cs_test_a1QmunchableCheckout01", paid},
		{"checkout.session.expired.json", "cs_test_a1QmunchableCheckout02", row{ClientReferenceID: ptr("user_43"),
			Email: ptr("pat@example.com"), Mode: "subscription", Status: "expired", PaymentStatus: ptr("unpaid"),
			Metadata: map[string]string{"plan": "pro"}, LastEventID: "evt_1QmunchableCsExpired"}},
	}
	for _, st := range steps {
		assertAnswer(t, h.post(t, corpus(t, st.file), time.Now()), 200, "first")
		if d := cmp.Diff(st.want, read(st.id)); d != "" {
			t.Errorf("after %s (-want +got):\n%s", st.file, d)
		}
	}
}

// Thin events and unknown types are acknowledged whatever their shape:
// never refused, never claimed, never written.
func TestThinAndUnknownIgnored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	bodies := map[string][]byte{
		"thin meter event":        corpus(t, "v1.billing.meter.error_report_triggered.thin.json"),
		"thin subscription event": corpus(t, "customer.subscription.updated.thin.json"),
		"unknown type, odd data":  []byte(`{"id":"evt_odd","object":"event","type":"invoice.paid","created":"yesterday","data":"not an object"}`),
		"unknown type, no data":   []byte(`{"id":"evt_nodata","object":"event","type":"radar.early_fraud_warning.created"}`),
	}
	for name, body := range bodies {
		w := h.post(t, body, time.Now())
		if w.Code != 200 || w.Body.String() != `{"received":true,"ignored":true}` {
			t.Errorf("%s: %d %s, want 200 ignored", name, w.Code, w.Body)
		}
	}
	if got := h.metric(t, "stripe_thin_events_total"); got != 2 {
		t.Errorf("stripe_thin_events_total = %v, want 2", got)
	}
	if keys := h.rdb.Keys(t.Context(), h.claims.Key("stripe", "*")).Val(); len(keys) != 0 {
		t.Errorf("ignored events took claims: %v", keys)
	}
	if n := h.rows(t); n != 0 {
		t.Errorf("ignored events wrote %d rows", n)
	}
}

// A handled event lacking what its effect needs is refused before the
// claim, and the log line names what is missing.
func TestMissingFieldRefused(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name, file string
		edit       func(ev map[string]any)
		logged     string
	}{
		{"subscription without customer", "customer.subscription.created.trial.json",
			func(ev map[string]any) { object(ev)["customer"] = nil }, "customer"},
		{"subscription without id", "customer.subscription.updated.cancel_at.json",
			func(ev map[string]any) { delete(object(ev), "id") }, "subscription id"},
		{"item without price", "customer.subscription.updated.mixed_interval.json",
			func(ev map[string]any) {
				delete(object(ev)["items"].(map[string]any)["data"].([]any)[1].(map[string]any), "price")
			}, "items.data[1]"},
		{"item repeated", "customer.subscription.updated.mixed_interval.json",
			func(ev map[string]any) {
				items := object(ev)["items"].(map[string]any)
				data := items["data"].([]any)
				items["data"] = append(data, data[0])
			}, "repeats item si_QmunchableBase01"},
		{"summary without customer", "entitlements.active_entitlement_summary.updated.json",
			func(ev map[string]any) { delete(object(ev), "customer") }, "customer"},
		{"checkout without status", "checkout.session.completed.json",
			func(ev map[string]any) { delete(object(ev), "status") }, "status"},
		{"created before 2010", "checkout.session.completed.json",
			func(ev map[string]any) { ev["created"] = 1262303999 }, "before 2010"},
		{"created two days ahead", "customer.subscription.updated.cancel_at.json",
			func(ev map[string]any) { ev["created"] = now.Add(48 * time.Hour).Unix() }, "a day ahead"},
		{"created at the int64 maximum", "customer.subscription.updated.cancel_at.json",
			func(ev map[string]any) { ev["created"] = json.Number("9223372036854775807") }, "a day ahead"},
		{"item period past year 9999", "customer.subscription.updated.cancel_at.json",
			func(ev map[string]any) {
				object(ev)["items"].(map[string]any)["data"].([]any)[0].(map[string]any)["current_period_end"] = json.Number("9223372036854775807")
			}, "current_period_end out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, options{})
			body := edit(t, corpus(t, tt.file), tt.edit)
			w := h.post(t, body, time.Now())
			if w.Code != 400 || w.Header().Get("Webhook-Idempotency") != "" {
				t.Errorf("answer %d (%s), want 400 before the claim", w.Code, w.Header().Get("Webhook-Idempotency"))
			}
			if keys := h.rdb.Keys(t.Context(), h.claims.Key("stripe", "*")).Val(); len(keys) != 0 {
				t.Errorf("took claims: %v", keys)
			}
			if got := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", "malformed"); got != 1 {
				t.Errorf("malformed rejections = %v, want 1", got)
			}
			if logs := h.logs.String(); !strings.Contains(logs, tt.logged) {
				t.Errorf("log does not name %q:\n%s", tt.logged, logs)
			}
			var n int
			if err := h.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM entitlements) + (SELECT count(*) FROM customer_features) + (SELECT count(*) FROM checkout_sessions)`).Scan(&n); err != nil || n != 0 {
				t.Errorf("rows written: %d (%v)", n, err)
			}
		})
	}
	// A day ahead is still believable: clocks drift.
	h := newHarness(t, options{})
	body := edit(t, corpus(t, "customer.subscription.updated.cancel_at.json"), func(ev map[string]any) { ev["created"] = now.Add(time.Hour).Unix() })
	assertAnswer(t, h.post(t, body, time.Now()), 200, "first")
}

// A signature dated more than the tolerance ahead is refused like a stale
// one (stripe-go only bounds its age); one within it is accepted.
func TestSignatureFromTheFuture(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := corpus(t, "customer.subscription.updated.cancel_at.json")
	w := h.post(t, body, time.Now().Add(Tolerance+5*time.Second))
	if w.Code != 400 || w.Header().Get("Webhook-Idempotency") != "" {
		t.Errorf("signed %s ahead: %d, want 400 before the claim", Tolerance+5*time.Second, w.Code)
	}
	if got := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", "timestamp"); got != 1 {
		t.Errorf("timestamp rejections = %v, want 1", got)
	}
	if got := h.metric(t, "webhook_deliveries_total", "provider", "stripe", "outcome", "rejected"); got != 1 {
		t.Errorf("rejected deliveries = %v, want 1 (a verification failure)", got)
	}
	assertAnswer(t, h.post(t, body, time.Now().Add(Tolerance-30*time.Second)), 200, "first")
}

// A Stripe-Signature header with more than one t= is refused as a bad
// signature, whichever t= the signature covers: stripe-go verifies against
// the last one, so a current t= put before a signature dated an hour ahead
// would otherwise pass the bound on how far ahead it may be.
func TestSignatureWithTwoTimestamps(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := corpus(t, "customer.subscription.updated.cancel_at.json")
	now := time.Now()
	future := now.Add(time.Hour)
	signed := func(at time.Time) string {
		return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: at}).Header
	}
	stamp := func(at time.Time) string { return "t=" + strconv.FormatInt(at.Unix(), 10) }

	tests := []struct {
		name string
		sig  string
	}{
		{"a current t= before a signature dated ahead", stamp(now) + "," + signed(future)},
		{"a current t= after a signature dated ahead", signed(future) + "," + stamp(now)},
		{"a t= dated ahead before a current signature", stamp(future) + "," + signed(now)},
		{"a t= dated ahead after a current signature", signed(now) + "," + stamp(future)},
		{"the signed t= twice", stamp(now) + "," + signed(now)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := h.postWithHeader(body, tt.sig)
			if w.Code != 400 {
				t.Errorf("status = %d, want 400 (%s)", w.Code, w.Body)
			}
			if got := w.Header().Get(claim.HeaderIdempotency); got != "" {
				t.Errorf("a refused delivery reached the claim (%s: %s)", claim.HeaderIdempotency, got)
			}
		})
	}
	n := float64(len(tests))
	if got := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", "signature"); got != n {
		t.Errorf("signature rejections = %v, want %v", got, n)
	}
	if got := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", "timestamp"); got != 0 {
		t.Errorf("timestamp rejections = %v, want 0", got)
	}
	if got := h.metric(t, "webhook_deliveries_total", "provider", "stripe", "outcome", "rejected"); got != n {
		t.Errorf("rejected deliveries = %v, want %v (verification failures)", got, n)
	}
	if keys := h.rdb.Keys(t.Context(), h.claims.Key("stripe", "*")).Val(); len(keys) != 0 {
		t.Errorf("refused deliveries took claims: %v", keys)
	}
	if n := h.rows(t); n != 0 {
		t.Errorf("refused deliveries wrote %d rows", n)
	}
	// The same body, signed with one t=, is the first delivery of its event.
	assertAnswer(t, h.post(t, body, now), 200, "first")
}

// sameSecond is the cancel_at corpus event and a second event of the same
// second that sets cancel_at_period_end without naming it in
// previous_attributes: not a successor, so unordered.
func sameSecond(t *testing.T) (first, unordered []byte) {
	t.Helper()
	first = corpus(t, "customer.subscription.updated.cancel_at.json")
	unordered = edit(t, first, func(ev map[string]any) {
		ev["id"] = "evt_1QmunchableUnordered01"
		object(ev)["cancel_at_period_end"] = true
		ev["data"].(map[string]any)["previous_attributes"] = map[string]any{"metadata": map[string]any{}}
	})
	return first, unordered
}

func TestUnorderedOffline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	first, unordered := sameSecond(t)
	assertAnswer(t, h.post(t, first, time.Now()), 200, "first")
	assertAnswer(t, h.post(t, unordered, time.Now()), 200, "first")
	got, _ := h.subscription(t, "sub_1QmunchableCancelAt01")
	if got.LastEventID != "evt_1QmunchableCancelAt01" || got.CancelAtPeriodEnd {
		t.Errorf("stored %+v, want the first event's row kept", got)
	}
	if n := h.metric(t, "entitlements_unordered_events_total"); n != 1 {
		t.Errorf("entitlements_unordered_events_total = %v, want 1", n)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, `"level":"WARN"`) || !strings.Contains(logs, `"event_id":"evt_1QmunchableUnordered01"`) ||
		!strings.Contains(logs, `"stored_event_id":"evt_1QmunchableCancelAt01"`) {
		t.Errorf("no warning with both event ids:\n%s", logs)
	}
}

// With an API key, an unordered event is settled by retrieving the
// subscription: the fetched state lands. An API failure fails the
// delivery and releases its claim.
func TestUnorderedRevalidated(t *testing.T) {
	t.Parallel()
	fake, api := stripeAPI(t)
	h := newHarness(t, options{api: api})
	first, unordered := sameSecond(t)
	assertAnswer(t, h.post(t, first, time.Now()), 200, "first")
	if n := fake.TotalCalls(); n != 0 {
		t.Fatalf("an ordered event called the API %d times", n)
	}

	fake.FailNext(3, http.StatusInternalServerError) // one try and stripe-go's two retries
	assertAnswer(t, h.post(t, unordered, time.Now()), 500, "first")
	if n := h.rdb.Exists(t.Context(), h.claims.Key("stripe", "evt_1QmunchableUnordered01")).Val(); n != 0 {
		t.Error("claim kept after the API failed")
	}

	// Stripe's current state: canceling at period end, and past due.
	fetched := edit(t, unordered, func(ev map[string]any) { object(ev)["status"] = "past_due" })
	var ev struct {
		Data struct {
			Object []byte          `json:"-"`
			Raw    json.RawMessage `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(fetched, &ev); err != nil {
		t.Fatal(err)
	}
	fake.PutSubscription(ev.Data.Raw)
	assertAnswer(t, h.post(t, unordered, time.Now()), 200, "first")
	got, _ := h.subscription(t, "sub_1QmunchableCancelAt01")
	if got.Status != "past_due" || !got.CancelAtPeriodEnd || got.LastEventID != "api:evt_1QmunchableUnordered01" {
		t.Errorf("stored %+v, want the fetched state under the unordered event", got)
	}
	if n := h.metric(t, "entitlements_unordered_events_total"); n != 0 {
		t.Errorf("entitlements_unordered_events_total = %v, want 0 with a key", n)
	}
}

// Replay decodes an event read from the API and runs it through the same
// claim; the flow's result says what the store did.
func TestEventForReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := corpus(t, "customer.subscription.updated.mixed_interval.json")
	ev, err := h.receiver.Event(body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.ep.Process(t.Context(), body, ev)
	if err != nil {
		t.Fatal(err)
	}
	if want := (claim.Result{Outcome: claim.Processed, Effect: claim.Applied}); res != want {
		t.Fatalf("result = %+v, want %+v", res, want)
	}
	// Delivered again: a duplicate, and the store is not called.
	res, err = h.ep.Process(t.Context(), body, ev)
	if err != nil {
		t.Fatal(err)
	}
	if want := (claim.Result{Outcome: claim.Duplicate}); res != want {
		t.Errorf("again = %+v, want %+v: a duplicate reached the store", res, want)
	}
	if _, err := h.receiver.Event([]byte(`{"id":"evt_x","type":"customer.subscription.updated","created":1764590400,"data":{"object":{}}}`)); err == nil {
		t.Error("an incomplete event decoded")
	}
}

// The case issue reports meet: a subscription created and changed in the
// same second, delivered in order. Each change names what it changed in
// previous_attributes the way Stripe does (an array whole, a hash by the
// keys that changed), so it succeeds the stored state and lands.
func TestSameSecondChangesLandInOrder(t *testing.T) {
	t.Parallel()
	created := edit(t, corpus(t, "customer.subscription.updated.mixed_interval.json"), func(ev map[string]any) {
		ev["id"], ev["type"] = "evt_created", "customer.subscription.created"
		object(ev)["cancel_at_period_end"] = false
		delete(ev["data"].(map[string]any), "previous_attributes")
	})
	var oldItems any
	upgrade := edit(t, created, func(ev map[string]any) {
		ev["id"], ev["type"] = "evt_upgrade", "customer.subscription.updated"
		items := object(ev)["items"].(map[string]any)
		b, _ := json.Marshal(items)
		json.Unmarshal(b, &oldItems)
		items["data"].([]any)[0].(map[string]any)["price"].(map[string]any)["id"] = "price_1QmunchablePro"
		ev["data"].(map[string]any)["previous_attributes"] = map[string]any{"items": oldItems}
	})
	cancel := edit(t, upgrade, func(ev map[string]any) {
		ev["id"] = "evt_cancel"
		object(ev)["cancel_at_period_end"] = true
		object(ev)["metadata"].(map[string]any)["churn_reason"] = "price"
		ev["data"].(map[string]any)["previous_attributes"] = map[string]any{
			"cancel_at_period_end": false, "metadata": map[string]any{"churn_reason": nil}}
	})
	h := newHarness(t, options{})
	for _, body := range [][]byte{created, upgrade, cancel} {
		assertAnswer(t, h.post(t, body, time.Now()), 200, "first")
	}
	got, items := h.subscription(t, "sub_1QmunchableMixed01")
	if got.LastEventID != "evt_cancel" || *got.PriceID != "price_1QmunchablePro" || !got.CancelAtPeriodEnd ||
		got.Metadata["churn_reason"] != "price" || items[0].PriceID != "price_1QmunchablePro" {
		t.Errorf("stored %+v with items %+v, want the last change of the second", got, items)
	}
	if n := h.metric(t, "entitlements_stale_events_total") + h.metric(t, "entitlements_unordered_events_total"); n != 0 {
		t.Errorf("%v events kept out, want none", n)
	}

	// Reversed, the creation cannot succeed the later state, and the
	// upgrade is not the cancellation's successor: neither moves it back.
	h = newHarness(t, options{})
	for _, body := range [][]byte{cancel, upgrade, created} {
		assertAnswer(t, h.post(t, body, time.Now()), 200, "first")
	}
	if got, _ := h.subscription(t, "sub_1QmunchableMixed01"); got.LastEventID != "evt_cancel" {
		t.Errorf("reversed: stored from %s, want evt_cancel", got.LastEventID)
	}
}

// statementCounter counts the round trips a pool makes: a statement, or a
// batch (sent whole, answered whole).
type statementCounter struct{ n atomic.Int32 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A first delivery of each handled kind is one Postgres round trip (the
// subscription's lock and write go in one batch), a
// duplicate none, however rich the rows; so is a strictly newer or older
// event (the guard's fast path: only a same-second tie takes more).
func TestStatementsPerDelivery(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(dbtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	var c statementCounter
	cfg.ConnConfig.Tracer = &c
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, options{pool: pool})
	for _, file := range []string{
		"customer.subscription.updated.mixed_interval.json",
		"entitlements.active_entitlement_summary.updated.json",
		"checkout.session.completed.json",
	} {
		body := corpus(t, file)
		before := c.n.Load()
		assertAnswer(t, h.post(t, body, time.Now()), 200, "first")
		if n := c.n.Load() - before; n != 1 {
			t.Errorf("%s, first delivery: %d round trips, want 1", file, n)
		}
		before = c.n.Load()
		assertAnswer(t, h.post(t, body, time.Now()), 200, "duplicate")
		if n := c.n.Load() - before; n != 0 {
			t.Errorf("%s, duplicate: %d round trips, want 0", file, n)
		}
	}
	for _, step := range []struct {
		id    string
		shift int64
	}{{"evt_newer", 1}, {"evt_older", -7200}} {
		body := edit(t, corpus(t, "customer.subscription.updated.mixed_interval.json"), func(ev map[string]any) {
			ev["id"] = step.id
			ev["created"] = ev["created"].(float64) + float64(step.shift)
		})
		before := c.n.Load()
		assertAnswer(t, h.post(t, body, time.Now()), 200, "first")
		if n := c.n.Load() - before; n != 1 {
			t.Errorf("%s: %d round trips, want 1", step.id, n)
		}
	}
	if got := h.metric(t, "entitlements_stale_events_total"); got != 1 {
		t.Errorf("entitlements_stale_events_total = %v, want 1 (the older event)", got)
	}
}

// HandledTypes and kindOf name the same types, both ways: every listed
// type is handled, and every type a case of kindOf's switch names is
// listed (read from the source, since a switch cannot be enumerated).
func TestHandledTypes(t *testing.T) {
	t.Parallel()
	types := HandledTypes()
	want := map[string]kind{}
	for _, typ := range types {
		switch {
		case strings.HasPrefix(typ, "customer.subscription."):
			want[typ] = kindSubscription
		case strings.HasPrefix(typ, "checkout.session."):
			want[typ] = kindCheckout
		case typ == "entitlements.active_entitlement_summary.updated":
			want[typ] = kindFeatures
		default:
			t.Errorf("%s is listed, but this test knows no kind for it", typ)
		}
	}
	for typ, k := range want {
		if got := kindOf(typ); got != k {
			t.Errorf("kindOf(%s) = %d, want %d", typ, got, k)
		}
	}
	for _, typ := range []string{"customer.subscription.foo", "customer.created", "invoice.paid", "checkout.session", ""} {
		if kindOf(typ) != 0 {
			t.Errorf("%s is handled", typ)
		}
	}
	if len(want) != 13 || len(types) != 13 {
		t.Errorf("%d handled types (%d distinct), want the contract's 13", len(types), len(want))
	}
}
