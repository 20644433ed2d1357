package intake

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func request(body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// A body is returned byte for byte whatever its size relative to the
// chunks, and reading it costs no budget once it is released.
func TestReadBodyIntact(t *testing.T) {
	t.Parallel()
	in := New(Config{Budget: 4 << 20})
	for _, n := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 64 << 10, 300 << 10, 1 << 20} {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i * 7 % 251)
		}
		b, err := in.Read(httptest.NewRecorder(), request(body), 1<<20)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(b.Bytes(), body) {
			t.Errorf("%d bytes: read %d bytes that differ from those sent", n, len(b.Bytes()))
		}
		b.Release()
		if got := in.InUse(); got != 0 {
			t.Errorf("%d bytes: budget in use after release = %d, want 0", n, got)
		}
	}
}

// Over the limit: an *http.MaxBytesError, and the budget given back.
func TestReadOverLimit(t *testing.T) {
	t.Parallel()
	in := New(Config{Budget: 4 << 20})
	_, err := in.Read(httptest.NewRecorder(), request(make([]byte, 3*ChunkSize)), 2*ChunkSize)
	var tooLarge *http.MaxBytesError
	if !errors.As(err, &tooLarge) {
		t.Fatalf("err = %v, want *http.MaxBytesError", err)
	}
	if got := in.InUse(); got != 0 {
		t.Errorf("budget in use after a refusal = %d, want 0", got)
	}
}

func TestReserve(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  Config
		want int64
	}{
		{"defaults: 1024 connections of a 32 MiB budget", Config{Budget: 32 << 20, MaxConnections: 1024}, 1024 * ChunkSize},
		{"capped at half a small budget", Config{Budget: 1 << 20, MaxConnections: 1024}, 512 << 10},
		{"connections unknown", Config{Budget: 1 << 20}, 512 << 10},
		{"no budget", Config{MaxConnections: 1024}, 0},
	} {
		if got := New(tt.cfg).Reserve(); got != tt.want {
			t.Errorf("%s: reserve = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// Every chunk held counts, the first ones too. Growing bodies stop short of
// the reserve; first chunks may use it, so a one-chunk body is read while
// the rest of the budget is held, until first chunks hold all of it.
func TestBudgetCountsEveryByte(t *testing.T) {
	t.Parallel()
	const budget = 8 * ChunkSize
	in := New(Config{Budget: budget, MaxConnections: 2}) // reserve: 2 chunks

	// A growing body takes the 6 chunks outside the reserve, then is
	// refused: 7 chunks would leave less than the reserve free.
	_, err := in.Read(httptest.NewRecorder(), request(make([]byte, 7*ChunkSize)), 1<<20)
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("a body growing into the reserve: err = %v, want ErrBudget", err)
	}
	if got := in.InUse(); got != 0 {
		t.Fatalf("budget in use after the refusal = %d, want 0", got)
	}
	held, err := in.Read(httptest.NewRecorder(), request(make([]byte, 6*ChunkSize)), 1<<20)
	if err != nil {
		t.Fatalf("a 6-chunk body within the budget outside the reserve: %v", err)
	}
	if got := in.InUse(); got != 6*ChunkSize {
		t.Errorf("in use = %d, want %d: every byte of the body counts", got, 6*ChunkSize)
	}

	// Small bodies fill the reserve, one chunk each, and are counted.
	var small []*Body
	for i := range 2 {
		b, err := in.Read(httptest.NewRecorder(), request(make([]byte, 3<<10)), 1<<20)
		if err != nil {
			t.Fatalf("small body %d while the rest is held: %v", i, err)
		}
		small = append(small, b)
	}
	if got := in.InUse(); got != budget {
		t.Errorf("in use = %d, want the whole budget %d", got, budget)
	}
	// With more bodies than the reserve was sized for, the budget still
	// holds: the next first chunk is refused.
	if _, err := in.Read(httptest.NewRecorder(), request(make([]byte, 10)), 1<<20); !errors.Is(err, ErrBudget) {
		t.Errorf("a first chunk over the whole budget: err = %v, want ErrBudget", err)
	}
	held.Release()
	for _, b := range small {
		b.Release()
	}
	if got := in.InUse(); got != 0 {
		t.Errorf("in use after every release = %d, want 0", got)
	}
}

// BenchmarkReadBody: reading a 3 KiB webhook body into a pooled chunk.
func BenchmarkReadBody(b *testing.B) { benchRead(b, 3115) }

// BenchmarkReadBodyMax: reading a 1 MiB body, the webhooks' cap. What it
// allocates per op is what a large body costs in memory.
func BenchmarkReadBodyMax(b *testing.B) { benchRead(b, 1<<20) }

func benchRead(b *testing.B, size int) {
	body := bytes.Repeat([]byte("x"), size)
	r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", nil)
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	w := httptest.NewRecorder()
	rd := bytes.NewReader(body)
	// No body deadline: a recorder has no connection to set it on.
	in := New(Config{Budget: 32 << 20, MaxConnections: 1024})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r.Body = io.NopCloser(rd)
		r.ContentLength = int64(len(body))
		got, err := in.Read(w, r, 1<<20)
		if err != nil || len(got.Bytes()) != len(body) {
			b.Fatalf("read %v", err)
		}
		got.Release()
	}
}
