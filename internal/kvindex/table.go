package kvindex

import "github.com/kvcar/kvcar/internal/kvevent"

// table is an open-addressing hash table of entry slots with linear
// probing. A cell holds an 8-bit fingerprint of the entry's hash above
// slot+1 in the low 24 bits, so zero marks an empty cell and most probes
// that do not match are rejected without touching the entry slice, which
// at full size is far out of cache. Removals shift later cells back instead
// of leaving tombstones, so probe chains never degrade. The table does not
// store keys: the entry slice does, which keeps a cell at four bytes.
//
// The number of cells is not a power of two: a home is the top 32 bits of
// a uniform hash scaled to [0, len(cells)) by a multiply-shift, so tables
// grow by a quarter, not double, and the last size is the one MaxBlocks
// entries need, whatever MaxBlocks is (see tableSize).
type table struct {
	cells []uint32
}

const (
	slotBits = 24
	slotMask = 1<<slotBits - 1
	// maxSlots bounds MaxBlocks so that slot+1 fits the low bits of a cell.
	maxSlots = slotMask
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
	fullLoadNum, fullLoadDen = 4, 5
)

// tableSize returns the number of cells for n entries of an index of at
// most maxBlocks.
func tableSize(n, maxBlocks int) int {
	size := (n*growLoadDen + growLoadNum - 1) / growLoadNum
	full := (maxBlocks*fullLoadDen + fullLoadNum - 1) / fullLoadNum
	return max(minTableSize, min(size, full))
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

func cell(fp uint32, s uint32) uint32 { return fp<<slotBits | (s + 1) }

// cellSlot returns the slot of a non-empty cell.
func cellSlot(c uint32) uint32 { return c&slotMask - 1 }

// needsGrow reports whether n entries would push the load past maxLoad.
func (t *table) needsGrow(n int) bool { return maxLoadDen*n > maxLoadNum*len(t.cells) }

func (t *table) reset() { clear(t.cells) }

func (t *table) alloc(size int) { t.cells = make([]uint32, size) }

// engineHash spreads engine hashes, which may be small consecutive
// integers, with a Fibonacci multiplier: the high bits pick the home cell,
// middle bits (folded with the top half) give the fingerprint. The high
// half of a 128-bit hash is folded in first; it is zero for integers.
func (t *table) engineHash(h kvevent.EngineHash) (home uint64, fp uint32) {
	m := (h.Lo ^ h.Hi*0xC2B2AE3D27D4EB4F) * 0x9E3779B97F4A7C15
	return scale(m, len(t.cells)), uint32(uint8(m>>8 ^ m>>24))
}

// keyHash uses the content key directly: XXH3 output is already uniform.
func (t *table) keyHash(k Key) (home uint64, fp uint32) {
	return scale(k.Lo, len(t.cells)), uint32(k.Hi >> 56)
}

// rebuildTables sizes both tables for n entries and reinserts every entry.
func (ix *Index) rebuildTables(n int) {
	size := tableSize(n, ix.cfg.MaxBlocks)
	ix.byEngine.alloc(size)
	ix.byKey.alloc(size)
	for s := range ix.entries {
		e := &ix.entries[s]
		home, fp := ix.byEngine.engineHash(e.engine)
		ix.byEngine.place(home, cell(fp, uint32(s)))
		home, fp = ix.byKey.keyHash(e.key)
		ix.byKey.place(home, cell(fp, uint32(s)))
	}
}

// place stores c in the first empty cell from i on.
func (t *table) place(i uint64, c uint32) {
	for t.cells[i] != 0 {
		i = t.next(i)
	}
	t.cells[i] = c
}

func (ix *Index) findEngine(h kvevent.EngineHash) (uint32, bool) {
	t := &ix.byEngine
	if len(t.cells) == 0 {
		return 0, false
	}
	i, fp := t.engineHash(h)
	for ; ; i = t.next(i) {
		c := t.cells[i]
		if c == 0 {
			return 0, false
		}
		if c>>slotBits == fp && ix.entries[cellSlot(c)].engine == h {
			return cellSlot(c), true
		}
	}
}

// keyTiers returns the union of the tiers of all entries holding k, or
// just Device as soon as one of them is on Device.
func (ix *Index) keyTiers(k Key) uint8 { return ix.lookupTiers(k, true) }

// keyTiersAll returns the union of the tiers of all entries holding k.
func (ix *Index) keyTiersAll(k Key) uint8 { return ix.lookupTiers(k, false) }

func (ix *Index) lookupTiers(k Key, deviceEnough bool) uint8 {
	t := &ix.byKey
	if len(t.cells) == 0 {
		return 0
	}
	var tiers uint8
	i, fp := t.keyHash(k)
	for ; ; i = t.next(i) {
		c := t.cells[i]
		if c == 0 {
			return tiers
		}
		if c>>slotBits != fp {
			continue
		}
		if s := cellSlot(c); ix.entries[s].key == k {
			m := ix.meta[s]
			tiers |= m & (tierDevice | tierHost)
			if m&flagDup == 0 || (deviceEnough && tiers&tierDevice != 0) {
				return tiers
			}
		}
	}
}

func (ix *Index) insertEngine(s uint32) {
	t := &ix.byEngine
	home, fp := t.engineHash(ix.entries[s].engine)
	t.place(home, cell(fp, s))
}

// insertKey adds slot s to the key table, flagging every entry that shares
// its key. All of them lie between the key's home and the first empty
// cell, which is where s lands.
func (ix *Index) insertKey(s uint32) {
	t := &ix.byKey
	e := &ix.entries[s]
	i, fp := t.keyHash(e.key)
	for ; t.cells[i] != 0; i = t.next(i) {
		c := t.cells[i]
		if c>>slotBits != fp {
			continue
		}
		if o := cellSlot(c); ix.entries[o].key == e.key {
			ix.meta[o] |= flagDup
			ix.meta[s] |= flagDup
		}
	}
	t.cells[i] = cell(fp, s)
}

func (ix *Index) deleteEngine(s uint32) {
	t := &ix.byEngine
	home, _ := t.engineHash(ix.entries[s].engine)
	ix.shiftDelete(t, t.locate(home, s), false)
}

func (ix *Index) deleteKey(s uint32) {
	t := &ix.byKey
	home, _ := t.keyHash(ix.entries[s].key)
	ix.shiftDelete(t, t.locate(home, s), true)
}

// shiftDelete empties cell i of t (byKey says which table it is) by
// backward-shift deletion: later cells of the probe run move back into
// the hole unless that would put them before their home, so lookups never
// need tombstones. A flag rather than a hash callback keeps the home
// computation inlined on this path.
func (ix *Index) shiftDelete(t *table, i uint64, byKey bool) {
	for j := i; ; {
		j = t.next(j)
		c := t.cells[j]
		if c == 0 {
			break
		}
		e := &ix.entries[cellSlot(c)]
		var home uint64
		if byKey {
			home, _ = t.keyHash(e.key)
		} else {
			home, _ = t.engineHash(e.engine)
		}
		if !between(i, home, j) {
			t.cells[i] = c
			i = j
		}
	}
	t.cells[i] = 0
}

// locate returns the cell holding slot s, probing from its home.
func (t *table) locate(home uint64, s uint32) uint64 {
	i := home
	for t.cells[i]&slotMask != s+1 {
		i = t.next(i)
	}
	return i
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

// warmEngine loads the home cells of hashes so that the lookups that follow
// find them in cache.
func (ix *Index) warmEngine(hashes []kvevent.EngineHash) {
	t := &ix.byEngine
	if len(t.cells) == 0 {
		return
	}
	var acc uint32
	for _, h := range hashes {
		i, _ := t.engineHash(h)
		acc += t.cells[i]
	}
	ix.warmSink += acc
}

// warmKeys loads the home cells of keys; see warmEngine.
func (ix *Index) warmKeys(keys []Key) {
	t := &ix.byKey
	if len(t.cells) == 0 {
		return
	}
	var acc uint32
	for _, k := range keys {
		i, _ := t.keyHash(k)
		acc += t.cells[i]
	}
	ix.warmSink += acc
}
