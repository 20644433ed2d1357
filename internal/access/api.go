package access

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
)

// DefaultPage is a page's size when ?limit is not given.
const DefaultPage = 100

// API serves GET /v1/access: the answers of the customers one key names,
// or a page of every customer's, to a caller with one of its tokens.
type API struct {
	store  *Store
	tokens [][sha256.Size]byte
	logger *slog.Logger
}

// NewAPI serves store's answers to callers that send one of tokens as
// their bearer token (APP_API_TOKEN; several, for rotation).
func NewAPI(store *Store, tokens []string, logger *slog.Logger) *API {
	a := &API{store: store, logger: logger}
	for _, t := range tokens {
		a.tokens = append(a.tokens, sha256.Sum256([]byte(t)))
	}
	return a
}

// authorized compares the request's bearer token with every token, in
// time that does not depend on where they differ: each is compared as
// its SHA-256, so neither the tokens' lengths nor their bytes leak, and
// every token is compared whichever matches.
func (a *API) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	match := 0
	for _, want := range a.tokens {
		match |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return match == 1
}

// ServeHTTP answers 401 without a valid token (never logged), 400 for a
// query that names no key, two keys, or a key and a page, 200 with
// {"data": [...]} for a key and {"data": [...], "next": ...} for a page.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !a.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="munchable-webhooks"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "want Authorization: Bearer <one of APP_API_TOKEN>"})
		return
	}
	q := r.URL.Query()
	var named []Key
	for _, k := range Keys {
		if q.Has(string(k)) {
			named = append(named, k)
		}
	}
	paged := q.Has("after")
	switch {
	case len(named) > 1 || (len(named) == 1 && paged):
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want exactly one of client_reference_id, stripe_customer_id, stripe_subscription_id, or after"})
	case len(named) == 1:
		a.lookup(w, r, named[0], q.Get(string(named[0])))
	case paged:
		a.page(w, r, q.Get("after"), q.Get("limit"))
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want one of client_reference_id, stripe_customer_id, stripe_subscription_id, or after (empty: the first page)"})
	}
}

func (a *API) lookup(w http.ResponseWriter, r *http.Request, key Key, value string) {
	if value == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": string(key) + " is empty: want an id"})
		return
	}
	answers, err := a.store.Lookup(r.Context(), key, value)
	if err != nil {
		a.logger.Error("GET /v1/access failed", "key", string(key), "err", err)
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": answers})
}

func (a *API) page(w http.ResponseWriter, r *http.Request, after, limitText string) {
	limit := DefaultPage
	if limitText != "" {
		n, err := strconv.Atoi(limitText)
		if err != nil || n < 1 || n > MaxPage {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "limit: want a number from 1 to " + strconv.Itoa(MaxPage)})
			return
		}
		limit = n
	}
	answers, next, err := a.store.Page(r.Context(), after, limit)
	if err != nil {
		a.logger.Error("GET /v1/access?after failed", "err", err)
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
		return
	}
	var nextCursor *string
	if next != "" {
		nextCursor = &next
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": answers, "next": nextCursor})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
