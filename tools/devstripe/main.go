// Command devstripe is a stand-in for the part of the Stripe API that the
// service and its stripe commands call, so that `make dev` can run stripe
// verify, sync and replay, events retry of a Stripe event and the Stripe
// sweep without a Stripe account. It is internal/stripetest's fake, served
// by a program, holding Stripe's side of the sample purchase of
// testdata/events (see its README): for development only, never built into
// the image.
//
//	devstripe [-addr 127.0.0.1:0] [-events testdata/events] [-env-file FILE] [-- command args...]
//
// Stripe's state, as the stand-in serves it:
//
//   - the events of the quick start (checkout.session.completed,
//     customer.subscription.created and .updated, the entitlement summary),
//     each delivered, retrievable by id;
//   - the subscription as customer.subscription.updated leaves it;
//   - the customer's active entitlements: the summary's sso, api_access and
//     exports, and one more, priority_support, attached to her plan since.
//     Its entitlement summary event (created when devstripe starts) is
//     listed as not delivered: a lost webhook. That one field is the drift
//     the README's quick start shows stripe verify finding and --repair
//     mending; stripe replay --undelivered, or the Stripe sweep, delivers
//     the lost event instead.
//
// Like Stripe, it answers subscriptions and their items in the API version
// each request names (Stripe-Version: the period on the items from
// 2025-03-31.basil on, on the subscription before), and events as they
// were created.
//
// With a command, devstripe runs it with STRIPE_API_URL set to its own URL
// and STRIPE_API_KEY to a dev-only key (unless STRIPE_API_KEY is already
// set: then it only runs the command, which talks to the Stripe that key
// is for), serves until the command ends, and exits with the command's
// status, leaving SIGINT and SIGTERM to the command as tools/devresend
// does. -env-file appends both variables, as the command gets them, to
// FILE (withservers' env file) for a second shell.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/munchable/munchable-webhooks/internal/stripetest"
	"github.com/munchable/munchable-webhooks/tools/devrun"
)

func main() {
	code, err := run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devstripe:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// The variables that point the service at the Stripe API, and the key
// the stand-in hands out (it accepts any: this one is dev-only and
// published).
const (
	urlEnv = "STRIPE_API_URL"
	keyEnv = "STRIPE_API_KEY"
	devKey = "sk_test_dev_only"
)

func run(args, environ []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("devstripe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "`host:port` to listen on (port 0: any free one; the URL is printed and given to the command)")
	events := fs.String("events", "testdata/events", "`directory` of the sample events whose state Stripe holds")
	envFile := fs.String("env-file", "", "`file` to append STRIPE_API_URL and STRIPE_API_KEY to, as the command gets them, for `set -a; . FILE` in another shell")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0, nil
	} else if err != nil {
		return 2, err
	}
	command := fs.Args()

	if devrun.Lookup(environ, keyEnv) != "" && len(command) > 0 {
		fmt.Fprintf(stderr, "devstripe: %s is set: not serving, the command uses it\n", keyEnv)
		vars := [][2]string{{keyEnv, devrun.Lookup(environ, keyEnv)}}
		if u := devrun.Lookup(environ, urlEnv); u != "" {
			vars = append(vars, [2]string{urlEnv, u})
		}
		if err := devrun.AppendEnv(*envFile, vars...); err != nil {
			return 1, err
		}
		return devrun.Run(command, environ, nil, stdout, stderr)
	}

	api, err := load(*events, time.Now())
	if err != nil {
		return 1, err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return 1, err
	}
	base := "http://" + ln.Addr().String()
	srv := &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}()
	fmt.Fprintf(stderr, "devstripe: dev-only stand-in for the Stripe API on %s, holding the sample purchase of %s and one lost webhook\n", base, *events)
	env := [][2]string{{urlEnv, base}, {keyEnv, devKey}}
	if err := devrun.AppendEnv(*envFile, env...); err != nil {
		return 1, err
	}

	if len(command) == 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		select {
		case <-ctx.Done():
			return 0, nil
		case err := <-served:
			return 1, err
		}
	}
	return devrun.Run(command, environ, []string{urlEnv + "=" + base, keyEnv + "=" + devKey}, stdout, stderr)
}

// The sample events Stripe holds, delivered; the subscription's state is
// the last one's, the customer's entitlements the summary's plus one.
var (
	sampleEvents = []string{
		"checkout.session.completed.json",
		"customer.subscription.created.json",
		"customer.subscription.updated.json",
		"entitlements.active_entitlement_summary.updated.json",
	}
	subscriptionEvent = "customer.subscription.updated.json"
	summaryEvent      = "entitlements.active_entitlement_summary.updated.json"
)

// lostEventID is the entitlement summary Stripe could not deliver.
const lostEventID = "evt_1QmunchableSummary0002"

// load builds Stripe's state from the sample events under dir; the lost
// event is created at now.
func load(dir string, now time.Time) (*stripetest.API, error) {
	api := stripetest.NewUnstarted()
	raws := map[string][]byte{}
	for _, name := range sampleEvents {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if !json.Valid(raw) {
			return nil, fmt.Errorf("%s: not JSON", name)
		}
		raws[name] = raw
		api.AddEvent(raw, true)
	}

	var sub struct {
		Data struct {
			Object json.RawMessage `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raws[subscriptionEvent], &sub); err != nil {
		return nil, fmt.Errorf("%s: %w", subscriptionEvent, err)
	}
	api.PutSubscription(sub.Data.Object)

	var summary map[string]any
	if err := json.Unmarshal(raws[summaryEvent], &summary); err != nil {
		return nil, fmt.Errorf("%s: %w", summaryEvent, err)
	}
	object, _ := path(summary, "data", "object").(map[string]any)
	customer, _ := object["customer"].(string)
	active, _ := path(object, "entitlements", "data").([]any)
	if customer == "" || len(active) == 0 {
		return nil, fmt.Errorf("%s: want a customer and active entitlements", summaryEvent)
	}
	first, _ := active[0].(map[string]any)
	added := clone(first)
	added["id"], added["lookup_key"] = "ent_61U", "priority_support"
	feature, _ := added["feature"].(map[string]any)
	if feature == nil {
		return nil, fmt.Errorf("%s: an entitlement without its feature", summaryEvent)
	}
	feature["id"], feature["lookup_key"], feature["name"] = "feat_61U", "priority_support", "priority_support"
	now4 := append(slices.Clone(active), added)
	raw := make([][]byte, len(now4))
	for i, e := range now4 {
		raw[i] = marshal(e)
	}
	api.SetActiveEntitlements(customer, raw...)

	lost := clone(summary)
	lost["id"], lost["created"], lost["pending_webhooks"] = lostEventID, now.Unix(), 1
	lostObject := path(lost, "data", "object").(map[string]any)
	path(lostObject, "entitlements").(map[string]any)["data"] = now4
	path(lost, "data").(map[string]any)["previous_attributes"] = map[string]any{"entitlements": clone(object["entitlements"].(map[string]any))}
	api.AddEvent(marshal(lost), false)
	return api, nil
}

// path walks decoded JSON objects by key; nil when one is missing.
func path(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// clone deep-copies a decoded JSON object.
func clone(m map[string]any) map[string]any {
	var out map[string]any
	if err := json.Unmarshal(marshal(m), &out); err != nil {
		panic(err)
	}
	return out
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // decoded JSON always encodes
	}
	return b
}
