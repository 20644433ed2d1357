package stripehook

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/dbtest"
	"github.com/munchable/munchable-webhooks/internal/entitlements"
)

// benchFixture is the bundled customer.subscription.updated event compacted
// as Stripe sends it: about 3 KiB.
func benchFixture(b *testing.B) []byte {
	b.Helper()
	raw, err := os.ReadFile("../../testdata/events/customer.subscription.updated.json")
	if err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// benchEvent is the fixture with its event and subscription ids made
// unique by n.
func benchEvent(fixture []byte, n int) []byte {
	suffix := strconv.Itoa(n)
	body := bytes.Replace(fixture, []byte("evt_1QmunchableUpdated0001"), []byte("evt_bench_"+suffix), 1)
	return bytes.ReplaceAll(body, []byte("sub_1QmunchableSub0001"), []byte("sub_bench_"+suffix))
}

func benchSignature(body []byte, secret string) string {
	return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret}).Header
}

// BenchmarkVerify: the signature check of a 3 KiB event, as Handler calls it.
func BenchmarkVerify(b *testing.B) {
	body := benchFixture(b)
	sig := benchSignature(body, secret)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := webhook.ValidatePayloadWithTolerance(body, sig, secret, Tolerance); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode: decoding a verified 3 KiB subscription event.
func BenchmarkDecode(b *testing.B) {
	body := benchFixture(b)
	r := New(Config{})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.decode(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValid: json.Valid over the same event, the least a fast path
// for duplicates must do before claiming (an unparseable event gets 400
// and takes no claim). Such a path would save a duplicate
// Decode - Valid - extracting the id, and cost a first delivery Valid on
// top of Decode, which it still needs once the claim is taken.
func BenchmarkValid(b *testing.B) {
	body := benchFixture(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if !json.Valid(body) {
			b.Fatal("invalid")
		}
	}
}

// benchHandler is the Stripe handler on real Redis and Postgres (throwaway
// servers from TestMain when TEST_REDIS_URL or TEST_DATABASE_URL is unset),
// logging at warn as the
// load harness runs it.
func benchHandler(b *testing.B) http.Handler {
	b.Helper()
	pool := dbtest.NewPool(b)
	rdb, prefix := dbtest.Redis(b)
	reg := prometheus.NewRegistry()
	claims := claim.NewStore(rdb, claim.StoreConfig{Prefix: prefix, Timeout: time.Second, ProcessingTTL: 2 * time.Minute})
	flow := claim.NewFlow(claims, claim.FlowConfig{
		HandlerTimeout: 30 * time.Second,
		Logger:         slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Registerer:     reg,
	})
	ep := flow.Endpoint(claim.Provider{Name: "stripe", DedupeTTL: 72 * time.Hour})
	return New(Config{Store: entitlements.NewStore(pool, reg), Secret: secret, Registerer: reg}).Handler(ep)
}

// benchRequest is one request, reused across iterations so that the
// benchmark counts the handler's allocations rather than its own.
type benchRequest struct {
	r    *http.Request
	body bytes.Reader
	w    benchWriter
}

func newBenchRequest() *benchRequest {
	br := &benchRequest{r: httptest.NewRequest(http.MethodPost, "/webhooks/stripe", nil), w: benchWriter{h: http.Header{}}}
	br.r.Header.Set("Content-Type", "application/json; charset=utf-8")
	return br
}

type benchBody struct{ *bytes.Reader }

func (benchBody) Close() error { return nil }

// benchWriter is a ResponseWriter that keeps the status and drops the body.
type benchWriter struct {
	h    http.Header
	code int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.code = code }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }

func (br *benchRequest) serve(b *testing.B, h http.Handler, body []byte, sig string, want int) {
	br.body.Reset(body)
	br.r.Body = benchBody{&br.body}
	br.r.ContentLength = int64(len(body))
	br.r.Header.Set("Stripe-Signature", sig)
	clear(br.w.h)
	br.w.code = 0
	h.ServeHTTP(&br.w, br.r)
	if br.w.code != want {
		b.Fatalf("status = %d, want %d", br.w.code, want)
	}
}

// BenchmarkHandlerFirst: a new event end to end, in process: read, verify,
// decode, claim, upsert, confirm (the request is built outside the timer).
func BenchmarkHandlerFirst(b *testing.B) {
	h := benchHandler(b)
	fixture := benchFixture(b)
	br := newBenchRequest()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		b.StopTimer()
		i++
		body := benchEvent(fixture, i)
		sig := benchSignature(body, secret)
		b.StartTimer()
		br.serve(b, h, body, sig, http.StatusOK)
	}
}

// BenchmarkHandlerDuplicate: an event already done, delivered again.
func BenchmarkHandlerDuplicate(b *testing.B) {
	h := benchHandler(b)
	body := benchFixture(b)
	sig := benchSignature(body, secret)
	br := newBenchRequest()
	br.serve(b, h, body, sig, http.StatusOK)
	b.ReportAllocs()
	for b.Loop() {
		br.serve(b, h, body, sig, http.StatusOK)
	}
}

// BenchmarkHandlerRejected: a bad signature, answered 400.
func BenchmarkHandlerRejected(b *testing.B) {
	h := benchHandler(b)
	body := benchFixture(b)
	sig := benchSignature(body, "whsec_other")
	br := newBenchRequest()
	b.ReportAllocs()
	for b.Loop() {
		br.serve(b, h, body, sig, http.StatusBadRequest)
	}
}
