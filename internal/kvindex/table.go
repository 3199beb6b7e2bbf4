package kvindex

import (
	"math/bits"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/prefetch"
)

// table is an open-addressing hash table of entry slots with linear
// probing. A cell holds slot+1 in its low sb bits (as many as MaxBlocks
// needs), the low 8 bits of the entry's home cell above them and, in the
// bits left, a fingerprint of the entry's hash. Zero marks an empty cell;
// the home bits and fingerprint together reject most probes that do not
// match without touching the entry slice, which at full size is far out
// of cache. Removals shift later cells back instead of leaving
// tombstones, so probe chains never degrade; the home bits give each later
// cell's home without reading its entry, as long as no cell lies 256 or
// more past its home (far counts those; while there are any, removals read
// the entries). The table does not store keys: the entry slice does,
// which keeps a cell at four bytes.
//
// The number of cells is not a power of two: a home is the top 32 bits of
// a uniform hash scaled to [0, len(cells)) by a multiply-shift, so tables
// grow by a quarter, not double, and the last size is the one MaxBlocks
// entries need, whatever MaxBlocks is (see tableSize). Past homeSpan cells
// the size is a multiple of homeSpan, so that a cell's displacement from
// its home, modulo homeSpan, is its position minus its home bits even when
// its probe run wrapped.
type table struct {
	cells []uint32
	sb    uint   // slot bits
	fpm   uint32 // fingerprint mask: as many bits as the home bits and the slot leave
	far   int    // cells homeSpan or more past their home
}

const (
	slotBits = 24
	slotMask = 1<<slotBits - 1
	// maxSlots bounds MaxBlocks so that slot+1 fits the low bits of a cell
	// with room for the home bits above.
	maxSlots = slotMask
	homeBits = 8
	homeSpan = 1 << homeBits
)

// minTableSize is the smallest table allocated; snapshot indexes of small
// engines stay small.
const minTableSize = 16

// Tables are rebuilt when an entry would put their load past
// maxLoadNum/maxLoadDen, at a size that puts it at growLoadNum/growLoadDen,
// or at fullLoadNum/fullLoadDen of MaxBlocks entries if that is smaller: a
// table never holds more cells than a full index needs.
const (
	maxLoadNum, maxLoadDen   = 5, 6
	growLoadNum, growLoadDen = 2, 3
	fullLoadNum, fullLoadDen = 2, 3
)

// tableSize returns the number of cells for n entries of an index of at
// most maxBlocks.
func tableSize(n, maxBlocks int) int {
	size := (n*growLoadDen + growLoadNum - 1) / growLoadNum
	full := (maxBlocks*fullLoadDen + fullLoadNum - 1) / fullLoadNum
	size = max(minTableSize, min(size, full))
	if size > homeSpan {
		size = (size + homeSpan - 1) &^ (homeSpan - 1)
	}
	return size
}

// newTable returns an empty table for an index of at most maxBlocks
// entries.
func newTable(maxBlocks int) table {
	sb := uint(bits.Len(uint(maxBlocks)))
	return table{sb: sb, fpm: 1<<(32-sb-homeBits) - 1}
}

// scale maps 32 uniform bits to [0, n).
func scale(h uint64, n int) uint64 { return (h >> 32) * uint64(n) >> 32 }

// next returns the cell after i, wrapping.
func (t *table) next(i uint64) uint64 {
	if i++; i == uint64(len(t.cells)) {
		return 0
	}
	return i
}

// tag is what a cell holds above the slot: the fingerprint (bits of fp's
// top half), then the home bits. Constant shifts and a mask keep it cheap.
func (t *table) tag(fp uint64, home uint64) uint32 {
	return (uint32(fp>>32)&t.fpm)<<homeBits | uint32(home&(homeSpan-1))
}

func (t *table) cell(tag uint32, s uint32) uint32 { return tag<<t.sb | (s + 1) }

// slot returns the slot of a non-empty cell.
func (t *table) slot(c uint32) uint32 { return c&(1<<t.sb-1) - 1 }

// cellHome returns the home of cell c at position j from its home bits;
// it is exact while far is zero.
func (t *table) cellHome(j uint64, c uint32) uint64 {
	hl := uint64(c>>t.sb) & (homeSpan - 1)
	n := uint64(len(t.cells))
	if n <= homeSpan {
		return hl
	}
	if d := (j - hl) & (homeSpan - 1); d <= j {
		return j - d
	} else {
		return j + n - d
	}
}

// needsGrow reports whether n entries would push the load past maxLoad.
func (t *table) needsGrow(n int) bool { return maxLoadDen*n > maxLoadNum*len(t.cells) }

func (t *table) reset() {
	clear(t.cells)
	t.far = 0
}

func (t *table) alloc(size int) {
	t.cells = make([]uint32, size)
	t.far = 0
}

// engineHash spreads engine hashes, which may be small consecutive
// integers, with a Fibonacci multiplier: the high bits pick the home cell,
// the low half gives the fingerprint. The high half of a 128-bit hash is
// folded in first; it is zero for integers.
func (t *table) engineHash(h kvevent.EngineHash) (home uint64, tag uint32) {
	m := (h.Lo ^ h.Hi*0xC2B2AE3D27D4EB4F) * 0x9E3779B97F4A7C15
	home = scale(m, len(t.cells))
	return home, t.tag(m<<32, home)
}

// keyHash uses the content key directly: XXH3 output is already uniform.
func (t *table) keyHash(k Key) (home uint64, tag uint32) {
	home = scale(k.Lo, len(t.cells))
	return home, t.tag(k.Hi, home)
}

// rebuildTable sizes the engine table for n entries and reinserts every
// entry.
func (ix *Index) rebuildTable(n int) {
	ix.byEngine.alloc(tableSize(n, ix.cfg.MaxBlocks))
	for s := range ix.entries {
		home, tag := ix.byEngine.engineHash(ix.entries[s].engine)
		ix.byEngine.place(home, ix.byEngine.cell(tag, uint32(s)))
	}
}

// place stores c in the first empty cell from its home i on.
func (t *table) place(i uint64, c uint32) {
	d := 0
	for t.cells[i] != 0 {
		i = t.next(i)
		d++
	}
	t.cells[i] = c
	if d >= homeSpan {
		t.far++
	}
}

func (ix *Index) findEngine(h kvevent.EngineHash) (uint32, bool) {
	t := &ix.byEngine
	if len(t.cells) == 0 {
		return 0, false
	}
	i, tag := t.engineHash(h)
	// Locals, not fields: the compiler does not hoist them out of the loop.
	cells, sb, n := t.cells, t.sb, uint64(len(t.cells))
	for {
		c := cells[i]
		if c == 0 {
			return 0, false
		}
		if c>>sb == tag {
			if s := c&(1<<sb-1) - 1; ix.entries[s].engine == h {
				return s, true
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

func (ix *Index) insertEngine(s uint32) {
	t := &ix.byEngine
	home, tag := t.engineHash(ix.entries[s].engine)
	t.place(home, t.cell(tag, s))
}

func (ix *Index) deleteEngine(s uint32) {
	home, _ := ix.byEngine.engineHash(ix.entries[s].engine)
	ix.shiftDelete(home, s)
}

// shiftDelete removes slot s, whose home is home, from the engine table
// by backward-shift deletion: later cells of the probe run move back into
// the hole unless that would put them before their home, so lookups never
// need tombstones. A later cell's home comes from its home bits, or, while
// some cell lies far from its home, from its entry.
func (ix *Index) shiftDelete(home uint64, s uint32) {
	t := &ix.byEngine
	i, d := home, 0
	for t.cells[i]&(1<<t.sb-1) != s+1 {
		i = t.next(i)
		d++
	}
	if d >= homeSpan {
		t.far--
	}
	n := uint64(len(t.cells))
	if t.far == 0 && n > homeSpan {
		// Every cell lies less than homeSpan past its home, so its home
		// bits give its displacement exactly: a cell may move back to
		// the hole unless its home lies after the hole, that is unless
		// it is displaced less than it lies past the hole.
		//
		// Whether a cell moves depends on the data alone, so a branch
		// on it is mispredicted about every other cell: the hole's
		// place and what it holds are chosen without one (conditional
		// moves), and the hole is written whether or not a cell moved.
		cells, sb := t.cells, t.sb
		held := cells[i]
		for j := i; ; {
			if j++; j == n {
				j = 0
			}
			c := cells[j]
			if c == 0 {
				break
			}
			gap := j - i
			if j < i {
				gap += n
			}
			next, v := i, held
			if (j-uint64(c>>sb))&(homeSpan-1) >= gap {
				next, v = j, c
			}
			cells[i] = v
			i, held = next, v
		}
		cells[i] = 0
		return
	}
	for j := i; ; {
		j = t.next(j)
		c := t.cells[j]
		if c == 0 {
			break
		}
		var h uint64
		if t.far == 0 {
			h = t.cellHome(j, c)
		} else {
			h, _ = t.engineHash(ix.entries[t.slot(c)].engine)
		}
		if !between(i, h, j) {
			if t.far > 0 && (j+n-h)%n >= homeSpan && (i+n-h)%n < homeSpan {
				t.far--
			}
			t.cells[i] = c
			i = j
		}
	}
	t.cells[i] = 0
}

// between reports whether home h lies cyclically in (i, j]: a cell at j
// whose home is there must stay, since moving it to i would put it before
// its home.
func between(i, h, j uint64) bool {
	if i <= j {
		return i < h && h <= j
	}
	return i < h || h <= j
}

// The warm functions start loading what the lookups and changes that
// follow will read, without waiting for any of it, so that the cache
// misses of a whole batch of blocks are in flight at once and overlap
// the work done meanwhile (hashing a chunk's tokens, decoding).

// warmEngine fetches the home cells of hashes in the engine table.
func (ix *Index) warmEngine(hashes []kvevent.EngineHash) {
	t := &ix.byEngine
	if len(t.cells) == 0 {
		return
	}
	for _, h := range hashes {
		i, _ := t.engineHash(h)
		prefetch.Elem(t.cells, int(i))
	}
}

// warmEntries fetches what findEngine reads for hashes the index is
// expected to hold (removals, tokenless replicas): every home cell first,
// then, as they arrive, the entry and meta byte of the cell whose tag
// matches in each probe run.
func (ix *Index) warmEntries(hashes []kvevent.EngineHash) {
	t := &ix.byEngine
	if len(t.cells) == 0 {
		return
	}
	var homes, tags [warmBatch]uint64
	cells := t.cells
	sb, n := t.sb, uint64(len(cells))
	for base := 0; base < len(hashes); base += warmBatch {
		batch := hashes[base:min(base+warmBatch, len(hashes))]
		for j, h := range batch {
			home, tag := t.engineHash(h)
			homes[j], tags[j] = home, uint64(tag)
			prefetch.Elem(cells, int(home))
		}
		for j := range batch {
			for i, left := homes[j], warmProbe; left > 0; left-- {
				c := cells[i]
				if c == 0 {
					break
				}
				if uint64(c>>sb) == tags[j] {
					if s := c&(1<<sb-1) - 1; int(s) < len(ix.entries) {
						prefetch.Elem(ix.entries, int(s))
						prefetch.Elem(ix.meta, int(s))
					}
					break
				}
				if i++; i == n {
					i = 0
				}
			}
		}
	}
}

// warmBatch is how many lookups warmEntries has in flight at once.
const warmBatch = 64

// warmProbe bounds the cells warmEntries searches per hash; a longer run
// is rare at the tables' load, and the lookup still finds its entry.
const warmProbe = 32

// warmGhosts fetches the table cells that evicting the next n ghosts will
// change, when the index is full and new entries take ghosts' slots: the
// home cells of their engine hashes.
func (ix *Index) warmGhosts(n int) {
	if len(ix.entries) < ix.cfg.MaxBlocks || len(ix.byEngine.cells) == 0 {
		return
	}
	q := &ix.ghosts
	for j, i := 0, q.head; j < min(n, q.n); j++ {
		he, _ := ix.byEngine.engineHash(ix.entries[q.buf[i]].engine)
		prefetch.Elem(ix.byEngine.cells, int(he))
		if i++; i == len(q.buf) {
			i = 0
		}
	}
}
