// Command appreceiver is an example app (docs/APP.md) that keeps, from
// access.changed alone, every customer's access answer: it verifies each
// webhook with the Standard Webhooks library, handles each webhook-id
// once and keeps the highest version per customer; other kinds are
// acknowledged and ignored. A real app keeps both maps in its database.
// Run: APP_WEBHOOK_SECRET=whsec_... appreceiver [-addr 127.0.0.1:8090]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	svix "github.com/svix/svix-webhooks/go"
)

// answer is access.changed's data, the part this app reads.
type answer struct {
	Customer      string `json:"stripe_customer_id"`
	HasAccess     bool   `json:"has_access"`
	Subscriptions []struct {
		User            *string  `json:"client_reference_id"`
		HasAccess       bool     `json:"has_access"`
		PriceLookupKeys []string `json:"price_lookup_keys"`
		Features        []string `json:"features"`
	} `json:"subscriptions"`
	Version int64 `json:"version"`
}

func newApp(wh *svix.Webhook) http.Handler {
	var mu sync.Mutex
	handled, latest := map[string]bool{}, map[string]answer{} // webhook-ids; per customer, the highest version
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		var hook struct {
			Type string `json:"type"`
			Data answer `json:"data"`
		}
		if err != nil || wh.Verify(body, r.Header) != nil || json.Unmarshal(body, &hook) != nil {
			http.Error(w, "bad signature or body", http.StatusBadRequest)
			return
		}
		id, c := r.Header.Get("webhook-id"), hook.Data.Customer
		mu.Lock()
		defer mu.Unlock()
		if hook.Type == "access.changed" && !handled[id] && hook.Data.Version > latest[c].Version {
			latest[c] = hook.Data
			fmt.Printf("appreceiver: %s has_access=%t\n", id, hook.Data.HasAccess)
		}
		handled[id] = true
	})
	// ?user=U&key=K (U: the client_reference_id the app gave Checkout): the
	// customers naming U, whether one has access, and whether K is a price
	// or feature of a subscription with access.
	mux.HandleFunc("GET /access", func(w http.ResponseWriter, r *http.Request) {
		user, key := r.URL.Query().Get("user"), r.URL.Query().Get("key")
		out := struct {
			Customers []string `json:"customers"`
			HasAccess bool     `json:"has_access"`
			Key       string   `json:"key"`
			MayUse    bool     `json:"may_use"`
		}{Customers: []string{}, Key: key}
		mu.Lock()
		for c, ans := range latest {
			for _, s := range ans.Subscriptions {
				if s.User != nil && *s.User == user && !slices.Contains(out.Customers, c) {
					out.Customers, out.HasAccess = append(out.Customers, c), out.HasAccess || ans.HasAccess
					for _, s := range ans.Subscriptions {
						out.MayUse = out.MayUse || s.HasAccess && (slices.Contains(s.PriceLookupKeys, key) || slices.Contains(s.Features, key))
					}
				}
			}
		}
		mu.Unlock()
		slices.Sort(out.Customers)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	return mux
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	flag.Parse()
	wh, err := svix.NewWebhook(os.Getenv("APP_WEBHOOK_SECRET"))
	if err == nil {
		fmt.Printf("appreceiver: listening on http://%s/hooks\n", *addr)
		err = (&http.Server{Addr: *addr, Handler: newApp(wh), ReadHeaderTimeout: 5 * time.Second}).ListenAndServe()
	}
	fmt.Fprintln(os.Stderr, "appreceiver:", err)
	os.Exit(1)
}
