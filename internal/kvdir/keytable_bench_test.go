package kvdir

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvcar/kvcar/internal/kvindex"
)

// BenchmarkKeyTableRebuild measures rebuilding the cells of a shared key
// table that holds keys= random keys, as a writer does when the table
// grows: every cell is placed again in a new array far larger than the
// processor's caches.
func BenchmarkKeyTableRebuild(b *testing.B) {
	for _, n := range []int{4 << 20} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			tab, _, _ := randomKeyTable(n, rand.New(rand.NewPCG(3, 4)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				tab.wmu.Lock()
				tab.rebuildCells(0)
				tab.wmu.Unlock()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/key")
			if tab.records() != n {
				b.Fatalf("table holds %d keys, want %d", tab.records(), n)
			}
		})
	}
}

// BenchmarkKeyTableChurn measures the shared key table's writes at steady
// state, alone: a table of keys= random keys, one slot, loses its 64
// oldest keys and gains 64 new ones per operation, as a stream evicting
// and storing a prefill of 64 blocks writes it. ns/change counts both
// kinds. At 16,384 keys the table sits in the processor's caches, so a
// change costs its compute; at 16.8 M keys, memory's part is added.
func BenchmarkKeyTableChurn(b *testing.B) {
	for _, n := range []int{1 << 14, 16 << 20} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(5, 6))
			tab, slot, keys := randomKeyTable(n, rng)
			changes := make([]keyChange, 0, keyBatch)
			b.ReportAllocs()
			b.ResetTimer()
			oldest := 0
			for range b.N {
				changes = changes[:0]
				for j := range keyBatch {
					changes = append(changes, keyChange{keys[(oldest+j)%n], false, false})
				}
				tab.apply(slot, changes)
				changes = changes[:0]
				for j := range keyBatch {
					k := kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
					keys[(oldest+j)%n] = k
					changes = append(changes, keyChange{k, true, false})
				}
				tab.apply(slot, changes)
				oldest = (oldest + keyBatch) % n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(2*keyBatch), "ns/change")
			if tab.records() != n {
				b.Fatalf("table holds %d keys, want %d", tab.records(), n)
			}
		})
	}
}

// randomKeyTable returns a table, its one slot, which holds n random keys
// on Device, written keyBatch at a time as streams write them, and the
// keys in the order written; n is a multiple of keyBatch.
func randomKeyTable(n int, rng *rand.Rand) (*keyTable, int, []kvindex.Key) {
	tab := newKeyTable(benchBlockSize, 1024)
	slot := tab.allocSlot()
	keys := make([]kvindex.Key, n)
	changes := make([]keyChange, 0, keyBatch)
	for i := range keys {
		keys[i] = kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
		changes = append(changes, keyChange{keys[i], true, false})
		if len(changes) == keyBatch {
			tab.apply(slot, changes)
			changes = changes[:0]
		}
	}
	return tab, slot, keys
}
