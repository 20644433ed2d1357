package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/munchable/munchable-webhooks/internal/access"
	"github.com/munchable/munchable-webhooks/internal/ledger"
)

// KindAccess is the APP_WEBHOOK_KINDS entry for access.changed: the
// customer's whole access answer (internal/access), sent whenever a change
// can move it and when an access_ends_at passes.
const KindAccess = "access"

// accessKinds are the change kinds that can move a customer's answer.
var accessKinds = []string{ledger.KindSubscription, ledger.KindCustomerFeatures, ledger.KindCheckoutSession}

// answerFields are the fields of a change's after that an answer reads
// (or that move a row to another customer or user); a change of others
// only (a period end that renews, metadata) leaves the answer as it was.
var answerFields = []string{"status", "access_ends_at", "items", "lookup_keys",
	"client_reference_id", "stripe_subscription_id", "stripe_customer_id"}

// IsAppWebhookKind reports whether k may be in APP_WEBHOOK_KINDS.
func IsAppWebhookKind(k string) bool { return k == KindAccess || IsChangeKind(k) }

// Access reports whether the app asked for access.changed.
func (a *AppWebhook) Access() bool { return slices.Contains(a.kinds, KindAccess) }

// AppAccessConsumer is the consumer name of access.changed: the app's
// webhook (same URL, same secret), in a consumer of its own so that it
// has its own start, cursor and order (per customer), and a relay leader
// without it (a replica without access, mid-rollout) disables it without
// moving its cursor, as with any consumer.
const AppAccessConsumer = "app_access"

// AppConsumers are the consumers of app: app_webhook, the change kinds
// the app asked for, one webhook a change in order per subject; and,
// with access, app_access, the customer's answer after each change that
// can move it, in order per customer. The answer is read when it is
// sent: it is then at least as new as the change, often newer, and its
// version says which is the newest (internal/access).
func AppConsumers(app *AppWebhook, answers *access.Store) []Consumer {
	var out []Consumer
	if kinds := app.Kinds(); len(kinds) > 0 {
		out = append(out, Consumer{Name: AppWebhookConsumer, Kinds: kinds, Destination: app, Parallel: AppWebhookParallel})
	}
	if app.Access() {
		out = append(out, Consumer{
			Name: AppAccessConsumer, Kinds: slices.Clone(accessKinds), Takes: movesAnswer,
			Destination: &appAccess{app: app, answers: answers}, Parallel: AppWebhookParallel, OrderBy: customerOf,
		})
	}
	return out
}

// customerOf is a change's customer, "" for one without.
func customerOf(ch ledger.Change) string {
	if ch.StripeCustomerID == nil {
		return ""
	}
	return *ch.StripeCustomerID
}

// appAccess is the app's webhook sending access.changed.
type appAccess struct {
	app     *AppWebhook
	answers *access.Store
}

// Deliver sends the answer of ch's customer, read now. The relay hands
// it only changes that can move an answer (movesAnswer); any other is
// skipped.
func (d *appAccess) Deliver(ctx context.Context, ch ledger.Change) (string, error) {
	if !movesAnswer(ch) {
		return "", fmt.Errorf("%w: change %d does not move a customer's access answer", ErrSkip, ch.ID)
	}
	ans, err := d.answers.Customer(ctx, customerOf(ch))
	if err != nil {
		return "", err
	}
	return d.app.SendAnswer(ctx, ans)
}

// movesAnswer reports whether ch can move its customer's answer: a new
// row of an access kind with a customer, or a change of a field the
// answer reads.
func movesAnswer(ch ledger.Change) bool {
	if customerOf(ch) == "" || !slices.Contains(accessKinds, ch.Kind) {
		return false
	}
	if len(ch.Before) == 0 || string(ch.Before) == "null" {
		return true
	}
	var after map[string]json.RawMessage
	if err := json.Unmarshal(ch.After, &after); err != nil {
		return true // unreadable: sending an unchanged answer costs less than missing one
	}
	return slices.ContainsFunc(answerFields, func(f string) bool { _, ok := after[f]; return ok })
}

// AccessWebhookID is the webhook-id of an answer, acc_<customer>_<version>:
// one id per read of the answer, a later read's version higher.
func AccessWebhookID(a access.Answer) string {
	return "acc_" + a.StripeCustomerID + "_" + strconv.FormatInt(a.Version, 10)
}

// AccessWebhookBody is the body of access.changed: {"type", "timestamp",
// "data"}, data being the answer as GET /v1/access gives it.
func AccessWebhookBody(a access.Answer) ([]byte, error) {
	b, err := json.Marshal(struct {
		Type      string        `json:"type"`
		Timestamp time.Time     `json:"timestamp"`
		Data      access.Answer `json:"data"`
	}{Type: "access.changed", Timestamp: a.At, Data: a})
	if err != nil {
		return nil, fmt.Errorf("encode the answer of %s: %w", a.StripeCustomerID, err)
	}
	return b, nil
}

// SendAnswer POSTs a as access.changed, answered as Deliver's POSTs are.
func (a *AppWebhook) SendAnswer(ctx context.Context, ans access.Answer) (string, error) {
	body, err := AccessWebhookBody(ans)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrPermanent, err)
	}
	return a.post(ctx, AccessWebhookID(ans), body)
}

// ExpiryConfig is what an Expiry runs on.
type ExpiryConfig struct {
	Pool    *pgxpool.Pool
	App     *AppWebhook
	Answers *access.Store
	// Every is how often it looks for access that ended (0: 10 s); an
	// ending is sent within Every and the time the sends take.
	Every      time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Expiry sends access.changed for every customer whose access_ends_at
// passed, although no event came and no row changed. It runs on the
// relay's leader, under its fence, and keeps how far it has sent in
// access_expiry (no feed row: the feed grows only with real changes). A
// send that fails stops the pass there; the next pass sends again from
// it, so an ending is never passed over, and an answer sent twice is the
// same answer under a newer version. One the app refuses for good (a
// 4xx) is logged and passed, as a dead delivery would be.
type Expiry struct {
	pool    *pgxpool.Pool
	app     *AppWebhook
	answers *access.Store
	every   time.Duration
	logger  *slog.Logger
	sent    *prometheus.CounterVec
}

// expiryBatch is how many endings one read takes.
const expiryBatch = 500

// NewExpiry builds the pass and registers relay_access_expiries_total.
func NewExpiry(cfg ExpiryConfig) *Expiry {
	e := &Expiry{pool: cfg.Pool, app: cfg.App, answers: cfg.Answers, every: cfg.Every, logger: cfg.Logger}
	if e.every <= 0 {
		e.every = 10 * time.Second
	}
	if e.logger == nil {
		e.logger = slog.New(slog.DiscardHandler)
	}
	e.sent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_access_expiries_total",
		Help: "access.changed webhooks sent because an access_ends_at passed, by outcome (delivered, failed).",
	}, []string{"outcome"})
	for _, o := range []string{"delivered", "failed"} {
		e.sent.WithLabelValues(o)
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(e.sent)
	}
	return e
}

const (
	// A consumer new to access_expiry starts now: endings before it were
	// never promised (as a new consumer starts at the end of the feed).
	// Register runs it with the consumer's start; a pass runs it again
	// for a relay run without Register (it then changes nothing).
	expiryStartSQL = `INSERT INTO access_expiry (consumer, handled_to, updated_at) VALUES ($1, now(), now())
ON CONFLICT (consumer) DO NOTHING`
	expiryMarkSQL = `SELECT handled_to FROM access_expiry WHERE consumer = $1`
	expiryMoveSQL = `UPDATE access_expiry SET handled_to = $2, updated_at = now() WHERE consumer = $1`
)

// Run passes every Every until ctx ends (nil) or the fence fails (an
// error wrapping ErrFenced). A failed pass is logged and tried again.
func (e *Expiry) Run(ctx context.Context, fence Fence) error {
	for {
		err := e.Pass(ctx, fence)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrFenced):
			return err
		case err != nil:
			e.logger.Error("relay: sending the ends of access failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(e.every):
		}
	}
}

// Pass sends the answer of every customer whose access ended since the
// last pass, oldest ending first, and moves the mark past them.
func (e *Expiry) Pass(ctx context.Context, fence Fence) error {
	var mark time.Time
	err := e.inTx(ctx, fence, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, expiryStartSQL, AppAccessConsumer); err != nil {
			return err
		}
		return tx.QueryRow(ctx, expiryMarkSQL, AppAccessConsumer).Scan(&mark)
	})
	if err != nil {
		return fmt.Errorf("relay: access_expiry mark: %w", err)
	}
	for {
		ended, now, err := e.answers.Expired(ctx, mark, expiryBatch)
		if err != nil {
			return err
		}
		to, sendErr := e.send(ctx, mark, ended)
		if len(ended) < expiryBatch && sendErr == nil {
			to = now // the whole window is sent
		}
		if to.After(mark) {
			if err := e.inTx(ctx, fence, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, expiryMoveSQL, AppAccessConsumer, to)
				return err
			}); err != nil {
				return fmt.Errorf("relay: move access_expiry: %w", err)
			}
			mark = to
		}
		if sendErr != nil || len(ended) < expiryBatch {
			return sendErr
		}
	}
}

// send sends each ended customer's answer once, in order, and returns
// the mark that covers what went: every ending before the first that
// failed (the endings at that same instant are sent again next time).
func (e *Expiry) send(ctx context.Context, mark time.Time, ended []access.Expiry) (time.Time, error) {
	done := map[string]bool{}
	for i, x := range ended {
		if done[x.StripeCustomerID] {
			continue
		}
		ans, err := e.answers.Customer(ctx, x.StripeCustomerID)
		if err == nil {
			_, err = e.app.SendAnswer(ctx, ans)
		}
		done[x.StripeCustomerID] = true
		switch {
		case err == nil:
			e.sent.WithLabelValues("delivered").Inc()
		case errors.Is(err, ErrPermanent):
			// Refused (a 4xx other than 408 and 429), as a dead
			// delivery is: no retry mends it, and it must not hold back
			// every ending after it. The customer's next change sends
			// its answer again.
			e.sent.WithLabelValues("failed").Inc()
			e.logger.Error("relay: the app refused an end of access; not sent again", "customer", x.StripeCustomerID, "err", err)
		default:
			e.sent.WithLabelValues("failed").Inc()
			return before(mark, ended[:i], x.EndsAt), fmt.Errorf("access ended for %s: %w", x.StripeCustomerID, err)
		}
	}
	if len(ended) == 0 {
		return mark, nil
	}
	// A full batch may end inside a run of equal endings: the last
	// instant is read again by the next batch, unless the whole batch is
	// that instant (500 endings in one microsecond), which would never
	// move on.
	last := ended[len(ended)-1].EndsAt
	if to := before(mark, ended, last); !to.Equal(mark) {
		return to, nil
	}
	return last, nil
}

// before is the latest ending in sent that is strictly before t, or mark.
func before(mark time.Time, sent []access.Expiry, t time.Time) time.Time {
	for i := len(sent) - 1; i >= 0; i-- {
		if sent[i].EndsAt.Before(t) {
			return sent[i].EndsAt
		}
	}
	return mark
}

func (e *Expiry) inTx(ctx context.Context, fence Fence, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if fence != nil {
			if err := fence(ctx, tx); err != nil {
				return fmt.Errorf("%w: %w", ErrFenced, err)
			}
		}
		return fn(tx)
	})
}
