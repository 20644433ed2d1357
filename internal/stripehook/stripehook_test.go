package stripehook

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stripe/stripe-go/v79/client"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

const secret = "whsec_test_stripehook"

type harness struct {
	pool     *pgxpool.Pool
	rdb      *redis.Client
	claims   *claim.Store
	reg      *prometheus.Registry
	ep       *claim.Endpoint
	receiver *Receiver
	handler  http.Handler
	logs     *lockedBuffer
}

type options struct {
	rdb            *redis.Client // overrides the shared test Redis
	noRedis        bool
	failClosed     bool
	handlerTimeout time.Duration
	api            *client.API   // the Stripe API; nil: offline
	pool           *pgxpool.Pool // overrides a fresh test database's pool
}

// lockedBuffer collects the JSON log lines of concurrent deliveries.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newHarness(t *testing.T, o options) *harness {
	t.Helper()
	h := &harness{pool: o.pool, reg: prometheus.NewRegistry()}
	if h.pool == nil {
		h.pool = dbtest.NewPool(t)
	}
	prefix := "webhook"
	switch {
	case o.noRedis:
	case o.rdb != nil:
		h.rdb = o.rdb
	default:
		h.rdb, prefix = dbtest.Redis(t)
	}
	if o.handlerTimeout == 0 {
		o.handlerTimeout = 5 * time.Second
	}
	h.claims = claim.NewStore(h.rdb, claim.StoreConfig{Prefix: prefix, Timeout: 250 * time.Millisecond, ProcessingTTL: 2 * time.Minute})
	h.logs = &lockedBuffer{}
	logger := slog.New(slog.NewJSONHandler(h.logs, nil))
	flow := claim.NewFlow(h.claims, claim.FlowConfig{
		HandlerTimeout: o.handlerTimeout,
		Logger:         logger,
		Registerer:     h.reg,
	})
	h.ep = flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: 72 * time.Hour, FailClosed: o.failClosed})
	h.receiver = New(Config{Store: entitlements.NewStore(h.pool, h.reg), API: o.api, Logger: logger, Registerer: h.reg})
	h.handler = h.receiver.Handler(h.ep, secret)
	return h
}

// post delivers body signed the way Stripe signs, at the given time.
func (h *harness) post(t *testing.T, body []byte, signedAt time.Time) *httptest.ResponseRecorder {
	t.Helper()
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: signedAt})
	return h.postWithHeader(body, signed.Header)
}

func (h *harness) postWithHeader(body []byte, sig string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if sig != "" {
		r.Header.Set("Stripe-Signature", sig)
	}
	w := httptest.NewRecorder()
	h.handler.ServeHTTP(w, r)
	return w
}

type row struct {
	status      string
	lastEventID string
	periodEnd   *time.Time
	priceID     *string
}

func (h *harness) row(t *testing.T, sub string) (row, bool) {
	t.Helper()
	var r row
	err := h.pool.QueryRow(t.Context(), `SELECT status, last_event_id, current_period_end, price_id FROM entitlements WHERE stripe_subscription_id = $1`, sub).
		Scan(&r.status, &r.lastEventID, &r.periodEnd, &r.priceID)
	if err != nil {
		return row{}, false
	}
	return r, true
}

func (h *harness) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(t.Context(), `SELECT count(*) FROM entitlements`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// writes reports how many times the subscription's row was written: a
// row never updated since its insert still sits at ctid (0,1) of a fresh
// table, and every update moves it.
func (h *harness) writtenOnce(t *testing.T, sub string) bool {
	t.Helper()
	var ctid string
	if err := h.pool.QueryRow(t.Context(), `SELECT ctid::text FROM entitlements WHERE stripe_subscription_id = $1`, sub).Scan(&ctid); err != nil {
		t.Fatal(err)
	}
	return ctid == "(0,1)"
}

func (h *harness) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
		}
	}
	return 0
}

// ev is a subscription event built from the bundled fixture (a real
// customer.subscription.updated at API version 2025-03-31), with the fields
// a test cares about set.
type ev struct {
	id, typ, sub, status, prevStatus string
	created                          int64
}

func (e ev) body(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../testdata/events/customer.subscription.updated.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	m["id"], m["created"] = e.id, e.created
	if e.typ == "" {
		e.typ = "customer.subscription.updated"
	}
	m["type"] = e.typ
	data := m["data"].(map[string]any)
	obj := data["object"].(map[string]any)
	if e.sub != "" {
		obj["id"] = e.sub
	}
	if e.status != "" {
		obj["status"] = e.status
	}
	if e.prevStatus == "" {
		delete(data, "previous_attributes")
	} else {
		data["previous_attributes"] = map[string]any{"status": e.prevStatus}
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func assertAnswer(t *testing.T, w *httptest.ResponseRecorder, status int, idem string) {
	t.Helper()
	if w.Code != status {
		t.Errorf("status = %d, want %d (body %s)", w.Code, status, w.Body)
	}
	if got := w.Header().Get(claim.HeaderIdempotency); got != idem {
		t.Errorf("%s = %q, want %q", claim.HeaderIdempotency, got, idem)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
}

func TestFirstDeliveryThenDuplicate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := ev{id: "evt_first", sub: "sub_1", status: "active", prevStatus: "incomplete", created: 1764590400}.body(t)

	w := h.post(t, body, time.Now())
	assertAnswer(t, w, 200, "first")
	if w.Body.String() != `{"received":true}` {
		t.Errorf("body = %s", w.Body)
	}
	r, ok := h.row(t, "sub_1")
	if !ok || r.status != "active" || r.lastEventID != "evt_first" {
		t.Fatalf("row = %+v (found %v), want active from evt_first", r, ok)
	}
	// The fixture is at API version 2025-03-31: the period end is on the item.
	if r.periodEnd == nil || r.periodEnd.Unix() != 1767182400 || r.priceID == nil || *r.priceID != "price_1QmunchableMonthly" {
		t.Errorf("period end %v, price %v; want 1767182400 and price_1QmunchableMonthly", r.periodEnd, r.priceID)
	}

	w = h.post(t, body, time.Now())
	assertAnswer(t, w, 200, "duplicate")
	if w.Body.String() != `{"received":true,"skipped":true}` {
		t.Errorf("duplicate body = %s", w.Body)
	}
	if !h.writtenOnce(t, "sub_1") {
		t.Error("the duplicate wrote the row again")
	}
	if got := h.metric(t, "webhook_deliveries_total", "provider", "stripe", "outcome", "duplicate"); got != 1 {
		t.Errorf("duplicate metric = %v, want 1", got)
	}
}

func TestConcurrentDuplicatesOneEffect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := ev{id: "evt_conc", sub: "sub_conc", status: "active", created: 1764590400}.body(t)
	codes := make(chan int, 20)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { codes <- h.post(t, body, time.Now()).Code })
	}
	wg.Wait()
	close(codes)
	counts := map[int]int{}
	for c := range codes {
		counts[c]++
	}
	if counts[200]+counts[409] != 20 || counts[200] < 1 {
		t.Errorf("answers = %v, want only 200 and 409", counts)
	}
	if got := h.metric(t, "webhook_deliveries_total", "provider", "stripe", "outcome", "processed"); got != 1 {
		t.Errorf("processed = %v, want exactly 1", got)
	}
	if !h.writtenOnce(t, "sub_conc") {
		t.Error("20 concurrent deliveries wrote the row more than once")
	}
}

func TestRetryWhileClaimHeld(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	// Another attempt (this replica or another) holds the claim.
	held := "processing|other-replica|" + strconv.FormatInt(time.Now().UnixMilli(), 10) + "|x"
	if err := h.rdb.Set(t.Context(), h.claims.Key("stripe", "evt_held"), held, 2*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	w := h.post(t, ev{id: "evt_held", sub: "sub_held", status: "active", created: 1764590400}.body(t), time.Now())
	assertAnswer(t, w, 409, "in-progress")
	if ra := w.Header().Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After = %q, want the seconds left on the claim", ra)
	}
	if h.rows(t) != 0 {
		t.Error("a delivery that met a held claim wrote a row")
	}
}

// A caught failure (here: Postgres blocked past the handler deadline)
// releases the claim, so the provider's retry is a first delivery.
func TestFailureReleasesAndRetrySucceeds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{handlerTimeout: 300 * time.Millisecond})
	body := ev{id: "evt_fail", sub: "sub_fail", status: "active", created: 1764590400}.body(t)

	tx, err := h.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `LOCK TABLE entitlements IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	w := h.post(t, body, time.Now())
	_ = tx.Rollback(t.Context())
	assertAnswer(t, w, 500, "first")
	if w.Body.String() != `{"error":"webhook processing failed"}` {
		t.Errorf("body = %s", w.Body)
	}
	if n := h.rdb.Exists(t.Context(), h.claims.Key("stripe", "evt_fail")).Val(); n != 0 {
		t.Fatal("claim not released after the failure")
	}

	assertAnswer(t, h.post(t, body, time.Now()), 200, "first")
	if r, ok := h.row(t, "sub_fail"); !ok || r.lastEventID != "evt_fail" {
		t.Fatalf("row after retry = %+v (found %v)", r, ok)
	}
}

func TestOlderEventAfterNewer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	newer := ev{id: "evt_new", sub: "sub_o", status: "past_due", prevStatus: "active", created: 1764600000}
	older := ev{id: "evt_older", sub: "sub_o", status: "active", prevStatus: "incomplete", created: 1764590000}
	assertAnswer(t, h.post(t, newer.body(t), time.Now()), 200, "first")
	assertAnswer(t, h.post(t, older.body(t), time.Now()), 200, "first")
	if r, _ := h.row(t, "sub_o"); r.status != "past_due" || r.lastEventID != "evt_new" {
		t.Errorf("row = %+v, want past_due from evt_new", r)
	}
	if got := h.metric(t, "entitlements_stale_events_total"); got != 1 {
		t.Errorf("entitlements_stale_events_total = %v, want 1", got)
	}
}

func TestSameSecondEitherOrder(t *testing.T) {
	t.Parallel()
	created := ev{id: "evt_s1", typ: "customer.subscription.created", status: "incomplete", created: 1764590400}
	updated := ev{id: "evt_s2", status: "active", prevStatus: "incomplete", created: 1764590400}
	for _, order := range []string{"in order", "reversed"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, options{})
			a, b := created, updated
			if order == "reversed" {
				a, b = b, a
			}
			a.sub, b.sub = "sub_tie", "sub_tie"
			assertAnswer(t, h.post(t, a.body(t), time.Now()), 200, "first")
			assertAnswer(t, h.post(t, b.body(t), time.Now()), 200, "first")
			if r, _ := h.row(t, "sub_tie"); r.status != "active" || r.lastEventID != "evt_s2" {
				t.Errorf("row = %+v, want the successor's state (active, evt_s2)", r)
			}
		})
	}
}

func TestCanceledIsNeverRevived(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	deleted := ev{id: "evt_del", typ: "customer.subscription.deleted", sub: "sub_x", status: "canceled", prevStatus: "active", created: 1764590400}
	later := ev{id: "evt_later", sub: "sub_x", status: "active", prevStatus: "canceled", created: 1764690400}
	assertAnswer(t, h.post(t, deleted.body(t), time.Now()), 200, "first")
	assertAnswer(t, h.post(t, later.body(t), time.Now()), 200, "first")
	if r, _ := h.row(t, "sub_x"); r.status != "canceled" {
		t.Errorf("status = %q, want canceled for good", r.status)
	}
}

func TestUnhandledTypeIgnored(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := []byte(`{"id":"evt_inv","object":"event","type":"invoice.paid","created":1764590400,"data":{"object":{"id":"in_1"}}}`)
	w := h.post(t, body, time.Now())
	if w.Code != 200 || w.Body.String() != `{"received":true,"ignored":true}` {
		t.Errorf("answer = %d %s, want 200 ignored", w.Code, w.Body)
	}
	if h.rows(t) != 0 || h.rdb.Exists(t.Context(), h.claims.Key("stripe", "evt_inv")).Val() != 0 {
		t.Error("an ignored event wrote a row or took a claim")
	}
}

// Nothing unauthenticated has an effect: 400, no claim, no row.
func TestRejected(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := ev{id: "evt_bad", sub: "sub_bad", status: "active", created: 1764590400}.body(t)
	other := ev{id: "evt_bad", sub: "sub_bad", status: "canceled", created: 1764590400}.body(t)
	otherSig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: other, Secret: secret}).Header
	wrongSecret := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_other"}).Header
	stale := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: time.Now().Add(-301 * time.Second)}).Header
	validGarbage := []byte(`{"id": "evt_bad", "type": `)
	garbageSig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: validGarbage, Secret: secret}).Header
	noSub := []byte(`{"id":"evt_bad","type":"customer.subscription.updated","created":1764590400,"data":{"object":{"id":"sub_bad"}}}`)
	noSubSig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: noSub, Secret: secret}).Header

	tests := []struct {
		name   string
		body   []byte
		sig    string
		reason string // webhook_rejections_total's
	}{
		{"no signature", body, "", "signature"},
		{"malformed header", body, "garbage", "signature"},
		{"wrong secret", body, wrongSecret, "signature"},
		{"signature of another body", body, otherSig, "signature"},
		{"timestamp past tolerance", body, stale, "timestamp"},
		{"valid signature, unparseable JSON", validGarbage, garbageSig, "malformed"},
		{"valid signature, subscription without customer or status", noSub, noSubSig, "malformed"},
	}
	reasons := map[string]float64{}
	verification := 0.0
	for _, tt := range tests {
		reasons[tt.reason]++
		if tt.reason == "signature" || tt.reason == "timestamp" {
			verification++
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := h.postWithHeader(tt.body, tt.sig)
			if w.Code != 400 {
				t.Errorf("status = %d, want 400 (%s)", w.Code, w.Body)
			}
			if got := w.Header().Get(claim.HeaderIdempotency); got != "" {
				t.Errorf("a rejected delivery reached the claim (%s: %s)", claim.HeaderIdempotency, got)
			}
		})
	}
	if h.rows(t) != 0 {
		t.Error("a rejected delivery wrote a row")
	}
	if n := h.rdb.Exists(t.Context(), h.claims.Key("stripe", "evt_bad")).Val(); n != 0 {
		t.Error("a rejected delivery took a claim")
	}
	// "rejected" deliveries are verification failures only: the
	// signatures-refused alert watches them.
	if got := h.metric(t, "webhook_deliveries_total", "provider", "stripe", "outcome", "rejected"); got != verification {
		t.Errorf("rejected metric = %v, want %v", got, verification)
	}
	for reason, want := range reasons {
		if got := h.metric(t, "webhook_rejections_total", "provider", "stripe", "reason", reason); got != want {
			t.Errorf("webhook_rejections_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

func TestBodyOverCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	body := []byte(`{"id":"evt_big","pad":"` + strings.Repeat("x", claim.MaxBody) + `"}`)
	w := h.post(t, body, time.Now())
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", w.Code)
	}
}

func TestWithoutRedis(t *testing.T) {
	t.Parallel()
	t.Run("fail open", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, options{noRedis: true})
		body := ev{id: "evt_nr", sub: "sub_nr", status: "active", created: 1764590400}.body(t)
		assertAnswer(t, h.post(t, body, time.Now()), 200, "degraded")
		// A second delivery runs too, and the store keeps it harmless.
		assertAnswer(t, h.post(t, body, time.Now()), 200, "degraded")
		if r, ok := h.row(t, "sub_nr"); !ok || r.status != "active" {
			t.Errorf("row = %+v (found %v)", r, ok)
		}
		if got := h.metric(t, "webhook_claim_degraded_total", "provider", "stripe", "reason", "no_redis"); got != 2 {
			t.Errorf("degraded metric = %v, want 2", got)
		}
	})
	t.Run("fail closed", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, options{noRedis: true, failClosed: true})
		w := h.post(t, ev{id: "evt_fc", sub: "sub_fc", status: "active", created: 1764590400}.body(t), time.Now())
		assertAnswer(t, w, 503, "degraded")
		if w.Header().Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		if h.rows(t) != 0 {
			t.Error("fail-closed delivery wrote a row")
		}
	})
}

// Redis dies mid-run: deliveries keep being processed, visibly degraded,
// and the claim comes back when Redis does, without a restart.
func TestRedisDiesAndReturns(t *testing.T) {
	t.Parallel()
	srv := dbtest.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{
		Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true,
		DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond,
	})
	t.Cleanup(func() { rdb.Close() })
	h := newHarness(t, options{rdb: rdb})

	post := func(id, sub string, created int64) *httptest.ResponseRecorder {
		return h.post(t, ev{id: id, sub: sub, status: "active", created: created}.body(t), time.Now())
	}
	assertAnswer(t, post("evt_r1", "sub_r1", 1764590400), 200, "first")

	srv.Kill()
	assertAnswer(t, post("evt_r2", "sub_r2", 1764590401), 200, "degraded")
	assertAnswer(t, post("evt_r3", "sub_r3", 1764590402), 200, "degraded")
	if got := h.metric(t, "webhook_claim_degraded_total", "provider", "stripe", "reason", "redis_error"); got != 2 {
		t.Errorf("degraded metric = %v, want 2", got)
	}

	srv.Start()
	deadline := time.Now().Add(10 * time.Second)
	var w *httptest.ResponseRecorder
	for {
		w = post("evt_r4", "sub_r4", 1764590403)
		if w.Header().Get(claim.HeaderIdempotency) == "first" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assertAnswer(t, w, 200, "first")
	assertAnswer(t, post("evt_r4", "sub_r4", 1764590403), 200, "duplicate")
	if n := h.rows(t); n != 4 {
		t.Errorf("rows = %d, want 4: one per event, none lost", n)
	}
}

// Hostile bodies that carry a valid signature still have no effect unless
// they are a well-formed event: 400 (or 415), no claim, no row.
func TestHostileBodies(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	deep := []byte(`{"id":"evt_deep","type":"customer.subscription.updated","data":` + strings.Repeat(`[`, 20000) + strings.Repeat(`]`, 20000) + `}`)
	huge := []byte(`{"id":"evt_huge","type":"customer.subscription.updated","created":1764590400,"data":{"object":{"id":"sub_huge","items":[` +
		strings.Repeat(`1,`, 400000) + `1]}}}`)
	tests := []struct {
		name        string
		body        []byte
		contentType string
		status      int
	}{
		{"deeply nested JSON", deep, "application/json", 400},
		{"huge JSON under the cap, not an event", huge, "application/json", 400},
		{"form-encoded", []byte(`id=evt_form&type=customer.subscription.updated`), "application/x-www-form-urlencoded", 415},
		{"no content type", ev{id: "evt_noct", sub: "sub_noct", status: "active", created: 1764590400}.body(t), "", 415},
		{"text/plain", ev{id: "evt_text", sub: "sub_text", status: "active", created: 1764590400}.body(t), "text/plain", 415},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: tt.body, Secret: secret})
			r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(tt.body))
			if tt.contentType != "" {
				r.Header.Set("Content-Type", tt.contentType)
			}
			r.Header.Set("Stripe-Signature", signed.Header)
			w := httptest.NewRecorder()
			h.handler.ServeHTTP(w, r)
			if w.Code != tt.status {
				t.Errorf("status = %d, want %d (%s)", w.Code, tt.status, w.Body)
			}
			if !json.Valid(w.Body.Bytes()) {
				t.Errorf("answer is not JSON: %s", w.Body)
			}
		})
	}
	if n := h.rows(t); n != 0 {
		t.Errorf("hostile bodies wrote %d rows", n)
	}
	if keys := h.rdb.Keys(t.Context(), h.claims.Key("stripe", "*")).Val(); len(keys) != 0 {
		t.Errorf("hostile bodies took claims: %v", keys)
	}
}

// Every verdict of the store is one of the flow's effects; a state read
// from Stripe and stored is applied.
func TestEffectOfVerdict(t *testing.T) {
	t.Parallel()
	for v, want := range map[entitlements.Verdict]claim.Effect{
		entitlements.Applied:     claim.Applied,
		entitlements.Unchanged:   claim.Unchanged,
		entitlements.Stale:       claim.Stale,
		entitlements.Unordered:   claim.Unordered,
		entitlements.Revalidated: claim.Applied,
	} {
		if got := effect(v); got != want {
			t.Errorf("effect(%s) = %s, want %s", v, got, want)
		}
	}
}
