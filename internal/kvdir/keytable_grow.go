package kvdir

import (
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/kvcar/kvcar/internal/kvindex"
)

// A large cell array grows a step at a time. Rebuilding one at once holds
// wmu, so every writer of the key group, for as long as it takes to read
// every cell and place it again: 0.46–0.64 s at 37.8 M keys on the
// development machine (BenchmarkKeyTableGrowth, "at-once"), about the
// size of 128 streams of 262,144 blocks, during which no stream's events
// reach the directory. Instead, a growth of an array of migrateFrom cells or more
// builds the new array beside the served one while writes go on: each
// write first copies migrateRatio served cells for each change it
// brings, then makes its changes to the served array and mirrors them
// into the new one wherever the copy has passed. The last step swaps the
// arrays as a rebuild does. Walks read only the served array meanwhile,
// as they do while a rebuild runs.
//
// The copy follows the served array from its first cell on. As homes
// follow the tags' order, a step that ends at an empty cell has copied
// every key whose home lies before that cell (a probe run never crosses
// an empty cell), so "copied" is a property of a key's home: bound is
// the first home not yet copied. Keys whose probe run wrapped past the
// array's end into its first cells are copied by the last step.
//
// A change brings at most one key, and a migration of an array of n
// cells ends after n/migrateRatio changes at most, so the served array
// takes at most n/migrateRatio keys more meanwhile. The new array is
// asked for when the served one reaches maxLoad and sized at rebuildLoad
// for the keys it held then; while it is made (see makeRoom) the writes
// go on past maxLoad, but stop short of hardLoad by n/migrateRatio keys.
// So the served array stays under hardLoad throughout, and the new one
// under 0.79. hardLoad is a guard: a write that would fill the served
// array past it finishes the migration at once.
const (
	migrateRatio             = 32
	migrateFrom              = 1 << 16
	hardLoadNum, hardLoadDen = 9, 10
)

// migration is a cell array being built beside the served one.
type migration struct {
	cells []cell
	live  int
	// bound is the first home, in the served array, whose keys have not
	// been copied yet, and the served cell the copy goes on from.
	bound int
}

// overfull reports whether adding extra keys could push the live keys
// past hardLoad of the served cells.
func (t *keyTable) overfull(extra int) bool {
	return hardLoadDen*(t.live+extra) > hardLoadNum*len(t.cells)
}

// nextArray is a cell array being made for the next migration, off
// every lock, by a goroutine of the table's makers: it allocates the
// array, then writes a cell of each page (see touchPages) until done or
// asked to stop.
type nextArray struct {
	n     int
	cells []cell        // set before done is closed
	stop  atomic.Bool   // asks the goroutine to stop touching pages
	done  chan struct{} // closed once the goroutine has let go of cells
}

// ready reports whether the array is made and its pages touched.
func (a *nextArray) ready() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// makeRoom makes room for extra more keys before a write brings them:
// it rebuilds the cells, begins or advances a migration (by
// migrateRatio cells for each of the write's changes), finishes one, or
// has the array for the next one made. It reports whether it rebuilt the
// cells or began a migration. The caller holds wmu and not mu.
//
// A migration's array is made on a goroutine, which also writes a cell
// of each of its pages (touchPages): the runtime clears memory it reuses,
// 0.4–0.8 GB for a table of 128 streams of 262,144 blocks, and memory
// fresh from the kernel faults in a page at a time when first written,
// which on the development machine's virtual machine took 1.9 s for
// 704 MiB. Meanwhile every writer writes on into the served cells, past
// their load; the first write to find the array ready begins the
// migration with it. Only a write that would bring the served cells
// within a migration's worth of keys (a 1/migrateRatio of the cells) of
// hardLoad waits, and only for its allocation.
func (t *keyTable) makeRoom(extra, changes int) (grew bool) {
	if t.mig != nil {
		if t.overfull(extra) {
			t.migrate(math.MaxInt)
		} else {
			t.migrate(migrateRatio * changes)
		}
		return false
	}
	next := t.next
	if !t.needsRebuild(extra) {
		// Keys were dropped since the array was asked for: it is not
		// held for a growth that may never come.
		if next != nil && next.ready() {
			t.setNext(nil)
		}
		return false
	}
	if next != nil {
		if !next.ready() {
			if !t.overfull(extra + len(t.cells)/migrateRatio) {
				return false
			}
			// The write waits for the array's allocation, not for its
			// pages: the goroutine touches none once asked to stop, and
			// the migration's steps fault in those not touched.
			next.stop.Store(true)
			<-next.done
		}
		t.setNext(nil)
		// The array was sized for the keys held when it was asked for,
		// at rebuildLoad, which the served cells' maxLoad had reached;
		// the writes while it was made stopped short of hardLoad less a
		// migration's keys. So with those keys it stays under
		// (9/10)/(8/7) of its cells, and under hardLoad.
		if !t.overfull(extra) && hardLoadDen*(t.live+extra+len(t.cells)/migrateRatio) <= hardLoadNum*next.n {
			t.setMigration(&migration{cells: next.cells})
			t.migrate(migrateRatio * changes)
			return true
		}
	}
	if len(t.cells) < t.migrateFrom || t.overfull(extra) {
		t.rebuildCells(extra)
		return true
	}
	next = &nextArray{n: ((t.live+extra)*rebuildLoadDen + rebuildLoadNum - 1) / rebuildLoadNum, done: make(chan struct{})}
	t.setNext(next)
	newCells, touch := t.newCells, t.touchPages
	t.makers.Add(1)
	go func() {
		defer t.makers.Done()
		next.cells = newCells(next.n)
		touch(next.cells, &next.stop)
		close(next.done)
	}()
	return false
}

// migrate copies at least budget served cells into the migration's
// array, going on to the end of the probe run it stops in, and swaps the
// arrays once every cell has been copied. The caller holds wmu and not
// mu.
func (t *keyTable) migrate(budget int) {
	m := t.mig
	old := t.cells
	n := len(old)
	p := m.bound
	for ; p < n && (budget > 0 || old[p].used()); p++ {
		budget--
		c := &old[p]
		if !c.used() {
			continue
		}
		// A cell whose home lies after it wrapped past the end: the
		// last step copies it.
		if h := homeOfTag(c.tag(), n); h >= m.bound && h <= p {
			m.place(*c)
		}
	}
	if p < n {
		m.bound = p
		return
	}
	for p = 0; p < n && old[p].used(); p++ {
		if h := homeOfTag(old[p].tag(), n); h >= m.bound && h > p {
			m.place(old[p])
		}
	}
	stamps := make([]uint64, (len(m.cells)+stripeCells-1)>>stripeShift)
	t.mu.Lock()
	t.cells, t.stamps = m.cells, stamps
	t.mig = nil
	t.publish()
	t.mu.Unlock()
}

// setMigration begins migration m, or with nil drops the one under way;
// storageBytes reads it under mu. The caller holds wmu and not mu.
func (t *keyTable) setMigration(m *migration) {
	t.mu.Lock()
	t.mig = m
	t.mu.Unlock()
}

// setNext sets the array being made for the next migration, or with nil
// drops it (a goroutine still making it stops touching its pages, and
// the array is garbage); storageBytes reads it under mu. The caller
// holds wmu and not mu.
func (t *keyTable) setNext(a *nextArray) {
	if a == nil && t.next != nil {
		t.next.stop.Store(true)
	}
	t.mu.Lock()
	t.next = a
	t.mu.Unlock()
}

// place puts c, a key not in the migration's array, in its probe run.
func (m *migration) place(c cell) {
	m.cells[emptyFrom(m.cells, homeOfTag(c.tag(), len(m.cells)))] = c
	m.live++
}

// mirror makes the migration's record of k what the served array's is,
// once the copy has passed k's home; set has changed k since the last
// step. The caller holds wmu.
func (t *keyTable) mirror(k kvindex.Key) {
	m := t.mig
	if homeOf(k, len(t.cells)) >= m.bound {
		return
	}
	i, held := lookupIn(t.cells, k)
	j, there := lookupIn(m.cells, k)
	switch {
	case held && there:
		m.cells[j].setHolders(t.cells[i].holders())
	case held:
		m.cells[j] = t.cells[i]
		m.live++
	case there:
		t.shiftOut(m.cells, j, false)
		m.live--
	}
}

// touchPages writes a cell of every page of cells, until stop is set, so
// that memory fresh from the kernel faults in there, off every lock, and
// not in the migration's steps, which hold wmu: there, a 2,048-cell
// step's eight pages put the timed writer's p99 at 588–778 µs at 37–42 M
// keys (BenchmarkKeyTableGrowth). Writing a zero is harmless: nothing
// reads the array until the goroutine is done with it.
func touchPages(cells []cell, stop *atomic.Bool) {
	const perPage = 4096 / int(unsafe.Sizeof(cell{}))
	for i := 0; i < len(cells); i += perPage {
		if stop.Load() {
			return
		}
		cells[i] = cell{}
	}
}
