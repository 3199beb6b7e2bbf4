package budget

import (
	"sync"
	"testing"
)

func TestTakeGive(t *testing.T) {
	b := New(10)
	if !b.Take(6) || !b.Take(4) {
		t.Fatal("10 bytes of a 10-byte budget refused")
	}
	if b.Take(1) {
		t.Fatal("an 11th byte was taken")
	}
	if b.Used() != 10 {
		t.Fatalf("used %d, want 10", b.Used())
	}
	b.Give(4)
	if b.Take(5) {
		t.Fatal("5 bytes taken with 4 free")
	}
	if b.Used() != 6 {
		t.Fatalf("a refusal left used at %d, want 6", b.Used())
	}
	if !b.Take(4) {
		t.Fatal("4 bytes refused with 4 free")
	}
}

func TestNilAdmitsEverything(t *testing.T) {
	var b *Bytes
	if !b.Take(1 << 62) {
		t.Fatal("a nil budget refused")
	}
	b.Give(1)
	if b.Used() != 0 || b.Max() != 0 {
		t.Fatal("a nil budget counts")
	}
}

// Concurrent takers never hold more than the budget together, and every
// byte given back can be taken again.
func TestConcurrentTakersStayWithin(t *testing.T) {
	b := New(1000)
	var wg sync.WaitGroup
	var over sync.Once
	for range 8 {
		wg.Go(func() {
			for range 10000 {
				if b.Take(7) {
					if u := b.Used(); u > 1000 {
						over.Do(func() { t.Errorf("used %d of 1000", u) })
					}
					b.Give(7)
				}
			}
		})
	}
	wg.Wait()
	if b.Used() != 0 {
		t.Fatalf("used %d after every taker gave back", b.Used())
	}
}

// AllocSize is never under what the allocator gives: append rounds a
// slice's capacity up to its size class.
func TestAllocSizeCoversTheSizeClass(t *testing.T) {
	for n := 1; n <= 1<<17; n += 1 + n/64 {
		if got := cap(append([]byte(nil), make([]byte, n)...)); int64(got) > AllocSize(int64(n)) {
			t.Fatalf("%d bytes take %d, AllocSize says %d", n, got, AllocSize(int64(n)))
		}
	}
}
