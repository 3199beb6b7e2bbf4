package kvdir

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvindex"
)

// checkMigration checks the migration under way against the served
// cells: it holds exactly the served keys whose home lies before its
// bound, each with the served holders, and every one of its keys is
// reachable from its home.
func checkMigration(t *testing.T, tab *keyTable, when string) {
	t.Helper()
	m := tab.mig
	n := len(tab.cells)
	copied := 0
	for i := range tab.cells {
		c := &tab.cells[i]
		if !c.used() || homeOfTag(c.tag(), n) >= m.bound {
			continue
		}
		copied++
		k := kvindex.Key{Hi: c.hi, Lo: uint64(c.tag()) << 32}
		j, ok := lookupIn(m.cells, k)
		if !ok {
			t.Fatalf("%s: key %x (home %d, bound %d) not in the new cells", when, k, homeOfTag(c.tag(), n), m.bound)
		}
		if got := m.cells[j].holders(); got != c.holders() {
			t.Fatalf("%s: key %x has holders %x in the new cells, %x served", when, k, got, c.holders())
		}
	}
	inUse := 0
	for i := range m.cells {
		if m.cells[i].used() {
			inUse++
		}
	}
	if inUse != copied || m.live != copied {
		t.Fatalf("%s: the new cells hold %d keys (%d counted), %d copied keys are served", when, inUse, m.live, copied)
	}
}

// settle finishes whatever growth is under way or due: it waits for an
// array being made, begins the migration if the growth is still due,
// and copies the rest of the cells at once. It then rebuilds the cells
// at rebuildLoad, as a growth leaves them, so that what a benchmark
// times does not depend on where in the cycle between growths its
// fills happened to stop (0.70 to 0.80 of the cells).
func (t *keyTable) settle() {
	t.makers.Wait()
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.makeRoom(0, 0)
	if t.mig != nil {
		t.migrate(math.MaxInt)
	}
	t.rebuildCells(0)
}

// load returns the share of the served cells in use.
func (t *keyTable) load() float64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return float64(t.live) / float64(len(t.cells))
}

// TestKeyTableGrowsAStepAtATime: a cell array of migrateFrom cells or
// more grows while writes go on, a step per write, so that no write holds
// the group's writers for a whole rebuild. Five slots add keys (inline
// holders and, past two, dense entries) until the table has grown
// several times, while changing and dropping others. After every write
// the served cells must answer for every key as the model does (no stale
// hit, R-REC-1), the new array must hold exactly the served keys the
// copy has passed with their holders, the served load must stay under
// hardLoad, and a migration must take several writes; at the end the
// table has swapped in every array it built.
func TestKeyTableGrowsAStepAtATime(t *testing.T) {
	tab := newKeyTable(modelBlock, 1024)
	tab.migrateFrom = minCells
	slots := make([]int, 5)
	for i := range slots {
		slots[i] = tab.allocSlot()
	}
	model := keyModel{}
	var keys []kvindex.Key
	rng := rand.New(rand.NewPCG(11, 12))
	var changes []keyChange
	migrations, writes, longest := 0, 0, 0
	for round := 0; len(model) < 40000; round++ {
		slot := slots[rng.IntN(len(slots))]
		changes = changes[:0]
		for range keyBatch {
			var k kvindex.Key
			if len(keys) == 0 || rng.IntN(3) > 0 {
				k = kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
				keys = append(keys, k)
			} else {
				k = keys[rng.IntN(len(keys))]
			}
			dev, host := rng.IntN(2) == 0, rng.IntN(2) == 0
			if rng.IntN(5) == 0 {
				dev, host = false, false
			}
			changes = append(changes, keyChange{k, dev, host})
			model.set(slot, changes[len(changes)-1])
		}
		before := tab.mig
		tab.apply(slot, changes)
		if hardLoadDen*tab.live > hardLoadNum*len(tab.cells) {
			t.Fatalf("round %d: %d live keys in %d cells, past the hard load", round, tab.live, len(tab.cells))
		}
		switch {
		case tab.mig != nil && tab.mig == before:
			writes++
		case tab.mig != nil:
			writes = 1
		}
		if before != nil && tab.mig != before {
			migrations++
			longest = max(longest, writes)
			writes = 0
		}
		if tab.mig != nil {
			checkMigration(t, tab, fmt.Sprintf("round %d", round))
		}
		if round%20 == 0 || tab.mig != before {
			checkKeyTable(t, tab, keys, slots, model, fmt.Sprintf("round %d", round))
		}
	}
	if migrations < 2 || longest < 4 {
		t.Fatalf("%d migrations, the longest over %d writes: the table did not grow a step at a time", migrations, longest)
	}
	t.Logf("%d keys held in %d cells after %d migrations, the longest over %d writes", tab.live, len(tab.cells), migrations, longest)
}

// TestKeyTableFillGrowsALargeTableOnlyForNewKeys: a fill into cells of
// migrateFrom or more makes no room ahead. Keys another slot holds
// already (a replica) take none, so at the load's edge such a fill
// leaves the cells as they were, with no migration begun and no array
// made. A fill of new keys grows the cells by its own writes, a step at
// a time, and the writes after it finish the migration. Every key keeps
// its holders throughout (R-DIR-2).
func TestKeyTableFillGrowsALargeTableOnlyForNewKeys(t *testing.T) {
	tab := newKeyTable(benchBlockSize, 1024)
	tab.migrateFrom = minCells
	a, b, c := tab.allocSlot(), tab.allocSlot(), tab.allocSlot()
	rng := rand.New(rand.NewPCG(13, 14))
	var keys []kvindex.Key
	var changes []keyChange
	newKeys := func(n int) []kvindex.Key {
		ks := make([]kvindex.Key, n)
		for i := range ks {
			ks[i] = kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
		}
		return ks
	}
	// Slot a's keys, until m more would pass the load of 65,536 cells
	// or more.
	const m = 1024
	for len(tab.cells) < 1<<16 || tab.mig != nil || tab.next != nil || !tab.needsRebuild(m) {
		ks := newKeys(keyBatch)
		keys = append(keys, ks...)
		changes = changes[:0]
		for _, k := range ks {
			changes = append(changes, keyChange{k, true, false})
		}
		tab.apply(a, changes)
	}
	cells := len(tab.cells)
	var made atomic.Int64
	tab.newCells = func(n int) []cell {
		made.Add(1)
		return make([]cell, n)
	}
	var buf []keyChange
	tab.fill(b, keyList(keys[:m]), &buf)
	tab.makers.Wait()
	if tab.mig != nil || tab.next != nil || len(tab.cells) != cells || made.Load() != 0 || tab.reserved != 0 {
		t.Fatalf("a fill of %d keys already held: migration %v, array %v, %d cells (want %d), %d arrays made, %d reserved", m, tab.mig != nil, tab.next != nil, len(tab.cells), cells, made.Load(), tab.reserved)
	}
	fresh := newKeys(4 * m)
	tab.fill(c, keyList(fresh), &buf)
	tab.makers.Wait()
	if made.Load() != 1 || (tab.mig == nil && tab.next == nil && len(tab.cells) == cells) {
		t.Fatalf("a fill of %d new keys past the load made %d arrays and left %d cells, want one growth", len(fresh), made.Load(), len(tab.cells))
	}
	for i := 0; tab.mig != nil || tab.next != nil; i++ {
		if i > len(tab.cells) {
			t.Fatal("the migration did not end")
		}
		// Slot a's last keys again: changes that hold what they found.
		tab.apply(a, changes)
	}
	if len(tab.cells) <= cells || tab.live != len(keys)+len(fresh) {
		t.Fatalf("after a fill of new keys: %d live keys in %d cells, want %d in more than %d", tab.live, len(tab.cells), len(keys)+len(fresh), cells)
	}
	for i, k := range keys {
		r, ok := tab.lookup(k)
		if !ok {
			t.Fatalf("key %x missing", k)
		}
		if dev, _ := tab.slotTiers(r, a); !dev {
			t.Fatalf("key %x lost slot %d", k, a)
		}
		if dev, _ := tab.slotTiers(r, b); dev != (i < m) {
			t.Fatalf("key %x has %v on slot %d, want %v", k, dev, b, i < m)
		}
	}
	for _, k := range fresh {
		r, ok := tab.lookup(k)
		if dev, _ := tab.slotTiers(r, c); !ok || !dev {
			t.Fatalf("new key %x missing", k)
		}
	}
}

// TestKeyTableWritesGoOnWhileAnArrayIsMade: a migration's array is made
// on a goroutine, so no writer waits for it, the one whose write asked
// for it included: their writes go on meanwhile, past the load that
// asked for it (they may not ask for another, nor rebuild the cells with
// the lock held). The first write to find the array ready begins the
// migration with it, which copies what they wrote, and every key of both
// slots ends up with its holders (R-DIR-2, and no stale hit, R-REC-1).
func TestKeyTableWritesGoOnWhileAnArrayIsMade(t *testing.T) {
	tab := newKeyTable(benchBlockSize, 1024)
	tab.migrateFrom = minCells
	a, b := tab.allocSlot(), tab.allocSlot()
	slots := []int{a, b}
	rng := rand.New(rand.NewPCG(15, 16))
	model := keyModel{}
	var keys []kvindex.Key
	batch := func(slot int, fresh bool) []keyChange {
		changes := make([]keyChange, keyBatch)
		for i := range changes {
			k := kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
			if !fresh {
				k = keys[rng.IntN(len(keys))]
			}
			if fresh {
				keys = append(keys, k)
			}
			dev := !fresh && rng.IntN(4) == 0
			changes[i] = keyChange{k, dev || fresh, !dev && !fresh && rng.IntN(2) == 0}
			model.set(slot, changes[i])
		}
		return changes
	}
	for len(tab.cells) < 1<<14 || tab.mig != nil || tab.next != nil || !tab.needsRebuild(keyBatch) {
		tab.apply(a, batch(a, true))
	}
	cells := len(tab.cells)
	started, release := make(chan int, 1), make(chan struct{})
	tab.newCells = func(n int) []cell {
		started <- n
		<-release
		return make([]cell, n)
	}
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		tab.apply(a, batch(a, true))
		// 576 new keys in all: past the load, well short of hardLoad.
		for i := range 16 {
			tab.apply(b, batch(b, i%2 == 0))
		}
	}()
	var n int
	select {
	case <-wrote:
		n = <-started
	case <-time.After(20 * time.Second):
		t.Fatal("the writers' writes did not go on while the array was made")
	}
	if tab.mig != nil || tab.next == nil || tab.live*maxLoadDen <= maxLoadNum*len(tab.cells) {
		t.Fatalf("while the array was made: migration %v, array asked for %v, %d keys in %d cells; want no migration, an array, past the load", tab.mig != nil, tab.next != nil, tab.live, len(tab.cells))
	}
	close(release)
	tab.makers.Wait()
	tab.apply(b, batch(b, false))
	if tab.mig == nil || len(tab.mig.cells) != n || tab.next != nil {
		t.Fatalf("no migration began with the array made (%d cells)", n)
	}
	tab.newCells = func(n int) []cell { return make([]cell, n) }
	for tab.mig != nil {
		checkMigration(t, tab, "during the migration")
		tab.apply(b, batch(b, false))
	}
	if len(tab.cells) != n || n <= cells {
		t.Fatalf("the cells went from %d to %d, want the %d made", cells, len(tab.cells), n)
	}
	checkKeyTable(t, tab, keys, slots, model, "after the migration")
}

// TestKeyTableArrayMadeForAGrowth: the array made for a growth is used
// only if the growth is still due: keys dropped meanwhile leave it
// unused, and not held. Writes go on while it is made, past the load,
// until the served cells come within a migration's worth of keys of
// hardLoad; a write past that waits for the array's allocation, not for
// its pages to be touched, and begins the migration with it, rather than
// rebuild the cells at once. Every key keeps its holders throughout
// (R-DIR-2, R-REC-1).
func TestKeyTableArrayMadeForAGrowth(t *testing.T) {
	for _, c := range []string{"keys dropped", "keys near hardLoad", "pages not yet touched"} {
		t.Run(c, func(t *testing.T) {
			tab := newKeyTable(benchBlockSize, 1024)
			tab.migrateFrom = minCells
			a := tab.allocSlot()
			rng := rand.New(rand.NewPCG(17, 18))
			model := keyModel{}
			var keys []kvindex.Key
			write := func(n int, fresh bool) {
				changes := make([]keyChange, 0, keyBatch)
				for range n {
					ch := keyChange{kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}, true, false}
					if fresh {
						keys = append(keys, ch.k)
					} else {
						ch = keyChange{keys[len(keys)-1], false, false}
						keys = keys[:len(keys)-1]
					}
					model.set(a, ch)
					if changes = append(changes, ch); len(changes) == keyBatch {
						tab.apply(a, changes)
						changes = changes[:0]
					}
				}
				if len(changes) > 0 {
					tab.apply(a, changes)
				}
			}
			for len(tab.cells) < 1<<14 || tab.mig != nil || tab.next != nil || !tab.needsRebuild(keyBatch) {
				write(keyBatch, true)
			}
			cells := len(tab.cells)
			release := make(chan struct{})
			var asked atomic.Int64
			tab.newCells = func(n int) []cell {
				if asked.Add(1) == 1 && c != "pages not yet touched" {
					<-release
				}
				return make([]cell, n)
			}
			if c == "pages not yet touched" {
				// The first array's pages are touched until the write
				// that needs it asks the toucher to stop.
				tab.touchPages = func(cells []cell, stop *atomic.Bool) {
					for asked.Load() == 1 && !stop.Load() {
						time.Sleep(time.Millisecond)
					}
				}
			}
			write(keyBatch, true)
			first := tab.next
			if first == nil {
				t.Fatal("a write past the load asked for no array")
			}
			switch c {
			case "keys dropped":
				write(4*keyBatch, false)
				close(release)
				tab.makers.Wait()
				write(1, true)
				if tab.next != nil || tab.mig != nil || len(tab.cells) != cells {
					t.Fatalf("after the keys were dropped: array held %v, migration %v, %d cells (want %d)", tab.next != nil, tab.mig != nil, len(tab.cells), cells)
				}
			case "keys near hardLoad", "pages not yet touched":
				for !tab.overfull(keyBatch + len(tab.cells)/migrateRatio) {
					write(keyBatch, true)
				}
				if tab.mig != nil || tab.next != first || len(tab.cells) != cells {
					t.Fatalf("short of hardLoad: migration %v, array %v (asked for %v), %d cells (was %d)", tab.mig != nil, tab.next, first, len(tab.cells), cells)
				}
				wrote := make(chan struct{})
				go func() {
					defer close(wrote)
					write(keyBatch, true)
				}()
				if c == "keys near hardLoad" {
					select {
					case <-wrote:
						t.Fatal("a write past hardLoad less a migration's keys did not wait for the array")
					case <-time.After(50 * time.Millisecond):
					}
				}
				close(release)
				<-wrote
				if tab.mig == nil || len(tab.mig.cells) != first.n || tab.next != nil {
					t.Fatalf("after the array was made: migration %v, next array %v", tab.mig != nil, tab.next)
				}
			}
			for i := 0; tab.mig != nil || tab.next != nil; i++ {
				if i > len(tab.cells) {
					t.Fatal("the growth did not end")
				}
				tab.makers.Wait()
				write(1, true)
			}
			if tab.overfull(0) {
				t.Fatalf("%d keys in %d cells: past hardLoad", tab.live, len(tab.cells))
			}
			checkKeyTable(t, tab, keys, []int{a}, model, c)
		})
	}
}

// TestDirectoryCloseWaitsForAGrowthsArray: the goroutine that makes a
// key table's grown array belongs to the Directory, whose Close returns
// only once it has finished, with the table's streams removed before.
func TestDirectoryCloseWaitsForAGrowthsArray(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	waitSynced(t, d, StreamKey{e.Name(), 0}, 0)
	d.mu.Lock()
	tab := d.tables[keyGroup{e.BlockSize(), 1024}]
	d.mu.Unlock()
	tab.wmu.Lock()
	tab.migrateFrom = minCells
	tab.wmu.Unlock()
	slot := tab.allocSlot()
	rng := rand.New(rand.NewPCG(19, 20))
	changes := make([]keyChange, keyBatch)
	for {
		tab.wmu.Lock()
		due := len(tab.cells) >= minCells && tab.mig == nil && tab.next == nil && tab.needsRebuild(keyBatch)
		tab.wmu.Unlock()
		if due {
			break
		}
		freshChanges(rng, changes)
		tab.apply(slot, changes)
	}
	release := make(chan struct{})
	tab.wmu.Lock()
	tab.newCells = func(n int) []cell {
		<-release
		return make([]cell, n)
	}
	tab.wmu.Unlock()
	freshChanges(rng, changes)
	tab.apply(slot, changes)
	tab.wmu.Lock()
	next := tab.next
	tab.wmu.Unlock()
	if next == nil {
		t.Fatal("a write past the load asked for no array")
	}
	if err := d.SetStreams(nil); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an array was being made", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if !next.ready() {
		t.Fatal("Close returned before the array's goroutine finished")
	}
}
