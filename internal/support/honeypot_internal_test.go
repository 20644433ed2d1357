package support

import (
	"strconv"
	"testing"
)

// TestSpamIDsBounded: the keys remembered stay under the limit, the oldest
// forgotten first, and a key remembered keeps its first id.
func TestSpamIDsBounded(t *testing.T) {
	s := newSpamIDs(3)
	if got := s.put("", 7); got != 7 {
		t.Errorf("put without a key = %d, want 7", got)
	}
	if _, ok := s.get(""); ok {
		t.Error("the empty key was remembered")
	}
	for i := range 4 {
		s.put("k"+strconv.Itoa(i), int64(10+i))
	}
	if got := s.put("k3", 99); got != 13 {
		t.Errorf("put of a remembered key = %d, want its first id 13", got)
	}
	if _, ok := s.get("k0"); ok {
		t.Error("k0 still remembered past the limit of 3")
	}
	for i := 1; i < 4; i++ {
		if id, ok := s.get("k" + strconv.Itoa(i)); !ok || id != int64(10+i) {
			t.Errorf("get(k%d) = %d, %v; want %d", i, id, ok, 10+i)
		}
	}
	if len(s.ids) != 3 || len(s.order) != 3 {
		t.Errorf("%d ids and %d keys in order, want 3 each", len(s.ids), len(s.order))
	}
}
