package kvdir

import (
	"math/bits"
	"slices"
	"sync"

	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/prefetch"
)

// keyTable is the query accelerator of one key group (block size, seed):
// one record per content key held by any stream of the group, naming the
// streams' slots that hold it on each tier. A query walks the prompt's
// blocks once for all streams of the group; each stream's answer falls out
// of the bit operations, so the walk costs O(prompt blocks), not
// O(prompt blocks × streams).
//
// The table mirrors each stream's published kvindex.Index (the stream's
// own state still decides what it holds): the index's observer reports
// every key whose tiers change, and the stream goroutine writes those
// changes here (stream.flushKeys). Bits of a slot are meaningful to
// queries only while the slot is in published, which the stream sets when
// its view is published and clears first when the view is withdrawn
// (R-REC-1, R-REC-2).
//
// Readers hold mu shared for a whole walk, so a walk sees one state of the
// table; writers hold it exclusively for at most keyChunk changes at a
// time, so a query waits for little. Records and dense entries live in
// fixed pages that never move, so growing them copies nothing; the cell
// array, rebuilt from the records when its occupied cells pass
// maxLoadNum/maxLoadDen, and the dense entries, rebuilt when the bitsets
// widen, are rebuilt beside the served ones and swapped in (see wmu), so
// no query waits for a rebuild.
//
// Size: a stream's index holds at most max_blocks_per_stream keys on a
// tier, and a stream has bits on at most the keys of its published view
// (of two views while a calibration is swapped in), so the records are
// bounded by twice the sum of the group's per-stream limits (R-CFG-2).
type keyTable struct {
	blockSize int
	seed      uint64

	// wmu serialises writers for the whole of a write, so that a writer
	// may read the table without mu and build a grown copy of a part of
	// it while queries go on; mu is taken, after wmu, only to change
	// what queries read.
	wmu sync.Mutex
	mu  sync.RWMutex
	// A record is three words: the key (Hi, Lo) and its holders. Most
	// keys are held by one or two streams, so the holders word lists up
	// to two (slot, tiers) entries inline; a key held by more gets a
	// dense entry, Device and Host bitsets of words words each, in a
	// pool, and the holders word names it (denseFlag | index).
	words int
	recs  slab // records, recWords words each
	pool  slab // dense entries, 2*words words each
	// cells hold record+1 in the low recBits bits and the top bits of
	// the key's high half above, which reject most cells of other keys
	// without reading their records. A cell whose record bits are all
	// ones is a tombstone: the cell of a dropped key. Shifting the later
	// cells of its probe run back instead would mean reading their
	// records' keys for their homes, a cache miss each; a tombstone costs
	// nothing, the next new key whose probe passes it takes its place,
	// and those that end a run are emptied at once. Tombstones count
	// towards the load and go at the next rebuild. The array's size is
	// not a power of two: a key's home is a multiply-shift of its bits,
	// so the load after a rebuild is rebuildLoad whatever the number of
	// keys.
	cells    []uint32
	recBits  uint
	occupied int // cells not empty: live ones and tombstones
	live     int // live records
	// published has a slot's bit set while the slot's bits are its
	// stream's served view.
	published []uint64
	slotUsed  []bool
}

// Record layout and the inline holder entries: an entry is 24 bits,
// present bit, two tier bits, 16-bit slot.
const (
	recWords     = 3
	denseFlag    = 1 << 63
	entryBits    = 24
	entryMask    = 1<<entryBits - 1
	entryPresent = 1 << 23
	tierShift    = 16
	tierDev      = 1
	tierHost     = 2
	// maxSlots is what a 16-bit inline slot can name.
	maxSlots = 1 << 16
)

const (
	pageShift   = 12
	pageRecords = 1 << pageShift
	// keyChunk bounds the changes one exclusive hold of the table
	// applies, which bounds how long a query can wait for a writer.
	keyChunk = 16
	// keyBatch bounds the changes one apply takes: a stream queues that
	// many before writing them, so that the cache misses of a whole
	// prefill's keys are in flight at once (see warmChanges), then
	// applies them keyChunk at a time.
	keyBatch = 64
	// minCells is the smallest cell array allocated.
	minCells = 1024
	// The cells are rebuilt when occupied ones would pass 17/20 of them
	// (a miss then probes some 23 cells of four bytes, under two cache
	// lines, on average), at a size that puts the live keys at 7/10.
	maxLoadNum, maxLoadDen         = 17, 20
	rebuildLoadNum, rebuildLoadDen = 7, 10
)

// keyChange is one content key's tiers on one stream after a change.
type keyChange struct {
	k         kvindex.Key
	dev, host bool
}

func newKeyTable(blockSize int, seed uint64) *keyTable {
	t := &keyTable{blockSize: blockSize, seed: seed, words: 1, published: make([]uint64, 1), slotUsed: make([]bool, 64)}
	return t
}

// setWords changes the bitset width, copying every dense entry into pool
// pages of the new width; records and their inline entries do not move.
// The copy is built without mu, so queries go on while it is made: the
// caller holds wmu, so nothing changes the table meanwhile, and only the
// swap takes mu.
func (t *keyTable) setWords(w int) {
	pool := slab{pages: make([][]uint64, len(t.pool.pages)), used: t.pool.used, free: t.pool.free}
	for i := range pool.pages {
		pool.pages[i] = make([]uint64, pageRecords*2*w)
	}
	for d := uint32(0); d < t.pool.used; d++ {
		src := t.dense(d)
		dst := pool.at(d, 2*w)
		copy(dst[:w], src[:t.words])
		copy(dst[w:], src[t.words:])
	}
	pub := make([]uint64, w)
	copy(pub, t.published)
	su := make([]bool, 64*w)
	copy(su, t.slotUsed)
	t.mu.Lock()
	t.words, t.pool, t.published, t.slotUsed = w, pool, pub, su
	t.mu.Unlock()
}

// rec returns record r: key Hi, key Lo, holders.
func (t *keyTable) rec(r uint32) []uint64 { return t.recs.at(r, recWords) }

// dense returns dense entry d: Device words, then Host words.
func (t *keyTable) dense(d uint32) []uint64 { return t.pool.at(d, 2*t.words) }

// slab hands out fixed-size items from pages that never move, so an
// item's index stays valid while the slab grows; freed items are reused
// first. The item size is the caller's: the pool's changes with the
// bitset width, and setWords rebuilds its pages.
type slab struct {
	pages [][]uint64
	used  uint32   // items handed out, free ones included
	free  []uint32 // items to reuse
}

// alloc returns an item of size words, not cleared.
func (s *slab) alloc(size int) uint32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		return i
	}
	i := s.used
	s.used++
	if int(i>>pageShift) == len(s.pages) {
		s.pages = append(s.pages, make([]uint64, pageRecords*size))
	}
	return i
}

func (s *slab) release(i uint32) { s.free = append(s.free, i) }

// at returns item i of size words.
func (s *slab) at(i uint32, size int) []uint64 {
	p := s.pages[i>>pageShift]
	off := int(i&(pageRecords-1)) * size
	return p[off : off+size : off+size]
}

// bytes is the memory the slab holds, by capacity.
func (s *slab) bytes(size int) int64 {
	return int64(len(s.pages))*pageRecords*int64(size)*8 + int64(cap(s.free))*4
}

// allocSlot reserves a slot for a new stream of the group. The slot's
// bits are all clear and it is not published. It panics past maxSlots
// slots, far beyond any directory's max_streams.
func (t *keyTable) allocSlot() int {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	slot := slices.Index(t.slotUsed, false)
	if slot < 0 {
		slot = len(t.slotUsed)
		if slot >= maxSlots {
			panic("kvdir: key table slots exhausted")
		}
		t.setWords(t.words + 1)
	}
	t.mu.Lock()
	t.slotUsed[slot] = true
	t.mu.Unlock()
	return slot
}

// freeSlot returns a slot whose stream has withdrawn its view (every bit
// clear, unpublished) for reuse.
func (t *keyTable) freeSlot(slot int) {
	t.wmu.Lock()
	t.mu.Lock()
	t.slotUsed[slot] = false
	t.mu.Unlock()
	t.wmu.Unlock()
}

// slots returns the number of slots in use.
func (t *keyTable) slots() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, u := range t.slotUsed {
		if u {
			n++
		}
	}
	return n
}

// setPublished makes the slot's bits count for queries, or stop counting,
// at once.
func (t *keyTable) setPublished(slot int, on bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.mu.Lock()
	if on {
		t.published[slot>>6] |= 1 << (slot & 63)
	} else {
		t.published[slot>>6] &^= 1 << (slot & 63)
	}
	t.mu.Unlock()
}

// apply writes changes for slot, in order.
func (t *keyTable) apply(slot int, changes []keyChange) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	// Room for every change to add a key is made first, without mu (see
	// rebuildCells), so that set never rebuilds the cells with mu held.
	if t.needsRebuild(len(changes)) {
		t.rebuildCells(len(changes))
	}
	// The loads run without mu: only writers change the cells and
	// records, and wmu keeps them out.
	for base := 0; base < len(changes); base += keyBatch {
		t.warmChanges(changes[base:min(base+keyBatch, len(changes))])
	}
	for len(changes) > 0 {
		chunk := changes[:min(keyChunk, len(changes))]
		changes = changes[len(chunk):]
		t.mu.Lock()
		for i := range chunk {
			c := &chunk[i]
			t.set(slot, c.k, c.dev, c.host)
		}
		t.mu.Unlock()
	}
}

// set makes slot's bits of k say dev and host, adding the record when k
// gains its first holder and dropping it when it loses its last.
func (t *keyTable) set(slot int, k kvindex.Key, dev, host bool) {
	var tiers uint64
	if dev {
		tiers |= tierDev
	}
	if host {
		tiers |= tierHost
	}
	r, cell, ok := t.lookup(k)
	if !ok {
		if tiers == 0 {
			return
		}
		r = t.insert(k, cell)
	}
	rec := t.rec(r)
	h := rec[2]
	if h&denseFlag != 0 {
		d := t.dense(uint32(h))
		w, b := slot>>6, uint64(1)<<(slot&63)
		setBit(&d[w], b, dev)
		setBit(&d[t.words+w], b, host)
		if tiers != 0 {
			return
		}
		for _, x := range d {
			if x != 0 {
				return
			}
		}
		t.pool.release(uint32(h))
		rec[2] = 0
		t.remove(r, cell)
		return
	}
	e := [2]uint64{h & entryMask, h >> entryBits & entryMask}
	mine := entryPresent | tiers<<tierShift | uint64(slot)
	switch {
	case e[0] != 0 && int(e[0]&0xFFFF) == slot:
		e[0] = 0
	case e[1] != 0 && int(e[1]&0xFFFF) == slot:
		e[1] = 0
	}
	if tiers != 0 {
		switch {
		case e[0] == 0:
			e[0] = mine
		case e[1] == 0:
			e[1] = mine
		default:
			rec[2] = t.promote(e[0], e[1], mine)
			return
		}
	}
	if e[0] == 0 {
		e[0], e[1] = e[1], 0
	}
	rec[2] = e[0] | e[1]<<entryBits
	if rec[2] == 0 {
		t.remove(r, cell)
	}
}

// promote moves a key's holders into a new dense entry and returns the
// holders word naming it.
func (t *keyTable) promote(entries ...uint64) uint64 {
	d := t.pool.alloc(2 * t.words)
	bits := t.dense(d)
	clear(bits)
	for _, e := range entries {
		addEntry(bits, t.words, e)
	}
	return denseFlag | uint64(d)
}

// addEntry sets the bits of inline entry e in the bitsets of dst (Device
// words, then Host words, w each).
func addEntry(dst []uint64, w int, e uint64) {
	if e == 0 {
		return
	}
	slot := e & 0xFFFF
	b := uint64(1) << (slot & 63)
	if e>>tierShift&tierDev != 0 {
		dst[slot>>6] |= b
	}
	if e>>tierShift&tierHost != 0 {
		dst[w+int(slot>>6)] |= b
	}
}

func setBit(x *uint64, b uint64, on bool) {
	if on {
		*x |= b
	} else {
		*x &^= b
	}
}

// homeOf returns k's home cell in an array of n cells: the top half of
// k.Lo, uniform as XXH3 output is, scaled to [0, n).
func homeOf(k kvindex.Key, n int) int { return int((k.Lo >> 32) * uint64(n) >> 32) }

// fpOf returns the fingerprint of k for cells with recBits record bits:
// the top 32-recBits bits of k.Hi (none when recBits is 32).
func fpOf(k kvindex.Key, recBits uint) uint32 { return uint32(k.Hi >> 32 >> recBits) }

// recMask is the record bits of a cell; all of them set is a tombstone.
func (t *keyTable) recMask() uint32 { return 1<<t.recBits - 1 }

// find returns the record of k.
func (t *keyTable) find(k kvindex.Key) (uint32, bool) {
	n := len(t.cells)
	if n == 0 {
		return 0, false
	}
	fp, rb, rm := fpOf(k, t.recBits), t.recBits, t.recMask()
	for i := homeOf(k, n); ; {
		c := t.cells[i]
		if c == 0 {
			return 0, false
		}
		if c>>rb == fp && c&rm != rm {
			r := c&rm - 1
			if rec := t.rec(r); rec[0] == k.Hi && rec[1] == k.Lo {
				return r, true
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

// lookup is find for writers: it also returns the cell of k's record, or
// when k is not held the cell insert puts it in: the first tombstone of
// its probe run, or the empty cell that ends the run if it has none (-1
// when there are no cells). The probe is not repeated by insert.
func (t *keyTable) lookup(k kvindex.Key) (r uint32, cell int, ok bool) {
	n := len(t.cells)
	tomb := -1
	if n == 0 {
		return 0, tomb, false
	}
	cells := t.cells
	fp, rb, rm := fpOf(k, t.recBits), t.recBits, t.recMask()
	for i := homeOf(k, n); ; {
		c := cells[i]
		switch {
		case c == 0:
			if tomb < 0 {
				tomb = i
			}
			return 0, tomb, false
		case c&rm == rm:
			if tomb < 0 {
				tomb = i
			}
		case c>>rb == fp:
			r := c&rm - 1
			if rec := t.rec(r); rec[0] == k.Hi && rec[1] == k.Lo {
				return r, i, true
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

// needsRebuild reports whether adding extra keys could push the cells
// past maxLoad or name a record their record bits cannot (all ones is
// the tombstone).
func (t *keyTable) needsRebuild(extra int) bool {
	return maxLoadDen*(t.occupied+extra) > maxLoadNum*len(t.cells) ||
		uint64(t.recs.used)+uint64(extra) >= 1<<t.recBits-1
}

// insert adds a record for k, which the table does not hold, with every
// bit clear, in cell if that is not -1 (the tombstone or empty cell
// lookup found for k); set makes the record live before anything reads it.
func (t *keyTable) insert(k kvindex.Key, cell int) uint32 {
	if t.needsRebuild(1) {
		t.rebuildCells(1)
		cell = -1
	}
	r := t.recs.alloc(recWords)
	rec := t.rec(r)
	clear(rec)
	rec[0], rec[1] = k.Hi, k.Lo
	switch {
	case cell < 0:
		placeIn(t.cells, t.recBits, k, r)
		t.occupied++
	default:
		if t.cells[cell] == 0 { // a tombstone is already counted as occupied
			t.occupied++
		}
		t.cells[cell] = fpOf(k, t.recBits)<<t.recBits | (r + 1)
	}
	t.live++
	return r
}

// placeIn stores record r of key k in the first empty cell from k's home.
func placeIn(cells []uint32, recBits uint, k kvindex.Key, r uint32) {
	placeAt(cells, homeOf(k, len(cells)), fpOf(k, recBits)<<recBits|(r+1))
}

// placeAt stores cell c in the first empty cell from i on.
func placeAt(cells []uint32, i int, c uint32) {
	n := len(cells)
	for cells[i] != 0 {
		if i++; i == n {
			i = 0
		}
	}
	cells[i] = c
}

// rebuildCells builds a cell array for the live records with room for
// extra more keys, dropping tombstones. It reads the records in order,
// not the old cells, so it makes no random reads. The new array is
// filled without mu, so that queries keep reading the old one meanwhile
// (a rebuild of tens of millions of cells takes a second); the caller
// holds wmu, so the records do not change, and only the swap takes mu.
// A caller already holding mu (set, outside apply) must not reach here;
// apply makes room first.
func (t *keyTable) rebuildCells(extra int) {
	need := t.live + extra
	n := max(minCells, (need*rebuildLoadDen+rebuildLoadNum-1)/rebuildLoadNum)
	// Records can be named up to the larger of the slab's high-water mark
	// with extra more and the array's size, which bounds the live records
	// until the next rebuild; one more keeps clear of the tombstone.
	recBits := uint(bits.Len64(max(uint64(t.recs.used)+uint64(extra), uint64(n)) + 1))
	cells := make([]uint32, n)
	// The home cell of the record keyBatch places ahead is fetched before
	// each placement, so that keyBatch misses stay in flight instead of
	// each placement stalling on its own.
	var homes [keyBatch]int
	used := t.recs.used
	ahead := func(r uint32) {
		if r < used {
			rec := t.rec(r)
			homes[r%keyBatch] = homeOf(kvindex.Key{Hi: rec[0], Lo: rec[1]}, n)
			prefetch.Elem(cells, homes[r%keyBatch])
		}
	}
	for r := range uint32(keyBatch) {
		ahead(r)
	}
	for r := range used {
		home := homes[r%keyBatch]
		rec := t.rec(r)
		ahead(r + keyBatch)
		if rec[2] != 0 {
			placeAt(cells, home, fpOf(kvindex.Key{Hi: rec[0], Lo: rec[1]}, recBits)<<recBits|(r+1))
		}
	}
	t.mu.Lock()
	t.cells, t.recBits, t.occupied = cells, recBits, t.live
	t.mu.Unlock()
}

// remove frees record r, found through cell i, which becomes a
// tombstone; if the cell after it is empty, the probe run ends there, so
// it and the tombstones right before it are emptied instead.
func (t *keyTable) remove(r uint32, i int) {
	n, rm := len(t.cells), t.recMask()
	t.cells[i] = rm
	next := i + 1
	if next == n {
		next = 0
	}
	if t.cells[next] == 0 {
		for t.cells[i] == rm {
			t.cells[i] = 0
			t.occupied--
			if i == 0 {
				i = n
			}
			i--
		}
	}
	t.live--
	t.recs.release(r)
}

// storageBytes is the memory the table holds, by capacity.
func (t *keyTable) storageBytes() int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.recs.bytes(recWords) + t.pool.bytes(2*t.words) + int64(len(t.cells))*4
}

// records returns the number of keys the table holds.
func (t *keyTable) records() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.live
}

// walkResult is one query's answer over one key group, per slot. It
// lives in the query scratch and is reused.
type walkResult struct {
	hasher *kvindex.Hasher
	walked bool
	// start holds the slots published when the walk began; only they
	// have an answer.
	start, alive []uint64
	// inline holds the bitsets of a record whose holders are inline.
	inline []uint64
	// blocks[slot] is the length of the slot's matched prefix.
	blocks []int32
	// planes count host-only blocks per slot, bit-sliced: bit b of word
	// w of planes[p] is bit p of the count of slot 64w+b, so adding a
	// block's host-only mask costs a few word operations whatever the
	// number of slots it has set.
	planes  [][]uint64
	nplanes int
	// keys holds a batch of the prompt's block keys; sink keeps the
	// warming loads from being optimised away.
	keys [16]kvindex.Key
	sink uint64
}

// result returns slot's matched blocks and how many of them are
// host-only; ok is false when the slot was not published at the walk.
func (wr *walkResult) resultOf(slot int) (blocks, hostOnly int, ok bool) {
	w := slot >> 6
	if wr == nil || !wr.walked || w >= len(wr.start) || wr.start[w]&(1<<(slot&63)) == 0 {
		return 0, 0, false
	}
	for p := range wr.nplanes {
		hostOnly |= int(wr.planes[p][w]>>(slot&63)&1) << p
	}
	return int(wr.blocks[slot]), hostOnly, true
}

func (wr *walkResult) reset(words, blockSize int, seed uint64) {
	if wr.hasher == nil || wr.hasher.BlockSize() != blockSize || wr.hasher.Seed() != seed {
		wr.hasher = kvindex.NewHasher(blockSize, seed)
	}
	if len(wr.start) != words {
		wr.inline = make([]uint64, 2*words)
		wr.start = make([]uint64, words)
		wr.alive = make([]uint64, words)
		wr.blocks = make([]int32, 64*words)
		wr.planes = wr.planes[:0]
	}
	for p := range wr.nplanes {
		clear(wr.planes[p])
	}
	wr.nplanes = 0
}

// addHostOnly adds one to the host-only count of every slot in m, word w.
func (wr *walkResult) addHostOnly(w int, m uint64) {
	for p := 0; m != 0; p++ {
		if p == wr.nplanes {
			if p == len(wr.planes) {
				wr.planes = append(wr.planes, make([]uint64, len(wr.start)))
			}
			wr.nplanes++
		}
		carry := wr.planes[p][w] & m
		wr.planes[p][w] ^= m
		m = carry
	}
}

// walk answers a prefix query of tokens for every published slot. Blocks
// are hashed as the walk reaches them, so a prompt that misses early
// costs one hash, not one per block. The walk stops at the first block no
// published slot still matching holds.
func (t *keyTable) walk(tokens []uint32, wr *walkResult) {
	bs := t.blockSize
	t.mu.RLock()
	defer t.mu.RUnlock()
	W := t.words
	wr.reset(W, bs, t.seed)
	wr.walked = true
	any := uint64(0)
	for w, p := range t.published {
		wr.start[w], wr.alive[w] = p, p
		any |= p
	}
	n := len(tokens) / bs
	if any == 0 {
		return
	}
	var parent kvindex.Key
	i := 0
	// Blocks go in batches that double from one: a prompt that misses
	// at once costs one hash, and a long hit loads the cells, then the
	// records, of a whole batch before using any, so that their cache
	// misses overlap instead of each stalling the walk in turn.
	batch := 1
walk:
	for i < n {
		m := min(batch, n-i, len(wr.keys))
		batch *= 2
		keys := wr.keys[:m]
		for j := range keys {
			b := i + j
			parent = wr.hasher.BlockKey(parent, b > 0, tokens[b*bs:(b+1)*bs])
			keys[j] = parent
		}
		t.warm(keys, wr)
		for j := range keys {
			r, ok := t.find(keys[j])
			if !ok {
				break walk
			}
			var dev, host []uint64
			if h := t.rec(r)[2]; h&denseFlag != 0 {
				d := t.dense(uint32(h))
				dev, host = d[:W], d[W:2*W]
			} else {
				clear(wr.inline)
				addEntry(wr.inline, W, h&entryMask)
				addEntry(wr.inline, W, h>>entryBits&entryMask)
				dev, host = wr.inline[:W], wr.inline[W:2*W]
			}
			left := uint64(0)
			for w, a := range wr.alive {
				if a == 0 {
					continue
				}
				has := dev[w] | host[w]
				for stop := a &^ has; stop != 0; stop &= stop - 1 {
					wr.blocks[w<<6|bits.TrailingZeros64(stop)] = int32(i)
				}
				a &= has
				wr.alive[w] = a
				if ho := a &^ dev[w]; ho != 0 {
					wr.addHostOnly(w, ho)
				}
				left |= a
			}
			if left == 0 {
				return
			}
			i++
		}
	}
	for w, a := range wr.alive {
		for ; a != 0; a &= a - 1 {
			wr.blocks[w<<6|bits.TrailingZeros64(a)] = int32(i)
		}
	}
}

// warm loads the home cells of keys, then the records those cells name,
// each pass's loads independent of each other.
func (t *keyTable) warm(keys []kvindex.Key, wr *walkResult) {
	if len(keys) < 2 || len(t.cells) == 0 {
		return
	}
	var acc uint64
	var cells [16]uint64
	n, rm := len(t.cells), t.recMask()
	for j, k := range keys {
		cells[j] = uint64(t.cells[homeOf(k, n)] & rm)
	}
	for j, c := range cells[:len(keys)] {
		if c != 0 && c != uint64(rm) {
			cells[j] = t.rec(uint32(c) - 1)[2]
		}
	}
	for _, h := range cells[:len(keys)] {
		if h&denseFlag != 0 {
			acc += t.dense(uint32(h))[0]
		}
	}
	wr.sink += acc
}

// warmChanges loads what set will read for up to keyBatch changes, so
// that their cache misses overlap instead of stalling each change in
// turn: first every home cell is fetched, without waiting for any; then,
// as they arrive, each key's probe run is searched for the cell whose
// fingerprint matches (a held key's own, most of the time, however far
// from home it lies) and the record it names is fetched, again without
// waiting. A new key's run usually names none, so it costs its cell and
// nothing more.
func (t *keyTable) warmChanges(changes []keyChange) {
	n := len(t.cells)
	if n == 0 {
		return
	}
	changes = changes[:min(len(changes), keyBatch)]
	cells := t.cells
	var homes [keyBatch]int
	for j := range changes {
		homes[j] = homeOf(changes[j].k, n)
		prefetch.Elem(cells, homes[j])
	}
	rb, rm := t.recBits, t.recMask()
	for j := range changes {
		fp := fpOf(changes[j].k, rb)
		for i, left := homes[j], warmProbe; left > 0; left-- {
			c := cells[i]
			if c == 0 {
				break
			}
			if c>>rb == fp && c&rm != rm {
				prefetch.Elem(t.rec(c&rm-1), 0)
				break
			}
			if i++; i == n {
				i = 0
			}
		}
	}
}

// warmProbe bounds the cells warmChanges searches per key: a run longer
// than that is rare at the table's load, and set still finds its key.
const warmProbe = 32

// fill writes ix's keys for slot, which must not be published: nothing
// of it is visible until setPublished.
func (t *keyTable) fill(slot int, ix *kvindex.Index, buf *[]keyChange) {
	ix.ForEachKey(func(k kvindex.Key, d, h bool) { t.push(slot, buf, k, d, h) })
	t.flush(slot, buf)
}

// withdraw clears slot's bits of every key of ix, the view the slot
// mirrored; the slot must already be unpublished.
func (t *keyTable) withdraw(slot int, ix *kvindex.Index, buf *[]keyChange) {
	ix.ForEachKey(func(k kvindex.Key, _, _ bool) { t.push(slot, buf, k, false, false) })
	t.flush(slot, buf)
}

// replace turns the published slot's bits from view old into view next
// while queries keep reading them. It first lowers every key to what both
// views hold (old ∩ next), then raises every key to next: while the first
// pass runs every key's bits are a subset of old's, while the second runs
// a subset of next's, so whatever moment a query reads, the whole slot is
// a subset of one of the two views and its answer is at most what one of
// them answers (R-REC-2: no over-report during a calibration).
func (t *keyTable) replace(slot int, old, next *kvindex.Index, buf *[]keyChange) {
	old.ForEachKey(func(k kvindex.Key, od, oh bool) {
		if nd, nh := next.KeyTiers(k); nd != od || nh != oh {
			t.push(slot, buf, k, od && nd, oh && nh)
		}
	})
	t.flush(slot, buf)
	next.ForEachKey(func(k kvindex.Key, nd, nh bool) {
		if od, oh := old.KeyTiers(k); nd != od || nh != oh {
			t.push(slot, buf, k, nd, nh)
		}
	})
	t.flush(slot, buf)
}

func (t *keyTable) push(slot int, buf *[]keyChange, k kvindex.Key, d, h bool) {
	*buf = append(*buf, keyChange{k, d, h})
	if len(*buf) >= keyBatch {
		t.flush(slot, buf)
	}
}

func (t *keyTable) flush(slot int, buf *[]keyChange) {
	if len(*buf) > 0 {
		t.apply(slot, *buf)
		*buf = (*buf)[:0]
	}
}
