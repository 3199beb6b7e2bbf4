package fuzzsrc

import (
	"math/rand/v2"
	"testing"
)

// TestWordsThenGenerator: the bytes come first, eight to a word, the last
// padded; then words that the same bytes repeat.
func TestWordsThenGenerator(t *testing.T) {
	b := []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 3}
	s := New(b)
	if w := s.Uint64(); w != 1 {
		t.Fatalf("first word %#x, want 1", w)
	}
	if w := s.Uint64(); w != 0x0302 {
		t.Fatalf("second word %#x, want 0x302", w)
	}
	again := New(b)
	again.Uint64()
	again.Uint64()
	for i := range 4 {
		if x, y := s.Uint64(), again.Uint64(); x != y {
			t.Fatalf("word %d after the bytes: %#x, then %#x from the same bytes", i, x, y)
		}
	}
}

// TestBoundedDrawsEnd: words that a bounded draw rejects (a zero, for
// IntN(3) by rand's method) still give a draw once the bytes run out.
func TestBoundedDrawsEnd(t *testing.T) {
	r := rand.New(New(make([]byte, 64)))
	for range 100 {
		if v := r.IntN(3); v < 0 || v >= 3 {
			t.Fatalf("IntN(3) = %d", v)
		}
	}
}

// TestSteps: base, one more for every per bytes, at most most.
func TestSteps(t *testing.T) {
	for _, c := range []struct{ n, want int }{{0, 8}, {15, 8}, {16, 9}, {1 << 20, 32}} {
		if got := Steps(make([]byte, c.n), 8, 16, 32); got != c.want {
			t.Errorf("Steps of %d bytes = %d, want %d", c.n, got, c.want)
		}
	}
}
