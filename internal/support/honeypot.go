package support

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
)

// spam answers a valid post whose honeypot is filled exactly as a success,
// so the bot learns nothing, and stores nothing.
func (f *Form) spam(w http.ResponseWriter, r *http.Request, html bool, key string) {
	id, err := f.fakeID(r.Context(), key)
	if err != nil {
		f.failed(w, r, html, err)
		return
	}
	f.submissions.WithLabelValues(outcomeSpam).Inc()
	f.refusals.Log(r.Context(), slog.LevelInfo, "support form spam", "support form: honeypot filled, nothing stored")
	f.respond(w, r, html, id)
}

// fakeID is the id a honeypot post is answered with: the next value of the
// queue's own id sequence, the id a real post would have been given at that
// moment. So the ids a bot sees behave as real ones do whatever it mixes:
// they only climb, a real post after a caught one gets a higher id, and the
// caught one leaves the gap in real ids that a refused or repeated insert
// leaves (an insert that conflicts takes a sequence value too). An id drawn
// near the latest real one instead went backwards between two posts, or
// below a real id the bot had just been given, and told it the honeypot
// caught it. The price is one sequence value per caught post: nothing is
// stored.
//
// The same Idempotency-Key gets the same id again, as a real repeat does,
// from the ids this process answered (the spamKeysKept latest keys). The
// price: another replica, this one after a restart, or a key answered
// before spamKeysKept others answers the key with a new id, and a key
// reused for another message gets that id rather than a real post's 422.
func (f *Form) fakeID(ctx context.Context, key string) (int64, error) {
	if id, ok := f.spamIDs.get(key); ok {
		return id, nil
	}
	var id int64
	err := f.withDB(ctx, func(ctx context.Context) (err error) {
		id, err = f.queue.nextID(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	return f.spamIDs.put(key, id), nil
}

// spamKeysKept bounds the keys fakeID remembers: 1,024 keys of at most 255
// bytes, a few hundred KiB at worst.
const spamKeysKept = 1024

// spamIDs remembers the ids honeypot posts with an Idempotency-Key were
// answered with, the oldest forgotten first.
type spamIDs struct {
	mu    sync.Mutex
	ids   map[string]int64
	order []string // keys, oldest first
	limit int
}

func newSpamIDs(limit int) *spamIDs {
	return &spamIDs{ids: make(map[string]int64, limit), limit: limit}
}

// get returns the id key was answered with; none for the empty key.
func (s *spamIDs) get(key string) (int64, bool) {
	if key == "" {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[key]
	return id, ok
}

// put remembers id for key and returns the id to answer: an id another post
// with the key remembered meanwhile wins, as the first of two concurrent
// real posts does.
func (s *spamIDs) put(key string, id int64) int64 {
	if key == "" {
		return id
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first, ok := s.ids[key]; ok {
		return first
	}
	if len(s.order) >= s.limit {
		delete(s.ids, s.order[0])
		s.order = s.order[1:]
	}
	s.ids[key] = id
	s.order = append(s.order, key)
	return id
}
