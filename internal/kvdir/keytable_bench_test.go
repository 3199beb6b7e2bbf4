package kvdir

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvindex"
)

// BenchmarkKeyTableRebuild measures rebuilding the cells of a shared key
// table that holds keys= random keys at once, as a compaction does and as
// a growth of an array under migrateFrom cells does (larger ones grow a
// step per write, see BenchmarkKeyTableGrowth): every cell is placed
// again in a new array far larger than the processor's caches.
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

// BenchmarkKeyTableGrowth measures what the writers of a shared key
// table of about keys= random keys wait while it grows. Each operation
// applies 64 new keys for one slot while a second writer writes for
// another slot, as the streams of a key group write at once; a growth
// happens within the run. "at-once" rebuilds the cells within the write
// that needs them, as every table did before migrations; "in-steps" is
// what tables of migrateFrom cells or more do, a step per write, the new
// array made and its pages touched on a goroutine while the writers
// write on. It reports the timed writer's p50, p99 and longest write
// (max-ms), the other writer's longest (other-max-ms), how long
// allocating the new array took (make-ms, in steps), and how many timed
// writes the growth took from the first write past the load
// (growth-writes). The table is filled to its load untimed before each
// run, so keys= is the size the first run finds; keys is what the last
// run left.
func BenchmarkKeyTableGrowth(b *testing.B) {
	for _, n := range []int{4 << 20, 32 << 20} {
		for _, mode := range []string{"at-once", "in-steps"} {
			b.Run(fmt.Sprintf("keys=%d/mode=%s", n, mode), func(b *testing.B) {
				tab, slot, _ := randomKeyTable(n, rand.New(rand.NewPCG(7, 8)))
				if mode == "at-once" {
					tab.migrateFrom = 1 << 62
				}
				benchGrowth(b, tab, slot, tab.allocSlot())
			})
		}
	}
}

// cellCount returns the number of cells served.
func (t *keyTable) cellCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.cells)
}

// freshChanges fills changes with new keys for a Device holder.
func freshChanges(rng *rand.Rand, changes []keyChange) {
	for j := range changes {
		changes[j] = keyChange{kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}, true, false}
	}
}

func benchGrowth(b *testing.B, tab *keyTable, slot, other int) {
	rng := rand.New(rand.NewPCG(9, uint64(b.N)))
	changes := make([]keyChange, keyBatch)
	for tab.mig != nil || tab.next != nil || !tab.needsRebuild(2*len(changes)) {
		freshChanges(rng, changes)
		tab.apply(slot, changes)
	}
	cells := len(tab.cells)
	// make-ms is how long allocating the migration's array took.
	var making atomic.Int64
	tab.newCells = func(n int) []cell {
		t0 := time.Now()
		c := make([]cell, n)
		making.Store(int64(time.Since(t0)))
		return c
	}
	stop := make(chan struct{})
	otherMax := make(chan time.Duration)
	go func() {
		// The other writer is at steady state: every 200 µs or so a
		// write stores 64 new keys and drops the 64 it stored 64 writes
		// before, so that it holds 4,096 keys throughout, as a busy
		// group's other streams write (128 streams sending 5 prefills a
		// second make one every 1.6 ms).
		rng := rand.New(rand.NewPCG(10, uint64(b.N)))
		ring := make([][]keyChange, 64)
		var longest time.Duration
		for w := 0; ; w++ {
			select {
			case <-stop:
				otherMax <- longest
				return
			default:
			}
			r := &ring[w%len(ring)]
			changes := make([]keyChange, 0, 2*keyBatch)
			for _, c := range *r {
				changes = append(changes, keyChange{c.k, false, false})
			}
			*r = make([]keyChange, keyBatch)
			freshChanges(rng, *r)
			changes = append(changes, *r...)
			t0 := time.Now()
			tab.apply(other, changes[:min(len(changes), keyBatch)])
			tab.apply(other, changes[min(len(changes), keyBatch):])
			longest = max(longest, time.Since(t0))
			time.Sleep(200 * time.Microsecond)
		}
	}()
	lat := make([]time.Duration, 0, b.N)
	growth := 0
	b.ReportAllocs()
	b.ResetTimer()
	// A run goes on past b.N writes until the cells have grown, which
	// may take some 62,000 writes in steps when the new array's memory
	// comes fresh from the kernel (see makeRoom): ns/op then overstates
	// a write, and p50, p99 and max-ms are per write.
	for i := 0; i < b.N || (growth == i && i < maxGrowthWrites); i++ {
		b.StopTimer()
		freshChanges(rng, changes)
		b.StartTimer()
		t0 := time.Now()
		tab.apply(slot, changes)
		lat = append(lat, time.Since(t0))
		if tab.cellCount() == cells {
			growth++
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(len(lat)), "writes")
	close(stop)
	b.ReportMetric(float64((<-otherMax).Microseconds())/1e3, "other-max-ms")
	if d := time.Duration(making.Load()); d > 0 {
		b.ReportMetric(float64(d.Microseconds())/1e3, "make-ms")
	}
	reportPercentiles(b, lat)
	b.ReportMetric(float64(slices.Max(lat).Microseconds())/1e3, "max-ms")
	b.ReportMetric(float64(tab.records()), "keys")
	if tab.cellCount() == cells {
		b.Fatalf("the cells did not grow in %d writes (%d keys)", len(lat), tab.records())
	}
	b.ReportMetric(float64(growth+1), "growth-writes")
}

// maxGrowthWrites bounds a growth benchmark's run: a table whose cells
// have not grown after that many writes of 64 new keys is a failure.
const maxGrowthWrites = 1 << 20

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

// keyList is a view of keys held on Device, as fill reads an index's.
type keyList []kvindex.Key

func (l keyList) Resident() int { return len(l) }

func (l keyList) ForEachKey(fn func(k kvindex.Key, onDevice, onHost bool)) {
	for _, k := range l {
		fn(k, true, false)
	}
}

// BenchmarkKeyTableFill measures publishing a stream's view of 262,144
// keys (a snapshot after a restart, a gap or a calibration) into a shared
// key table of about keys= random keys that lacks room for that many
// more keys. "held" fills keys another slot holds already, as a replica
// of a cached prefix does, which take no room; "fresh" fills new keys.
// Each operation fills a new slot; withdrawing it and freeing the slot
// are not timed. B/op counts what was allocated while the fill ran: a
// growth's array, made on a goroutine the fill does not wait for, may be
// allocated after it. The table is filled to that edge untimed before
// each run, so the first operation of a run is the one that meets it.
func BenchmarkKeyTableFill(b *testing.B) {
	const view = 1 << 18
	for _, n := range []int{4 << 20, 32 << 20} {
		for _, kind := range []string{"held", "fresh"} {
			b.Run(fmt.Sprintf("keys=%d/kind=%s", n, kind), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(11, 12))
				tab, slot, keys := randomKeyTable(n, rng)
				changes := make([]keyChange, keyBatch)
				for tab.mig != nil || tab.next != nil || !tab.needsRebuild(view) {
					freshChanges(rng, changes)
					tab.apply(slot, changes)
				}
				fill := keyList(keys[:view])
				var buf []keyChange
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					if kind == "fresh" {
						fill = make(keyList, view)
						for i := range fill {
							fill[i] = kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
						}
					}
					s := tab.allocSlot()
					b.StartTimer()
					tab.fill(s, fill, &buf)
					b.StopTimer()
					tab.withdraw(s, fill, &buf)
					tab.freeSlot(s)
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/fill")
				b.ReportMetric(float64(tab.cellCount()), "cells")
			})
		}
	}
}
