package support

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/mail"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/cors"

	"github.com/munchable/munchable-webhooks/internal/intake"
	"github.com/munchable/munchable-webhooks/internal/logsample"
)

// Limits of the support form. Lengths are in characters (runes), as a
// person typing counts them.
const (
	maxFormBody    = 256 << 10
	maxEmail       = 254 // RFC 5321's limit on a forward path
	maxName        = 200
	maxSubject     = 300
	maxMessage     = 20000
	maxIdemKey     = 255
	headerIdemKey  = "Idempotency-Key"
	contentJSON    = "application/json"
	contentForm    = "application/x-www-form-urlencoded"
	externalKey    = "key:"
	externalRandom = "form:"
)

// form is the support form as posted.
type form struct {
	Email, Name, Subject, Message string
	// Website is the honeypot: the page hides it from people, so only a bot
	// fills it in.
	Website string
}

// fieldErrors maps a field to what is wrong with it: the 422 body.
type fieldErrors map[string]string

func (e fieldErrors) add(field, problem string) {
	if _, ok := e[field]; !ok { // the first problem found is the one reported
		e[field] = problem
	}
}

// Outcomes of a post, the label of support_form_submissions_total.
const (
	outcomeAccepted    = "accepted"
	outcomeDuplicate   = "duplicate"
	outcomeInvalid     = "invalid"
	outcomeRateLimited = "rate_limited"
	outcomeSpam        = "spam"
	outcomeForbidden   = "forbidden" // from a page on an origin not listed
	outcomeFailed      = "failed"    // the database failed or was busy
)

// Limits of the form's database work, so that a slow or locked
// support_messages table cannot take the connections the webhooks need.
const (
	formDBTimeout   = 3 * time.Second
	formRetryAfter  = "5"
	formPoolDivisor = 4 // the form may hold a quarter of the pool
)

// FormConfig configures the support form.
type FormConfig struct {
	// Origins are the browser origins (SUPPORT_FORM_ORIGINS) whose pages may
	// post the form from another origin. When set, a browser post from any
	// other page is refused.
	Origins []string
	// RedirectURL is where a plain HTML form post is sent after success
	// (SUPPORT_FORM_REDIRECT_URL); empty: a thank-you page.
	RedirectURL string
	// Rate is how many posts a minute one client address may make, and
	// TrustedProxies the proxies whose X-Forwarded-For names the client.
	Rate           int
	TrustedProxies []netip.Prefix
	// DatabaseMaxConns is the size of the queue's pool: the form holds at
	// most a quarter of it (at least one connection).
	DatabaseMaxConns int
	// Intake reads the form's body, as it reads the webhooks': under
	// BODY_READ_TIMEOUT (408) and within the one body budget (503); nil:
	// no deadline or budget of its own.
	Intake *intake.Intake
	// A nil Logger discards; a nil Registerer leaves the metrics unregistered.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Refusals samples the log lines of refused posts (rate limited,
	// from another site, the database busy), which anyone can send by the
	// thousand; nil: a sampler of the form's own on Logger.
	Refusals *logsample.Sampler
}

// Form is the site's support form: its page, its CORS preflight and its
// post, which queues a message from source web.
type Form struct {
	queue       *Queue
	origins     origins
	cors        *cors.Cors
	limit       func(http.Handler) http.Handler
	pages       *pages
	redirectURL string
	dbSlots     chan struct{}
	bodies      *intake.Intake
	trusted     []netip.Prefix
	logger      *slog.Logger
	refusals    *logsample.Sampler
	submissions *prometheus.CounterVec
	// spamIDs are the ids honeypot posts were answered with, by key.
	spamIDs *spamIDs
}

// NewForm returns the support form, queueing into q.
func NewForm(q *Queue, cfg FormConfig) *Form {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	bodies := cfg.Intake
	if bodies == nil {
		bodies = intake.New(intake.Config{})
	}
	refusals := cfg.Refusals
	if refusals == nil {
		refusals = logsample.New(logger, logsample.Config{})
	}
	f := &Form{
		queue:       q,
		bodies:      bodies,
		origins:     newOrigins(cfg.Origins),
		pages:       newPages(cfg.RedirectURL),
		redirectURL: cfg.RedirectURL,
		dbSlots:     make(chan struct{}, max(1, cfg.DatabaseMaxConns/formPoolDivisor)),
		trusted:     cfg.TrustedProxies,
		spamIDs:     newSpamIDs(spamKeysKept),
		logger:      logger,
		refusals:    refusals,
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "support_form_submissions_total",
			Help: "Support form posts by outcome (spam: the honeypot was filled; nothing stored).",
		}, []string{"outcome"}),
	}
	f.cors = f.origins.cors()
	f.limit = rateLimit(cfg.Rate, cfg.TrustedProxies, f.rateLimited)
	for _, o := range []string{outcomeAccepted, outcomeDuplicate, outcomeInvalid, outcomeRateLimited,
		outcomeSpam, outcomeForbidden, outcomeFailed} {
		f.submissions.WithLabelValues(o)
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(f.submissions)
	}
	return f
}

// Page answers GET /support: the form, usable with or without JavaScript.
func (f *Form) Page() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		f.pages.form(w, http.StatusOK, form{}, nil)
	})
}

// Preflight answers OPTIONS /support/messages, the CORS preflight.
func (f *Form) Preflight() http.Handler {
	return f.cors.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent) // an OPTIONS that is no preflight
	}))
}

// Submit answers POST /support/messages: CORS, then the origin rule, then
// the rate limit, then decode, validate, store, respond.
func (f *Form) Submit() http.Handler {
	return f.cors.Handler(f.checkOrigin(f.limit(http.HandlerFunc(f.submit))))
}

func (f *Form) submit(w http.ResponseWriter, r *http.Request) {
	html := wantsHTML(r)
	in, errs, err := f.decode(w, r)
	if err != nil {
		f.submissions.WithLabelValues(outcomeInvalid).Inc()
		var ref *refusal
		errors.As(err, &ref)
		if ref.status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", formRetryAfter)
		}
		f.problem(w, html, ref.status, ref.msg)
		return
	}
	key := idempotencyKey(r.Header, errs)
	in = in.validate(errs)
	if len(errs) > 0 {
		f.invalid(w, html, in, errs)
		return
	}
	// Only now, so that a bot's invalid post gets the 422 a person's gets:
	// answered as a success, it would learn that the honeypot caught it.
	if in.Website != "" {
		f.spam(w, r, html, key)
		return
	}
	id, outcome, err := f.store(r.Context(), in.message(key))
	switch {
	case errors.Is(err, errKeyReused):
		f.invalid(w, html, in, fieldErrors{headerIdemKey: "was already used for a different message"})
		return
	case err != nil:
		f.failed(w, r, html, err)
		return
	}
	f.submissions.WithLabelValues(outcome).Inc()
	f.logger.InfoContext(r.Context(), "support form: message queued", "id", id, "outcome", outcome, "idempotency_key", key != "")
	f.respond(w, r, html, id)
}

// refusal is a post refused before its fields are read.
type refusal struct {
	status int
	msg    string
}

func (e *refusal) Error() string { return e.msg }

// decode reads the posted form, JSON or urlencoded, recording in the
// returned fieldErrors what is wrong with single fields; a *refusal when
// the body cannot be read as a form at all. The body is read by the same
// intake as the webhooks': a slow one gets 408 at BODY_READ_TIMEOUT rather
// than holding its memory until the server's ReadTimeout, and what it holds
// counts against the one body budget.
func (f *Form) decode(w http.ResponseWriter, r *http.Request) (form, fieldErrors, error) {
	ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (ct != contentJSON && ct != contentForm) {
		return form{}, nil, &refusal{http.StatusUnsupportedMediaType, "content type must be application/json or application/x-www-form-urlencoded"}
	}
	b, err := f.bodies.Read(w, r, maxFormBody)
	if err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			return form{}, nil, &refusal{http.StatusRequestEntityTooLarge, "body too large"}
		case errors.Is(err, intake.ErrTimeout):
			return form{}, nil, &refusal{http.StatusRequestTimeout, "body not received in time"}
		case errors.Is(err, intake.ErrBudget):
			return form{}, nil, &refusal{http.StatusServiceUnavailable, "too many messages being sent, try again in a few seconds"}
		}
		return form{}, nil, &refusal{http.StatusBadRequest, "could not read body"}
	}
	// Both decoders copy what they keep into strings.
	defer b.Release()
	body := b.Bytes()
	errs := fieldErrors{}
	decodeBody := decodeForm
	if ct == contentJSON {
		decodeBody = decodeJSON
	}
	in, err := decodeBody(body, errs)
	if err != nil {
		return form{}, nil, &refusal{http.StatusBadRequest, err.Error()}
	}
	return in, errs, nil
}

// message is the queued message of a valid form.
func (f form) message(key string) Message {
	m := Message{
		Source:      SourceWeb,
		FromAddress: f.Email,
		FromName:    f.Name,
		Subject:     f.Subject,
		TextBody:    f.Message,
		ReceivedAt:  time.Now(),
	}
	if key != "" {
		m.ExternalID = externalKey + key
	} else {
		m.ExternalID = externalRandom + randomHex()
	}
	return m
}

var (
	errKeyReused    = errors.New("idempotency key already used for a different message")
	errDatabaseBusy = errors.New("support queue busy")
)

// withDB runs do under the form's own deadline and share of the pool. No
// slot in time, or do failing once the deadline has passed, is
// errDatabaseBusy.
func (f *Form) withDB(ctx context.Context, do func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, formDBTimeout)
	defer cancel()
	select {
	case f.dbSlots <- struct{}{}:
		defer func() { <-f.dbSlots }()
	case <-ctx.Done():
		return fmt.Errorf("wait for one of %d database slots: %w", cap(f.dbSlots), errDatabaseBusy)
	}
	err := do(ctx)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", errDatabaseBusy, err)
	}
	return err
}

// store queues m (withDB), and says whether it was new (accepted) or an
// idempotent repeat (duplicate).
func (f *Form) store(ctx context.Context, m Message) (id int64, outcome string, err error) {
	inserted := false
	err = f.withDB(ctx, func(ctx context.Context) error {
		var err error
		if id, inserted, err = f.queue.Enqueue(ctx, m); err != nil || inserted {
			return err
		}
		// The key was used before. Answer the first message's id only if
		// this is the same message: a key reused for another message would
		// otherwise be acknowledged and silently dropped (the IETF
		// Idempotency-Key draft answers such a reuse with 422).
		same, err := sameForm(ctx, f.queue, id, m)
		if err == nil && !same {
			return errKeyReused
		}
		return err
	})
	switch {
	case err != nil:
		return 0, "", err
	case inserted:
		return id, outcomeAccepted, nil
	}
	return id, outcomeDuplicate, nil
}

// respond answers a post taken: 202 with the message's id for JSON
// clients; for a browser's plain post, 303 to the configured page or a
// thank-you page.
func (f *Form) respond(w http.ResponseWriter, r *http.Request, html bool, id int64) {
	switch {
	case !html:
		writeJSON(w, http.StatusAccepted, map[string]int64{"id": id})
	case f.redirectURL != "":
		http.Redirect(w, r, f.redirectURL, http.StatusSeeOther)
	default:
		f.pages.message(w, http.StatusOK, thanksTitle, thanksText)
	}
}

// failed answers a post the database could not take: 503 with
// Retry-After when it was busy, else 500.
func (f *Form) failed(w http.ResponseWriter, r *http.Request, html bool, err error) {
	f.submissions.WithLabelValues(outcomeFailed).Inc()
	if errors.Is(err, errDatabaseBusy) {
		f.refusals.Log(r.Context(), slog.LevelWarn, "support form busy", "support form: database busy, answered 503",
			slog.String("err", err.Error()))
		w.Header().Set("Retry-After", formRetryAfter)
		f.problem(w, html, http.StatusServiceUnavailable, "the support queue is busy, try again in a few seconds")
		return
	}
	f.logger.ErrorContext(r.Context(), "support form: store failed", "err", err)
	f.problem(w, html, http.StatusInternalServerError, "could not queue the message, try again")
}

// invalid answers 422: the problems as JSON, or the form again with them
// and with what was typed (never the honeypot). A post with the honeypot
// filled is answered the same and counted as spam: outcome invalid counts
// the people the form turned back.
func (f *Form) invalid(w http.ResponseWriter, html bool, in form, errs fieldErrors) {
	outcome := outcomeInvalid
	if in.Website != "" {
		outcome = outcomeSpam
	}
	f.submissions.WithLabelValues(outcome).Inc()
	if html {
		f.pages.form(w, http.StatusUnprocessableEntity, in, errs)
		return
	}
	writeJSON(w, http.StatusUnprocessableEntity, map[string]fieldErrors{"errors": errs})
}

// problem answers a refusal: {"error": msg}, or a short page saying it.
func (f *Form) problem(w http.ResponseWriter, html bool, status int, msg string) {
	if html {
		f.pages.message(w, status, "Your message was not sent", "Your message was not sent: "+msg+".")
		return
	}
	writeError(w, status, msg)
}

// checkOrigin refuses, 403, a browser post from a page the origin rule
// does not allow (origins.allows), before it can count against anyone's
// rate limit.
func (f *Form) checkOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.origins.allows(r) {
			f.submissions.WithLabelValues(outcomeForbidden).Inc()
			f.refusals.Log(r.Context(), slog.LevelInfo, "support form forbidden", "support form: post from another site refused",
				slog.String("origin", r.Header.Get("Origin")), slog.Bool("referer_sent", r.Header.Get("Referer") != ""))
			f.problem(w, wantsHTML(r), http.StatusForbidden, "this page may not send messages to support")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// rateLimited answers a client over its limit and leaves a trace of it.
func (f *Form) rateLimited(w http.ResponseWriter, r *http.Request) {
	f.submissions.WithLabelValues(outcomeRateLimited).Inc()
	f.refusals.Log(r.Context(), slog.LevelWarn, "support form rate limited", "support form: rate limited, answered 429",
		slog.String("client", clientKey(r, f.trusted)), slog.String("retry_after", w.Header().Get("Retry-After")))
	f.problem(w, wantsHTML(r), http.StatusTooManyRequests, "too many requests")
}

// sameForm reports whether the message queued under id is m, as the form
// stores it.
func sameForm(ctx context.Context, q *Queue, id int64, m Message) (bool, error) {
	got, err := q.Get(ctx, id)
	if err != nil {
		return false, err
	}
	return got.FromAddress == m.FromAddress && got.FromName == m.FromName &&
		got.Subject == m.Subject && got.TextBody == m.TextBody, nil
}

// errMalformed is the 400 answer's reason; its text is shown to the client.
var errMalformed = errors.New("malformed body")

// decodeJSON reads the form from a JSON object. Each field is checked for
// valid UTF-8 before it is decoded, because encoding/json silently turns
// invalid bytes into U+FFFD.
func decodeJSON(body []byte, errs fieldErrors) (form, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return form{}, fmt.Errorf("%w: want a JSON object", errMalformed)
	}
	var f form
	for _, fl := range f.fields() {
		v, ok := raw[fl.name]
		if !ok || bytes.Equal(v, []byte("null")) {
			continue
		}
		if !utf8.Valid(v) {
			errs.add(fl.name, "must be valid UTF-8")
			continue
		}
		if err := json.Unmarshal(v, fl.value); err != nil {
			errs.add(fl.name, "must be a string")
		}
	}
	// Any value at all in the honeypot gives a bot away, a string or not.
	if v, ok := raw["website"]; ok && !bytes.Equal(v, []byte("null")) && !bytes.Equal(v, []byte(`""`)) {
		f.Website = string(v)
	}
	return f, nil
}

// decodeForm reads the form from an urlencoded body. Only the first value of
// a repeated field counts.
func decodeForm(body []byte, errs fieldErrors) (form, error) {
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return form{}, fmt.Errorf("%w: want an urlencoded form", errMalformed)
	}
	var f form
	for _, fl := range f.fields() {
		v := vals.Get(fl.name)
		if !utf8.ValidString(v) {
			errs.add(fl.name, "must be valid UTF-8")
			continue
		}
		*fl.value = v
	}
	f.Website = vals.Get("website")
	return f, nil
}

// formField is one field a person fills in: its name, its value in the
// form, and its limit in characters (the page's maxlength too).
type formField struct {
	name  string
	value *string
	max   int
}

// fields are the form's fields in the order the page shows them.
func (f *form) fields() []formField {
	return []formField{
		{"email", &f.Email, maxEmail},
		{"name", &f.Name, maxName},
		{"subject", &f.Subject, maxSubject},
		{"message", &f.Message, maxMessage},
	}
}

// validate records every problem with f in errs and returns f as it will be
// stored: the one-line fields cleaned by OneLine, each field trimmed of
// surrounding white space.
func (f form) validate(errs fieldErrors) form {
	for _, fl := range f.fields() {
		v := fl.value
		if strings.ContainsRune(*v, 0) {
			errs.add(fl.name, "must not contain NUL characters")
		}
		if fl.name != "message" {
			if strings.ContainsAny(*v, "\r\n") {
				// These fields may end up in a mail header when support replies.
				errs.add(fl.name, "must not contain line breaks")
			}
			// The rest is cleaned as mail's same fields are.
			*v = OneLine(*v)
		}
		*v = strings.TrimSpace(*v)
		if utf8.RuneCountInString(*v) > fl.max {
			errs.add(fl.name, "must be at most "+strconv.Itoa(fl.max)+" characters")
		}
	}
	switch {
	case f.Email == "":
		errs.add("email", "is required")
	case !bareAddress(f.Email):
		errs.add("email", "must be a plain email address, such as name@example.com")
	}
	if f.Message == "" {
		errs.add("message", "is required")
	}
	return f
}

// bareAddress reports whether s is an addr-spec and nothing more: no
// display name, angle brackets or comments.
func bareAddress(s string) bool {
	a, err := mail.ParseAddress(s)
	return err == nil && a.Name == "" && a.Address == s
}

// idempotencyKey returns the Idempotency-Key header, "" when absent, and
// records a problem with it in errs.
func idempotencyKey(h http.Header, errs fieldErrors) string {
	vals, ok := h[http.CanonicalHeaderKey(headerIdemKey)]
	if !ok {
		return ""
	}
	const problem = "must be 1 to 255 printable ASCII characters"
	if len(vals) != 1 || len(vals[0]) < 1 || len(vals[0]) > maxIdemKey {
		errs.add(headerIdemKey, problem)
		return ""
	}
	for _, c := range []byte(vals[0]) {
		if c < 0x20 || c > 0x7e {
			errs.add(headerIdemKey, problem)
			return ""
		}
	}
	return vals[0]
}

// randomHex returns 128 random bits in hex: the external id of a post
// without an idempotency key, which no other post shares.
func randomHex() string {
	var b [16]byte
	crand.Read(b[:]) // never returns an error
	return hex.EncodeToString(b[:])
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only maps of strings and ints reach here
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
