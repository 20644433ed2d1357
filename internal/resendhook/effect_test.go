package resendhook_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The flow hears what the queue did: a mail queued for the first time is
// applied; the same mail under another svix-id finds it queued, unchanged.
func TestEffectOfAMail(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	h := newHarness(t, options{logs: &logs})
	h.api.addEmail(t, emailID, nil)
	body := receivedEvent(t, emailID, nil)
	for _, id := range []string{"msg_1", "msg_2"} {
		checkAnswer(t, id, answerOf(t, h.deliver(t, id, body)), processed)
	}
	got := map[string]string{}
	for line := range strings.Lines(logs.String()) {
		var l struct {
			Msg     string `json:"msg"`
			EventID string `json:"event_id"`
			Effect  string `json:"effect"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "webhook delivery" {
			got[l.EventID] = l.Effect
		}
	}
	want := map[string]string{"msg_1": "applied", "msg_2": "unchanged"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("effects logged (-want +got):\n%s", d)
	}
}

// syncBuffer is a log sink the handler may write while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
