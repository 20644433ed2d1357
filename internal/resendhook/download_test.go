package resendhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestDownloadsOutsideTransaction: a mail's downloads run before its
// transaction, so slow attachment servers hold no Postgres connection.
// Four deliveries whose downloads take 2 s each run on a pool of 4 while
// another user of the pool (a Stripe delivery's share) queries it; each
// query waits for a connection no longer than a short, generous bound.
// Before the change every delivery held a connection through its
// download, and the other user waited the whole 2 s.
func TestDownloadsOutsideTransaction(t *testing.T) {
	t.Parallel()
	const (
		deliveries = 4
		slow       = 2 * time.Second
		bound      = slow / 2
	)
	h := newHarness(t, options{poolSize: deliveries})
	ids := make([]string, deliveries)
	for i := range ids {
		ids[i] = "slow-" + string(rune('a'+i))
		att := screenshot
		att.ID, att.Delay = "att-"+ids[i], slow
		h.api.addEmail(t, ids[i], func(e map[string]any) { e["text"] = "mail " + ids[i] }, att)
	}
	h.pool.Reset() // no warm connections: every delivery takes its own

	var wg sync.WaitGroup
	answers := make([]answer, deliveries)
	started := time.Now()
	for i, id := range ids {
		wg.Go(func() { answers[i] = answerOf(t, h.deliver(t, "msg_"+id, receivedEvent(t, id, nil))) })
	}
	var worst time.Duration
	queries := 0
	for time.Since(started) < slow+slow/2 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*slow)
		began := time.Now()
		var one int
		err := h.pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
		cancel()
		if err != nil {
			t.Fatalf("query beside the deliveries: %v", err)
		}
		worst = max(worst, time.Since(began))
		queries++
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("%d deliveries with %v downloads on a pool of %d: %d queries beside them, the slowest %v", deliveries, slow, deliveries, queries, worst)
	for i, a := range answers {
		checkAnswer(t, ids[i], a, processed)
	}
	if worst >= bound {
		t.Errorf("a query beside the downloads took %v, want under %v: a download held a connection", worst, bound)
	}
	if got := len(h.attachmentRows(t)); got != deliveries {
		t.Errorf("attachments stored = %d, want %d", got, deliveries)
	}
}

// TestRedeliveryDownloadsNothing: a mail already queued (its claim
// forgotten, or Redis down) is not downloaded again: it would write
// nothing.
func TestRedeliveryDownloadsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{noRedis: true})
	h.api.addEmail(t, emailID, nil, screenshot)
	body := receivedEvent(t, emailID, nil)
	for _, id := range []string{"msg_1", "msg_2"} {
		if w := h.deliver(t, id, body); w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", id, w.Code, w.Body)
		}
	}
	if got := h.api.downloadCount(screenshot.ID); got != 1 {
		t.Errorf("downloads = %d, want 1", got)
	}
	checkAttachments(t, h, []attachmentRow{stored(emailID, screenshot)})
}

// TestDownloadTargetsRefused: without RESEND_DOWNLOAD_ALLOW_PRIVATE a
// download URL on loopback (the fake's, over http) is not fetched; the
// attachment is recorded without content, and the mail is queued.
func TestDownloadTargetsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{publicDownloadsOnly: true})
	h.api.addEmail(t, emailID, nil, screenshot)

	checkAnswer(t, "loopback download", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), processed)
	if got := h.api.downloadCount(screenshot.ID); got != 0 {
		t.Errorf("downloads = %d, want 0", got)
	}
	checkAttachments(t, h, []attachmentRow{withoutContent(emailID, screenshot, "refused")})
}

// TestAPIRedirectKeepsKey: an API answer that redirects to another port of
// the same host (where net/http would forward Authorization) is not
// followed: the key never arrives there, and the delivery fails.
func TestAPIRedirectKeepsKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	var mu sync.Mutex
	var auth []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "not the API", http.StatusNotFound)
	}))
	t.Cleanup(other.Close)
	h.api.addEmail(t, emailID, nil)
	h.api.mu.Lock()
	h.api.redirect[emailID] = other.URL + "/emails/receiving/" + emailID
	h.api.mu.Unlock()

	checkAnswer(t, "redirected API", answerOf(t, h.deliver(t, "msg_1", receivedEvent(t, emailID, nil))), failed)
	mu.Lock()
	defer mu.Unlock()
	if len(auth) != 0 {
		t.Errorf("the other port received %d requests (Authorization %q), want none", len(auth), auth)
	}
	checkRows(t, h, nil)
}
