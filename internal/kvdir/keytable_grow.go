package kvdir

import (
	"math"

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
// cells ends after n/migrateRatio changes at most, so the served array,
// at most maxLoad full when the migration began, takes at most
// n/migrateRatio keys more meanwhile: with 32, its load stays under
// 0.84, and the new array, sized at the rebuild load for the keys held
// at the start, under 0.73. hardLoad is a guard: a write that would
// fill the served array past it finishes the migration at once.
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

// makeRoom makes room for extra more keys before a write brings them:
// it rebuilds the cells, begins or advances a migration (by
// migrateRatio cells for each of the write's changes), or finishes one.
// It reports whether it rebuilt the cells or began a migration. The
// caller holds wmu and not mu; makeRoom lets go of wmu while it makes a
// migration's array.
func (t *keyTable) makeRoom(extra, changes int) (grew bool) {
	if t.mig != nil {
		if t.overfull(extra) {
			t.migrate(math.MaxInt)
		} else {
			t.migrate(migrateRatio * changes)
		}
	}
	if t.mig != nil || !t.needsRebuild(extra) {
		return false
	}
	if t.allocating && !t.overfull(extra) {
		return false
	}
	if t.allocating || len(t.cells) < t.migrateFrom || t.overfull(extra) {
		t.rebuildCells(extra)
		return true
	}
	// The new array is made without wmu: the runtime clears the memory
	// it reuses, which took the allocating writer up to 175 ms for
	// arrays of 0.4–0.8 GB on the development machine, and the other
	// writers write on meanwhile. allocating keeps them from making one
	// too.
	n := ((t.live+extra)*rebuildLoadDen + rebuildLoadNum - 1) / rebuildLoadNum
	t.allocating = true
	t.wmu.Unlock()
	cells := t.newCells(n)
	t.wmu.Lock()
	t.allocating = false
	switch {
	case t.mig != nil || !t.needsRebuild(extra):
		return false
	case maxLoadDen*(t.live+extra) > maxLoadNum*n:
		t.rebuildCells(extra)
	default:
		t.setMigration(&migration{cells: cells})
		t.migrate(migrateRatio * changes)
	}
	return true
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
