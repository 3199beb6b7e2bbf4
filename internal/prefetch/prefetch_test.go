package prefetch

import (
	"testing"
	"unsafe"
)

// TestAddrIsOnlyAHint prefetches valid addresses and ones no program
// may read (nil, the top of the address space, past a slice's end): none
// may fault, and memory keeps what was written.
func TestAddrIsOnlyAHint(t *testing.T) {
	buf := make([]uint64, 1024)
	for i := range buf {
		buf[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	for i := range buf {
		Addr(base + uintptr(i)*8)
	}
	for _, p := range []uintptr{0, 1, ^uintptr(0), ^uintptr(0) - 4095, base + 1<<40} {
		Addr(p)
	}
	for i, v := range buf {
		if v != uint64(i)*0x9E3779B97F4A7C15 {
			t.Fatalf("word %d is %#x after prefetching", i, v)
		}
	}
}

// BenchmarkAddr is the cost of one call on a line already in cache.
func BenchmarkAddr(b *testing.B) {
	var x [64]byte
	p := uintptr(unsafe.Pointer(&x[0]))
	for range b.N {
		Addr(p)
	}
}
