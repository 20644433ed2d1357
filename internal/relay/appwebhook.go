package relay

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	svix "github.com/svix/svix-webhooks/go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/tracing"
)

// AppWebhookConsumer is the consumer name of the app's webhook.
const AppWebhookConsumer = "app_webhook"

// AppWebhookParallel is how many of the app's webhooks are in flight at
// once, each of another subject. One at a time, an app 50 ms away would
// take at most 20 changes a second, fewer than a busy service makes; and
// the relay's goroutine, waking once per answer, spent more CPU a webhook.
const AppWebhookParallel = 8

// AppWebhookTimeout is how long the app has to answer: the Standard
// Webhooks spec recommends 15 to 30 s, and a shorter wait frees the
// delivery sooner for the retry schedule.
const AppWebhookTimeout = 15 * time.Second

// maxAppRetryAfter bounds what an app's Retry-After can ask for: the
// retry schedule's longest step, so that a wrong header (a date years
// ahead) cannot park a subject for longer than the schedule would.
const maxAppRetryAfter = 10 * time.Hour

// appAnswerExcerpt bounds the piece of an app's refusal kept in the error
// (and so in relay_deliveries.last_error): enough for a framework's error
// message, never a whole HTML page.
const appAnswerExcerpt = 200

// AppWebhookConfig is the app's webhook as the operator configures it.
type AppWebhookConfig struct {
	// URL receives every POST; https unless AllowHTTP.
	URL string
	// Secret is the Standard Webhooks signing secret, whsec_ + base64.
	Secret string
	// Kinds are the change kinds the app asked for (ledger.Kind*).
	Kinds     []string
	AllowHTTP bool
	// Timeout is how long the app has to answer; 0 is AppWebhookTimeout.
	Timeout time.Duration
}

// AppWebhook delivers changes to the app as Standard Webhooks: one signed
// POST per change, whose webhook-id (chg_<change id>) and body are fixed by
// the change, so every retry of a change is the same message to an app
// that dedupes by webhook-id. Only the signature's timestamp is the
// attempt's own, as the spec asks. It is safe for concurrent use.
type AppWebhook struct {
	url     string
	signer  *svix.Webhook
	kinds   []string
	client  *http.Client
	timeout time.Duration
	now     func() time.Time
}

// NewAppWebhook checks cfg and builds the destination.
func NewAppWebhook(cfg AppWebhookConfig) (*AppWebhook, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" || (u.Scheme != "https" && (u.Scheme != "http" || !cfg.AllowHTTP)) {
		// The URL is not quoted: its query may carry the app's token.
		return nil, errors.New("app webhook URL: want an https URL (http only when allowed)")
	}
	if !strings.HasPrefix(cfg.Secret, "whsec_") {
		return nil, errors.New("app webhook secret: want whsec_ and base64")
	}
	// base64's own error quotes the offending byte of the secret: not
	// repeated here.
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(cfg.Secret, "whsec_"))
	if err != nil || len(key) < 24 || len(key) > 64 {
		return nil, errors.New("app webhook secret: want whsec_ and 24 to 64 bytes in base64 (the Standard Webhooks bounds)")
	}
	signer, err := svix.NewWebhookRaw(key)
	if err != nil {
		return nil, errors.New("app webhook secret: refused by svix")
	}
	if len(cfg.Kinds) == 0 {
		return nil, errors.New("app webhook kinds: want at least one")
	}
	kinds := make([]string, 0, len(cfg.Kinds))
	for _, k := range cfg.Kinds {
		if !IsAppWebhookKind(k) {
			return nil, fmt.Errorf("app webhook kinds: %q is not a change kind nor access", k)
		}
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = AppWebhookTimeout
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// One idle connection kept for each delivery in flight: with net/http's
	// default of two, six of eight connections were closed after each
	// answer and dialled again for the next.
	transport.MaxIdleConnsPerHost = AppWebhookParallel
	return &AppWebhook{
		url:    u.String(),
		signer: signer,
		kinds:  kinds,
		client: &http.Client{
			Transport: transport,
			// A redirect is answered as the 3xx it is (see Deliver): the
			// signed request goes only where the operator pointed it,
			// never downgraded to http or sent to another host.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		timeout: timeout,
		now:     time.Now,
	}, nil
}

// IsChangeKind reports whether k is a kind of the change feed.
func IsChangeKind(k string) bool {
	switch k {
	case ledger.KindSubscription, ledger.KindCustomerFeatures, ledger.KindCheckoutSession, ledger.KindSupportMessage:
		return true
	}
	return false
}

// Kinds are the change kinds the consumer app_webhook delivers, for the
// relay to filter on: those the app asked for, without access (the
// consumer app_access's, access.go); Deliver skips any other.
func (a *AppWebhook) Kinds() []string {
	return slices.DeleteFunc(slices.Clone(a.kinds), func(k string) bool { return k == KindAccess })
}

// LogValue keeps the signer out of logs; the URL is left out too, since
// its query may hold the app's own token.
func (a *AppWebhook) LogValue() slog.Value {
	return slog.GroupValue(slog.String("consumer", AppWebhookConsumer), slog.Any("kinds", a.kinds))
}

// AppWebhookID is the webhook-id of a change: the same on every attempt.
func AppWebhookID(changeID int64) string { return "chg_" + strconv.FormatInt(changeID, 10) }

// AppWebhookBody is the body of the POST for ch: {"type", "timestamp",
// "data"}, data being the change as `changes tail` prints it without its
// cursor (a position in this service's feed, meaningless to the app).
func AppWebhookBody(ch ledger.Change) ([]byte, error) {
	type data struct {
		ID               int64           `json:"id"`
		Kind             string          `json:"kind"`
		Subject          string          `json:"subject"`
		StripeCustomerID *string         `json:"stripe_customer_id"`
		EventID          *string         `json:"event_id"`
		At               time.Time       `json:"at"`
		Before           json.RawMessage `json:"before"`
		After            json.RawMessage `json:"after"`
	}
	body := struct {
		Type      string    `json:"type"`
		Timestamp time.Time `json:"timestamp"`
		Data      data      `json:"data"`
	}{
		Type: ch.Kind + ".changed",
		// When the change happened, not when it is sent: the spec's
		// timestamp is the event's, and a retry repeats it.
		Timestamp: ch.At.UTC(),
		Data: data{
			ID: ch.ID, Kind: ch.Kind, Subject: ch.Subject,
			StripeCustomerID: ch.StripeCustomerID, EventID: ch.EventID,
			At: ch.At, Before: appNullJSON(ch.Before), After: appNullJSON(ch.After),
		},
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode change %d: %w", ch.ID, err)
	}
	return b, nil
}

// appNullJSON is raw as it is, or JSON null when empty (a new row's before).
func appNullJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// Deliver POSTs ch to the app. A 2xx within the timeout is delivered, with
// the status code as the result. 408, 429, 5xx, a 3xx, network errors and
// timeouts are retried (429's and 503's Retry-After honoured); any other
// 4xx is permanent. A 3xx is retried rather than dead: it says the
// endpoint moved, which no change of the message mends but a corrected
// APP_WEBHOOK_URL does, and the changes waiting on the schedule then go
// out in order by themselves instead of each needing relay retry by hand.
func (a *AppWebhook) Deliver(ctx context.Context, ch ledger.Change) (string, error) {
	if !slices.Contains(a.kinds, ch.Kind) {
		return "", fmt.Errorf("%w: kind %s is not in APP_WEBHOOK_KINDS", ErrSkip, ch.Kind)
	}
	body, err := AppWebhookBody(ch)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrPermanent, err)
	}
	return a.post(ctx, AppWebhookID(ch.ID), body)
}

// post sends one signed webhook: body under the identity id, the
// signature's timestamp the attempt's own.
func (a *AppWebhook) post(ctx context.Context, id string, body []byte) (string, error) {
	now := a.now()
	sig, err := a.signer.Sign(id, now, body)
	if err != nil {
		return "", fmt.Errorf("sign %s: %w", id, err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("%w: build the request for %s", ErrPermanent, id)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "munchable-webhooks")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	// The relay's span for this attempt, when traced: the app's own trace
	// continues the delivery's (nothing is written when untraced).
	tracing.Propagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := a.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "", fmt.Errorf("post %s: no answer within %s", id, a.timeout)
		}
		// net/http's *url.Error repeats the URL, query included; its
		// cause names only the address.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return "", fmt.Errorf("post %s: %w", id, err)
	}
	defer resp.Body.Close()
	return a.classify(id, resp)
}

// classify turns the app's answer into the relay's verdict.
func (a *AppWebhook) classify(id string, resp *http.Response) (string, error) {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		// Drained a little so the connection can be reused; the answer is
		// already in.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return strconv.Itoa(code), nil
	}
	answer := fmt.Errorf("post %s: app answered %s%s", id, appStatusText(code), appExcerpt(resp.Body))
	switch {
	case code >= 300 && code < 400:
		return "", fmt.Errorf("%w (a redirect is not followed: point APP_WEBHOOK_URL at %s)", answer, appExcerptOf(resp.Header.Get("Location")))
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if after, ok := appRetryAfter(resp.Header.Get("Retry-After"), a.now()); ok {
			return "", &RetryAfterError{After: after, Err: answer}
		}
		return "", answer
	case code == http.StatusRequestTimeout || code >= 500:
		return "", answer
	case code >= 400:
		return "", fmt.Errorf("%w: %w", ErrPermanent, answer)
	}
	// 1xx after the headers, or a code outside HTTP's: not an answer.
	return "", answer
}

func appStatusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return strconv.Itoa(code) + " " + t
	}
	return strconv.Itoa(code)
}

// appExcerpt is ": " and the start of body, bounded and printable, or ""
// when the body is empty.
func appExcerpt(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 4*appAnswerExcerpt))
	s := appExcerptOf(string(b))
	if s == "" {
		return ""
	}
	return ": " + s
}

// appExcerptOf is s on one line, valid UTF-8, at most appAnswerExcerpt
// bytes.
func appExcerptOf(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	if len(s) > appAnswerExcerpt {
		cut := appAnswerExcerpt
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

// appRetryAfter reads a Retry-After header, seconds or an HTTP date,
// bounded to [0, maxAppRetryAfter].
func appRetryAfter(h string, now time.Time) (time.Duration, bool) {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0, false
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(h, 10, 64); err == nil {
		if secs > int64(maxAppRetryAfter/time.Second) {
			secs = int64(maxAppRetryAfter / time.Second)
		}
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = t.Sub(now)
	} else {
		return 0, false
	}
	return min(max(d, 0), maxAppRetryAfter), true
}
