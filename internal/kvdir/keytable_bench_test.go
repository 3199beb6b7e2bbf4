package kvdir

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvcar/kvcar/internal/kvindex"
)

// BenchmarkKeyTableRebuild measures rebuilding the cells of a shared key
// table that holds keys= random keys, as a writer does when tombstones
// fill the cells: every record is placed again in a new array far larger
// than the processor's caches.
func BenchmarkKeyTableRebuild(b *testing.B) {
	for _, n := range []int{4 << 20} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			tab := newKeyTable(benchBlockSize, 1024)
			slot := tab.allocSlot()
			rng := rand.New(rand.NewPCG(3, 4))
			changes := make([]keyChange, 0, keyBatch)
			for range n / keyBatch {
				changes = changes[:0]
				for range keyBatch {
					changes = append(changes, keyChange{kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}, true, false})
				}
				tab.apply(slot, changes)
			}
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
