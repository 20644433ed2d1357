package resendhook_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/munchable/munchable-webhooks/internal/claim"
	"github.com/munchable/munchable-webhooks/internal/ledger"
	"github.com/munchable/munchable-webhooks/internal/resendhook"
	"github.com/munchable/munchable-webhooks/internal/sweep"
)

// listReceived answers GET /emails/receiving as List Received Emails
// documents it (testdata/resend/received_emails.json and its README): the
// emails the fake knows, newest first (ties by id), limit 1 to 100,
// after or before an id (excluded), has_more. Each entry is the page's
// example entry with the email's own fields.
func (f *fakeResend) listReceived(w http.ResponseWriter, r *http.Request) {
	if !f.authorized(w, r) {
		return
	}
	q := r.URL.Query()
	limit := 20
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			f.apiError(w, http.StatusUnprocessableEntity)
			return
		}
		limit = n
	}
	type listed struct {
		entry   map[string]any
		created time.Time
	}
	f.mu.Lock()
	all := make([]listed, 0, len(f.emails))
	for _, raw := range f.emails {
		var e map[string]any
		_ = json.Unmarshal(raw, &e)
		entry := map[string]any{}
		for k, v := range f.receivedTemplate() {
			entry[k] = v
		}
		for _, k := range []string{"id", "to", "cc", "bcc", "from", "created_at", "subject", "message_id"} {
			if v, ok := e[k]; ok {
				entry[k] = v
			}
		}
		created, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(e["created_at"]))
		all = append(all, listed{entry, created})
	}
	f.mu.Unlock()
	slices.SortFunc(all, func(a, b listed) int {
		if c := b.created.Compare(a.created); c != 0 {
			return c
		}
		return cmp.Compare(fmt.Sprint(b.entry["id"]), fmt.Sprint(a.entry["id"]))
	})
	index := func(id string) int {
		return slices.IndexFunc(all, func(l listed) bool { return l.entry["id"] == id })
	}
	lo, hi := 0, len(all)
	switch {
	case q.Get("after") != "":
		lo = index(q.Get("after")) + 1
	case q.Get("before") != "":
		hi = max(index(q.Get("before")), 0)
		lo = max(hi-limit, 0)
	}
	page := all[lo:min(lo+limit, hi)]
	data := make([]any, len(page))
	for i, l := range page {
		data[i] = l.entry
	}
	more := lo+limit < hi
	if q.Get("before") != "" {
		more = lo > 0
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "has_more": more, "data": data})
}

// receivedTemplate is the example entry of List Received Emails.
func (f *fakeResend) receivedTemplate() map[string]any {
	b, err := os.ReadFile("../../testdata/resend/received_emails.json")
	if err != nil {
		panic(err)
	}
	var page struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(b, &page); err != nil || len(page.Data) == 0 {
		panic(fmt.Sprintf("received_emails.json: %v", err))
	}
	return page.Data[0]
}

// TestSweepQueuesMailOnlyInResendsList: of 250 received emails (three
// pages), one to sales is not ours, one was delivered by its webhook, and
// one is older than the window: the pass queues the 247 others once,
// counted recovered, the delivered one counted delivered; a second pass
// queues nothing; a webhook delivery after the sweep queues nothing new.
func TestSweepQueuesMailOnlyInResendsList(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{quiet: true})
	now := time.Now().UTC()
	id := func(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }
	for i := range 250 {
		created := now.Add(-time.Duration(i) * time.Second)
		if i == 249 {
			created = now.Add(-2 * time.Hour)
		}
		h.api.addEmail(t, id(i), func(e map[string]any) {
			e["created_at"] = created.Format(time.RFC3339Nano)
			e["message_id"] = fmt.Sprintf("<sweep-%d@example.com>", i)
			if i == 7 {
				e["to"] = []string{"sales@munchable.app"}
			}
		})
	}
	if w := h.deliver(t, "msg_delivered", receivedEvent(t, id(3), nil)); w.Code != http.StatusOK {
		t.Fatalf("webhook delivery: %d %s", w.Code, w.Body)
	}
	pass := h.receiver.SweepPass(h.ep, 0)
	n, err := pass(t.Context(), now.Add(-time.Hour))
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if want := (sweep.Counts{Listed: 249, Recovered: 247, Delivered: 1}); n != want {
		t.Errorf("sweep = %+v, want %+v", n, want)
	}
	if got := len(h.rows(t)); got != 248 {
		t.Errorf("%d messages queued, want 248 (247 swept, 1 delivered)", got)
	}
	n, err = pass(t.Context(), now.Add(-time.Hour))
	if err != nil || n.Recovered != 0 || n.Delivered != 248 {
		t.Errorf("second sweep = %+v, %v; want nothing recovered, 248 delivered", n, err)
	}
	if w := h.deliver(t, "msg_late", receivedEvent(t, id(10), nil)); w.Code != http.StatusOK {
		t.Fatalf("late webhook delivery: %d %s", w.Code, w.Body)
	}
	if got := len(h.rows(t)); got != 248 {
		t.Errorf("%d messages queued after a late delivery, want still 248", got)
	}
}

// TestSweptMailRetriedByHand: a swept mail whose fetch fails leaves its
// ledger row failed, with the email.received event a webhook would have
// carried kept as its body; events retry runs that body again, under the
// sweep's claim id, once the API answers.
func TestSweptMailRetriedByHand(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{quiet: true})
	const emailID = "00000000-0000-4000-8000-00000000beef"
	h.api.addEmail(t, emailID, func(e map[string]any) { e["created_at"] = time.Now().UTC().Format(time.RFC3339Nano) })
	h.api.failWith(emailID, http.StatusInternalServerError)
	led := ledger.New(h.pool, 5)
	ep := claim.NewFlow(h.store, claim.FlowConfig{HandlerTimeout: 10 * time.Second, Ledger: led, Logger: slog.New(slog.DiscardHandler)}).
		Endpoint(claim.Provider{Name: "resend", DedupeTTL: 30 * time.Hour})

	if _, err := h.receiver.SweepPass(ep, 0)(t.Context(), time.Now().Add(-time.Hour)); err == nil {
		t.Fatal("sweep with the fetch failing: no error")
	}
	id := resendhook.SweepClaimPrefix + emailID
	row, err := led.Get(t.Context(), "resend", id)
	if err != nil || row.Outcome != ledger.Failed || len(row.Body) == 0 {
		t.Fatalf("ledger row of %s = %+v, %v; want failed with a body kept", id, row, err)
	}

	h.api.failWith(emailID, 0)
	ev, err := h.receiver.Event(id, row.Body) // as events retry reads it
	if err != nil || ev.ID != id || ev.Apply == nil {
		t.Fatalf("the kept body as an event = %+v, %v; want a runnable %s", ev, err, id)
	}
	if res, err := ep.Process(t.Context(), row.Body, ev); err != nil || res.Outcome != claim.Processed || res.Effect != claim.Applied {
		t.Fatalf("retry = %+v, %v; want processed (applied)", res, err)
	}
	if got := len(h.rows(t)); got != 1 {
		t.Errorf("%d messages queued, want 1", got)
	}
	if row, err := led.Get(t.Context(), "resend", id); err != nil || row.Outcome != ledger.Applied {
		t.Errorf("ledger row after the retry = %+v, %v; want applied", row, err)
	}
}

// TestFakeListsReceivedLikeResend: the fake's cursors behave as
// documented: after and before exclude their id, has_more says whether
// the walk can go on.
func TestFakeListsReceivedLikeResend(t *testing.T) {
	t.Parallel()
	f := newFakeResend(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		f.addEmail(t, fmt.Sprintf("e%d", i), func(e map[string]any) {
			e["created_at"] = base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339Nano)
		})
	}
	get := func(query string) (ids []string, more bool) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, f.srv.URL+"/emails/receiving?"+query, nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var page struct {
			Object  string `json:"object"`
			HasMore bool   `json:"has_more"`
			Data    []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || page.Object != "list" {
			t.Fatalf("%s: %v, object %q", query, err, page.Object)
		}
		for _, d := range page.Data {
			ids = append(ids, d.ID)
		}
		return ids, page.HasMore
	}
	for _, c := range []struct {
		query string
		ids   []string
		more  bool
	}{
		{"limit=2", []string{"e4", "e3"}, true},
		{"limit=2&after=e3", []string{"e2", "e1"}, true},
		{"limit=2&after=e1", []string{"e0"}, false},
		{"limit=2&before=e1", []string{"e3", "e2"}, true},
		{"limit=100", []string{"e4", "e3", "e2", "e1", "e0"}, false},
	} {
		ids, more := get(c.query)
		if !slices.Equal(ids, c.ids) || more != c.more {
			t.Errorf("%s = %v, has_more %t; want %v, %t", c.query, ids, more, c.ids, c.more)
		}
	}
}
