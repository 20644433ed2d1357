package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79/webhook"
	svix "github.com/svix/svix-webhooks/go"
)

const sendUsage = `usage: munchable-webhooks send [flags] EVENT_FILE

Signs a sample event (testdata/events/*.json) the way its provider does and
posts it to the service: the offline stand-in for "stripe trigger". The
secret comes from STRIPE_WEBHOOK_SECRET or RESEND_WEBHOOK_SECRET; the
provider from the event's type (email.* is Resend, anything else Stripe);
the service's address from -url, else from LISTEN_ADDR (default :8080) on
loopback, as healthcheck finds it.
Prints one line per answer: status, Webhook-Idempotency, Retry-After, body.
Exits 1 when any request got no answer or an answer other than 2xx (a 409
or a 400 included), so scripts can rely on it, and says on stderr what a
400 or a 5xx most likely means; 2 on a wrong command line.`

// sendConfig holds the signing secrets (send needs only the provider's
// own) and where the service listens.
type sendConfig struct {
	StripeWebhookSecret secret `env:"STRIPE_WEBHOOK_SECRET"`
	ResendWebhookSecret secret `env:"RESEND_WEBHOOK_SECRET"`
	ListenAddr          string `env:"LISTEN_ADDR" envDefault:":8080"`
}

func (sendConfig) validate() []error { return nil }

// sendFlags is the send command line.
type sendFlags struct {
	url         string
	provider    string
	n           int
	concurrency int
	age         time.Duration
	id          string
	file        string
}

func parseSendFlags(args []string, stdout, stderr io.Writer) (sendFlags, error) {
	var f sendFlags
	cmd := newCommand("send", sendUsage, stdout, stderr)
	fs := cmd.flags
	fs.StringVar(&f.url, "url", "", "base `URL` of the service; the path is the provider's webhook route (default: LISTEN_ADDR's port on 127.0.0.1, http://127.0.0.1:8080 when unset)")
	fs.StringVar(&f.provider, "provider", "", "stripe or resend (default: from the event's type)")
	fs.IntVar(&f.n, "n", 1, "send `N` times, one after another")
	fs.IntVar(&f.concurrency, "concurrency", 1, "send `C` copies at once (each of the N times)")
	fs.DurationVar(&f.age, "age", 0, "backdate the signature's timestamp by this much (e.g. 10m: stale)")
	fs.StringVar(&f.id, "id", "", "event id (Stripe) or svix-id (Resend) to send instead of the file's")
	pos, err := cmd.parse(args, -1)
	if err != nil {
		return f, err
	}
	if len(pos) != 1 {
		return f, cmd.misuse("want exactly one EVENT_FILE")
	}
	f.file = pos[0]
	if f.n < 1 || f.concurrency < 1 {
		return f, cmd.misuse("-n and -concurrency must be at least 1")
	}
	return f, nil
}

func send(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	f, err := parseSendFlags(args, stdout, stderr)
	if err != nil {
		return err
	}
	cfg, err := parseEnv[sendConfig](environ)
	if err != nil {
		return err
	}
	if f.url == "" {
		if _, _, err := net.SplitHostPort(cfg.ListenAddr); err != nil {
			return fmt.Errorf("send: LISTEN_ADDR is %q: want host:port or :port, such as :8080 (or give -url)", cfg.ListenAddr)
		}
		f.url = strings.TrimSuffix(healthzURL(cfg.ListenAddr), "/healthz")
	}
	body, err := os.ReadFile(f.file)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	out, err := newOutgoing(f, cfg, body)
	if err != nil {
		return err
	}

	client := &http.Client{Timeout: 2 * time.Minute} // longer than any handler deadline
	failed := 0
	statuses := map[int]bool{}
	for range f.n {
		answers := make(chan answer, f.concurrency)
		for range f.concurrency {
			go func() { answers <- out.post(ctx, client, time.Now().Add(-f.age)) }()
		}
		// Printed as they arrive: with -concurrency the order is the race's.
		for range f.concurrency {
			a := <-answers
			if a.status < 200 || a.status > 299 {
				failed++
			}
			statuses[a.status] = true
			fmt.Fprintln(stdout, a.line)
		}
	}
	if statuses[http.StatusBadRequest] {
		fmt.Fprintf(stderr, "send: 400: the service refused the delivery before looking at it. Most likely %s is not the secret the service runs with "+
			"(make dev and docker compose use the dev-only values in the Makefile), or the file is not a %s event; "+
			"the service logs the reason (signature, timestamp, malformed, ...) in the reason field of its \"webhook delivery\" line\n", out.secretName, out.provider)
	}
	for status := range statuses {
		if status >= 500 && status != http.StatusServiceUnavailable {
			fmt.Fprintf(stderr, "send: %d: the service failed to apply the event and released its claim; the err field of its \"webhook delivery\" log line says why\n", status)
			break
		}
	}
	if failed > 0 {
		return fmt.Errorf("send: %d of %d requests got no answer or not a 2xx", failed, f.n*f.concurrency)
	}
	return nil
}

// outgoing is one event ready to be signed and posted any number of times.
type outgoing struct {
	provider   string // stripe or resend
	secretName string // the variable that holds its signing secret
	url        string
	body       []byte
	// sign returns the provider's signature headers for a send at the given
	// time.
	sign func(at time.Time) http.Header
}

func newOutgoing(f sendFlags, cfg sendConfig, body []byte) (outgoing, error) {
	var ev struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return outgoing{}, fmt.Errorf("send: %s is not a JSON event: %w", f.file, err)
	}
	provider := f.provider
	if provider == "" {
		provider = "stripe"
		if strings.HasPrefix(ev.Type, "email.") {
			provider = "resend"
		}
	}
	base := strings.TrimSuffix(f.url, "/")

	switch provider {
	case "stripe":
		secret := string(cfg.StripeWebhookSecret)
		if secret == "" {
			return outgoing{}, errors.New("send: STRIPE_WEBHOOK_SECRET is required to sign a Stripe event")
		}
		if f.id != "" {
			var err error
			if body, err = withEventID(body, f.id); err != nil {
				return outgoing{}, fmt.Errorf("send: %s: %w", f.file, err)
			}
		}
		return outgoing{provider: provider, secretName: "STRIPE_WEBHOOK_SECRET", url: base + "/webhooks/stripe", body: body, sign: func(at time.Time) http.Header {
			signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: secret, Timestamp: at})
			return http.Header{"Stripe-Signature": {signed.Header}}
		}}, nil

	case "resend":
		wh, err := svix.NewWebhook(string(cfg.ResendWebhookSecret))
		if err != nil || cfg.ResendWebhookSecret == "" {
			return outgoing{}, errors.New("send: RESEND_WEBHOOK_SECRET is required to sign a Resend event: the whsec_... signing secret")
		}
		// Svix keeps one id across the retries of a message, so an id derived
		// from the body makes a repeated send a redelivery.
		msgID := f.id
		if msgID == "" {
			sum := sha256.Sum256(body)
			msgID = "msg_" + hex.EncodeToString(sum[:12])
		}
		return outgoing{provider: provider, secretName: "RESEND_WEBHOOK_SECRET", url: base + "/webhooks/resend", body: body, sign: func(at time.Time) http.Header {
			sig, _ := wh.Sign(msgID, at, body) // only HMAC: it never fails
			return http.Header{
				"Svix-Id":        {msgID},
				"Svix-Timestamp": {strconv.FormatInt(at.Unix(), 10)},
				"Svix-Signature": {sig},
			}
		}}, nil
	}
	return outgoing{}, fmt.Errorf("send: -provider %q: want stripe or resend", provider)
}

// withEventID returns the event with its top-level id replaced. The body is
// re-encoded, which is fine: the signature is computed over what is sent.
func withEventID(body []byte, id string) ([]byte, error) {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, err
	}
	ev["id"], _ = json.Marshal(id)
	return json.Marshal(ev)
}

// answer is one request's outcome: its status (0 for none) and the line
// that describes it.
type answer struct {
	status int
	line   string
}

// post signs and sends the event once and describes the answer in one line.
func (o outgoing) post(ctx context.Context, client *http.Client, at time.Time) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(o.body))
	if err != nil {
		return answer{line: "error: " + err.Error()}
	}
	for k, v := range o.sign(at) {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{line: "error: " + err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return answer{status: resp.StatusCode, line: fmt.Sprintf("%d idempotency=%s retry-after=%s %s", resp.StatusCode,
		orDash(resp.Header.Get("Webhook-Idempotency")), orDash(resp.Header.Get("Retry-After")),
		strings.TrimSpace(string(b)))}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
