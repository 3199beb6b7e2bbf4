package prefetch

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
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

// TestElemIsOnlyAHint prefetches elements of slices of several element
// sizes, within and past their ends and of an empty slice: none may
// fault, and the slices keep what was written.
func TestElemIsOnlyAHint(t *testing.T) {
	type wide struct{ a, b, c uint64 }
	small := []uint8{1, 2, 3}
	cells := []uint32{7, 8, 9, 10}
	structs := []wide{{1, 2, 3}, {4, 5, 6}}
	for _, i := range []int{0, 1, 3, 4, 1 << 20, -1} {
		Elem(small, i)
		Elem(cells, i)
		Elem(structs, i)
		Elem([]uint64(nil), i)
	}
	if small[2] != 3 || cells[3] != 10 || structs[1] != (wide{4, 5, 6}) {
		t.Fatalf("slices changed: %v %v %v", small, cells, structs)
	}
}

// BenchmarkRandomLoad is what one 4-byte load at a random place of an
// array of mb= MiB costs on this machine, the scale the prefetches work
// against: "dependent" waits for each load before the next (its address
// depends on the value), "independent" leaves the processor free to
// have many in flight. Both use the same precomputed random indexes.
func BenchmarkRandomLoad(b *testing.B) {
	for _, mb := range []int{8, 192, 1024} {
		cells := make([]uint32, mb<<20/4)
		for i := range cells {
			cells[i] = uint32(i)
		}
		rng := rand.New(rand.NewPCG(1, uint64(mb)))
		idx := make([]int, 1<<16)
		for i := range idx {
			idx[i] = rng.IntN(len(cells))
		}
		b.Run(fmt.Sprintf("mb=%d/dependent", mb), func(b *testing.B) {
			j := 0
			for i := range b.N {
				j = int(cells[(idx[i&(len(idx)-1)]+j)%len(cells)] & 1)
			}
			sink = uint32(j)
		})
		b.Run(fmt.Sprintf("mb=%d/independent", mb), func(b *testing.B) {
			var s uint32
			for i := range b.N {
				s += cells[idx[i&(len(idx)-1)]]
			}
			sink = s
		})
	}
}

// sink keeps the benchmarks' loads from being optimised away.
var sink uint32

// BenchmarkColdFetchesBesideWork is why the directory's warm passes fetch
// a batch's lines together, apart from the hashing: 64 lines of a 12 MiB
// array, cold (64 MiB written over before each step, untimed), fetched
// beside 64 pieces of dependent arithmetic (50 multiplications each).
// "work" is the arithmetic alone; "then-loads" loads the lines after it;
// "prefetch-then-work" prefetches all of them before it;
// "prefetch-during-work" prefetches each line before its piece, as a
// walk would that fetched each block's cell right after hashing it.
// p50 per step.
func BenchmarkColdFetchesBesideWork(b *testing.B) {
	const lines, steps = 64, 50
	arr := make([]uint32, 12<<20/4)
	for i := range arr {
		arr[i] = uint32(i)
	}
	evict := make([]byte, 64<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	idx := make([]int, lines)
	work := func(x uint64) uint64 {
		for range steps {
			x = x*6364136223846793005 + 1
		}
		return x
	}
	for _, mode := range []string{"work", "then-loads", "prefetch-then-work", "prefetch-during-work"} {
		b.Run(mode, func(b *testing.B) {
			var s uint64
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				b.StopTimer()
				for j := 0; j < len(evict); j += 64 {
					evict[j]++
				}
				for j := range idx {
					idx[j] = rng.IntN(len(arr))
				}
				b.StartTimer()
				t0 := time.Now()
				x := s
				if mode == "prefetch-then-work" {
					for _, i := range idx {
						Elem(arr, i)
					}
				}
				for _, i := range idx {
					if mode == "prefetch-during-work" {
						Elem(arr, i)
					}
					x = work(x)
				}
				if mode != "work" {
					for _, i := range idx {
						s += uint64(arr[i])
					}
				}
				s += x & 1
				lat = append(lat, time.Since(t0))
			}
			sink = uint32(s)
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
		})
	}
}
