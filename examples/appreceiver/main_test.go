package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	svix "github.com/svix/svix-webhooks/go"
)

const testSecret = "whsec_YXBwLXJlY2VpdmVyLXRlc3Qtc2VjcmV0IQ=="

// post sends body signed with secret (svix's Sign, as the service signs)
// under webhook-id id, and returns the status.
func post(t *testing.T, base, secret, id, body string) int {
	t.Helper()
	wh, err := svix.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sig, err := wh.Sign(id, now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/hooks", strings.NewReader(body))
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", fmt.Sprint(now.Unix()))
	req.Header.Set("webhook-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// accessChanged is an access.changed body: cus_1, naming user 42, with
// access or not, at version v.
func accessChanged(v int64, hasAccess bool) (id, body string) {
	id = fmt.Sprintf("acc_cus_1_%d", v)
	body = fmt.Sprintf(`{"type":"access.changed","timestamp":"2026-03-01T12:00:00Z","data":{"stripe_customer_id":"cus_1",`+
		`"has_access":%t,"subscriptions":[{"stripe_subscription_id":"sub_1","client_reference_id":"42","status":"active",`+
		`"has_access":%t,"access_ends_at":null,"price_lookup_keys":["pro"],"features":["export"]}],"version":%d,`+
		`"at":"2026-03-01T12:00:00Z"}}`, hasAccess, hasAccess, v)
	return id, body
}

type verdict struct {
	Customers []string
	HasAccess bool `json:"has_access"`
	MayUse    bool `json:"may_use"`
}

func ask(t *testing.T, base, query string) verdict {
	t.Helper()
	resp, err := http.Get(base + "/access?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v verdict
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestReceiverKeepsTheHighestVersion: the answer with the highest version
// wins whatever the order of arrival; a repeated webhook-id and other
// kinds change nothing; forgeries are refused and change nothing.
func TestReceiverKeepsTheHighestVersion(t *testing.T) {
	t.Parallel()
	wh, _ := svix.NewWebhook(testSecret)
	srv := httptest.NewServer(newApp(wh))
	t.Cleanup(srv.Close)
	steps := []struct {
		name      string
		secret    string
		version   int64
		hasAccess bool
		body      string // instead of access.changed
		status    int
		want      verdict
	}{
		{"first answer", testSecret, 20, true, "", 200, verdict{[]string{"cus_1"}, true, true}},
		{"an older answer, late", testSecret, 10, false, "", 200, verdict{[]string{"cus_1"}, true, true}},
		{"a forgery", "whsec_bm90LXRoZS1hcHAtcmVjZWl2ZXItc2VjcmV0", 30, false, "", 400, verdict{[]string{"cus_1"}, true, true}},
		{"a diff kind", testSecret, 0, false, `{"type":"subscription.changed","data":{"id":7}}`, 200, verdict{[]string{"cus_1"}, true, true}},
		{"a newer answer", testSecret, 30, false, "", 200, verdict{[]string{"cus_1"}, false, false}},
	}
	for _, s := range steps {
		id, body := accessChanged(s.version, s.hasAccess)
		if s.body != "" {
			id, body = "chg_7", s.body
		}
		if got := post(t, srv.URL, s.secret, id, body); got != s.status {
			t.Errorf("%s: status %d, want %d", s.name, got, s.status)
		}
		if got := ask(t, srv.URL, "user=42&key=pro"); fmt.Sprint(got) != fmt.Sprint(s.want) {
			t.Errorf("%s: %+v, want %+v", s.name, got, s.want)
		}
	}
	if got := ask(t, srv.URL, "user=43&key=pro"); len(got.Customers) != 0 || got.HasAccess {
		t.Errorf("another user: %+v, want nothing", got)
	}
}
