package kvdir

import (
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvcar/kvcar/internal/hugepage"
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
// A walk sees one state of the table: it reads without mu and keeps its
// answer only if nothing it read changed meanwhile (see tableView), or,
// after walkTries tries that did not, holds mu shared. Writers hold mu
// exclusively for at most keyChunk changes at a time, so a walk under mu
// waits for little. The cell array, rebuilt larger when
// its live keys would pass maxLoadNum/maxLoadDen, the dense entries,
// rebuilt when the bitsets widen, and both, compacted when less than a
// fifth of either is in use (streams left, engines dropped most of their
// blocks), are rebuilt beside the served ones and swapped in (see wmu),
// so no query waits for a rebuild and memory follows what the streams
// hold; a large cell array grows a step per write instead (see
// migration), so no writer waits for a whole rebuild either; dense
// entries live in fixed pages that never move, so adding one copies
// nothing.
//
// Size: a stream's index holds at most max_blocks_per_stream keys on a
// tier, and a stream has bits on at most the keys of its published view
// (of two views while a calibration is swapped in), so the records are
// bounded by twice the sum of the group's per-stream limits (R-CFG-2).
//
// A cell identifies its key by 96 of the key's 128 bits (k.Hi and the top
// half of k.Lo). Two keys of a group agreeing on them is as likely as 2
// in 2^96 per pair, some 10^-14 for the 67 million keys of 128 streams
// at the largest limit: far below the hardware's own error rates, and
// the stream's index, which decides what a stream holds, keeps all 128.
type keyTable struct {
	blockSize int
	seed      uint64

	// wmu serialises writers for the whole of a write, so that a writer
	// may read the table without mu and build a grown copy of a part of
	// it while queries go on; mu is taken, after wmu, only to change
	// what queries read.
	wmu sync.Mutex
	mu  sync.RWMutex
	// A cell is a key's record: 16 bytes, so that one cache line fetched
	// answers for the key, with no record to fetch after it. Most keys
	// are held by one or two streams, so the holders list up to two
	// (slot, tiers) entries inline; a key held by more gets a dense
	// entry, Device and Host bitsets of words words each, in a pool, and
	// the holders name it (holdDense | index).
	//
	// The cells are an open-addressed array, probed linearly from a key's
	// home, which is computed from the key's tag (the top half of k.Lo,
	// kept in the cell): so a cell alone tells where its key belongs. A
	// dropped key's cell is emptied by shifting the later cells of its
	// probe run back (remove), which leaves no tombstones and needs no
	// rebuild at steady state, and a rebuild places the old cells in
	// their order. The array's size is not a power of two: a home is a
	// multiply-shift of the tag, so the load after a rebuild is
	// rebuildLoad whatever the number of keys.
	words int
	cells []cell
	live  int  // cells in use
	pool  slab // dense entries, 2*words words each
	// reserved is the room fills in progress made for their keys (see
	// reserve); it keeps the cells from being compacted meanwhile.
	reserved int
	// published has a slot's bit set while the slot's bits are its
	// stream's served view. A change makes a new array: a view holds it.
	published []uint64
	slotUsed  []bool

	// stamps holds, per stripe of stripeCells cells, the write count
	// (below) of the last write that changed the stripe's cells or the
	// dense entries they name (see touch). view is what a walk reads (see
	// tableView). shared is the writer's note that the write under way
	// may be read by walks (see beginWrite).
	stamps []uint64
	view   atomic.Pointer[tableView]
	shared bool

	// What walks and writers tell each other goes on two cache lines,
	// each written by one side only, so that neither side's writes evict
	// what the other reads on every access.
	_ [64]byte
	// writes counts the holds of mu that change cells, twice each: odd
	// while one is under way. plain is set while a write goes on with
	// plain stores, which it does when it found no walk under way
	// without mu (see beginWrite).
	writes atomic.Uint64
	plain  atomic.Bool
	_      [64]byte
	// walkers counts the walks under way without mu; lockedWalks counts
	// the walks that took mu: the table's own counter, or its
	// Directory's, which outlives the table (kvcar_directory_locked_walks_total).
	walkers     atomic.Int64
	lockedWalks *atomic.Uint64
	_           [64]byte

	// mig is the larger cell array being built beside cells, nil when
	// none is (see migration). Cell arrays of migrateFrom cells or more
	// grow that way; tests set it lower. The fields sit after the ones
	// every write reads, which keep the offsets they had before them.
	mig         *migration
	migrateFrom int
	// next is the array being made for the next migration while writes
	// go on (see makeRoom), by newCells and touchPages on a goroutine
	// makers counts: the table's own, or its Directory's, which Close
	// waits for.
	next       *nextArray
	newCells   func(n int) []cell
	touchPages func(cells []cell, stop *atomic.Bool)
	makers     *sync.WaitGroup
}

// tableView is the table as a walk finds it: the arrays a walk reads,
// swapped whole (a new view) whenever one of them is replaced or grows a
// page, while the cells' and dense entries' contents change in place
// under the stripes' stamps.
//
// A walk reads without mu (walkTries times at most). It notes the write
// count before it reads anything and the stripes it reads, and keeps its
// answer only if the view is still the table's and either the count has
// not moved or none of its stripes has a stamp as late as the count it
// noted. Then every write it could have seen had ended before it began,
// and none began in its stripes before it ended, so the walk saw the
// table as it was at one moment, as a walk holding mu does (R-REC-2: no
// mix of two views). With no writer about, the check is one load.
// Writers never wait for such a walk, and such a walk never waits for
// them; a walk that fails walkTries times takes mu shared, as every walk
// once did, so that a writer at full speed cannot starve it.
//
// A write that may run while such a walk reads makes every store into
// the live cells and dense entries atomic, and a walk reads them with
// atomic loads, so that what a walk reads while a writer writes is a
// race neither for the memory model nor for the race detector. A write
// that finds no such walk under way writes plainly, and walks wait for
// it to end (see beginWrite). A torn read is caught by the check, and
// until then anything a torn read names (a dense entry, an inline slot,
// a probe run) is bounds-checked.
type tableView struct {
	cells     []cell
	stamps    []uint64
	pages     [][]uint64
	words     int
	published []uint64
}

// cell is one key's record: hi is k.Hi; tagHold holds the key's tag in
// its high half and its holders in its low half, which are never zero
// while the cell is in use. The holders are either up to two inline
// entries of 15 bits each (present bit, two tier bits, 12-bit slot), or,
// with holdDense set, the index of a dense entry.
type cell struct {
	hi, tagHold uint64
}

const (
	holdDense    = 1 << 31
	entryBits    = 15
	entryMask    = 1<<entryBits - 1
	entryPresent = 1 << 14
	tierShift    = 12
	slotMask     = 1<<tierShift - 1
	tierDev      = 1
	tierHost     = 2
	// maxSlots is what an inline slot can name: a group has at most
	// max_streams (128) streams, and while a set changes, its retired
	// streams' slots besides.
	maxSlots = 1 << tierShift
)

func (c *cell) used() bool          { return uint32(c.tagHold) != 0 }
func (c *cell) tag() uint32         { return uint32(c.tagHold >> 32) }
func (c *cell) holders() uint32     { return uint32(c.tagHold) }
func (c *cell) setHolders(h uint32) { c.tagHold = c.tagHold&^(1<<32-1) | uint64(h) }

// holds reports whether the cell is k's.
func (c *cell) holds(k kvindex.Key) bool { return c.hi == k.Hi && c.tag() == tagOf(k) }

// entries returns the two inline entries of holders h.
func entries(h uint32) [2]uint32 { return [2]uint32{h & entryMask, h >> entryBits & entryMask} }

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
	// A stripe is stripeCells cells, one page of them: the writes a
	// stamp covers. Smaller stripes would fail fewer walks under writes
	// and cost more memory; at this size the stamps take 1/32 byte a
	// cell, and a change falls in one of the stripes of a walk of 128
	// blocks with odds of about 128 in cells/stripeCells.
	stripeShift = 8
	stripeCells = 1 << stripeShift
	// walkTries is how many walks without mu a query makes before it
	// takes mu.
	walkTries = 3
	// plainWaits bounds how often a walk yields its processor waiting
	// for a plain write to end (at most keyChunk changes, microseconds)
	// before it takes mu instead.
	plainWaits = 64
	// The cells grow when live keys would pass 4/5 of them, to a size
	// that puts the live keys at 7/10: 21–23 bytes a key.
	//
	// warmLines is how many cache lines of cells warmChanges fetches
	// from a key's home on: a key that is not held, and one dropped
	// (remove shifts the rest of its run), are read up to the end of
	// their probe run, at those loads 6 to 13 cells from the home on
	// average; three lines from the home's own hold at least eight.
	// BenchmarkKeyTableChurn (16 M keys, 2026-12-04): 135 ns a change
	// with one line, 113 with two, 89 with three, 92 with four.
	warmLines                      = 3
	cellsPerLine                   = 64 / int(unsafe.Sizeof(cell{}))
	maxLoadNum, maxLoadDen         = 4, 5
	rebuildLoadNum, rebuildLoadDen = 7, 10
	// The cells, or the dense entries' pages, are compacted when less
	// than a fifth of them is in use: far from the loads between which
	// they stay as a table grows or churns, so that a compaction follows
	// only the loss of most of what a table held.
	shrinkNum, shrinkDen = 1, 5
)

// cellArray makes an array of n cells, asking for huge pages when it is
// large. A walk reads a cell or two of each prompt block at random in an
// array of up to hundreds of MiB; with 4 KiB pages nearly each of those
// reads also misses the TLB, and on a virtual machine that walk is two
// page tables deep. On the Intel Xeon the real-size query took 0.88–0.91
// of its time with huge pages (performance log, "The table's cells on
// huge pages").
func cellArray(n int) []cell {
	c := make([]cell, n)
	hugepage.Advise(c)
	return c
}

// keyChange is one content key's tiers on one stream after a change.
type keyChange struct {
	k         kvindex.Key
	dev, host bool
}

func newKeyTable(blockSize int, seed uint64) *keyTable {
	t := &keyTable{blockSize: blockSize, seed: seed, words: 1, published: make([]uint64, 1), slotUsed: make([]bool, 64),
		lockedWalks: new(atomic.Uint64), migrateFrom: migrateFrom, newCells: cellArray,
		touchPages: touchPages, makers: new(sync.WaitGroup)}
	t.publish()
	return t
}

// publish makes the table's arrays the view walks read. The caller holds
// mu, or is the table's constructor.
func (t *keyTable) publish() {
	t.view.Store(&tableView{cells: t.cells, stamps: t.stamps, pages: t.pool.pages, words: t.words, published: t.published})
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
	t.publish()
	t.mu.Unlock()
}

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
func (s *slab) at(i uint32, size int) []uint64 { return pageItem(s.pages, i, size) }

// pageItem returns item i of size words in pages of pageRecords items.
func pageItem(pages [][]uint64, i uint32, size int) []uint64 {
	p := pages[i>>pageShift]
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
	pub := slices.Clone(t.published)
	if on {
		pub[slot>>6] |= 1 << (slot & 63)
	} else {
		pub[slot>>6] &^= 1 << (slot & 63)
	}
	t.mu.Lock()
	t.published = pub
	t.publish()
	t.mu.Unlock()
}

// apply writes changes for slot, in order.
func (t *keyTable) apply(slot int, changes []keyChange) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	// Room for every change to add a key is made first, without mu (see
	// rebuildCells and makeRoom), so that set never rebuilds the cells
	// with mu held.
	t.makeRoom(len(changes), len(changes))
	// The loads run without mu: only writers change the cells and
	// records, and wmu keeps them out.
	for base := 0; base < len(changes); base += keyBatch {
		t.warmChanges(changes[base:min(base+keyBatch, len(changes))])
	}
	for len(changes) > 0 {
		chunk := changes[:min(keyChunk, len(changes))]
		changes = changes[len(chunk):]
		t.mu.Lock()
		t.beginWrite()
		for i := range chunk {
			c := &chunk[i]
			t.set(slot, c.k, c.dev, c.host)
		}
		if t.mig != nil {
			for i := range chunk {
				t.mirror(chunk[i].k)
			}
		}
		t.endWrite()
		t.mu.Unlock()
	}
	if t.sparse() {
		t.compact()
	}
}

// sparse reports whether the cells, or the dense entries' pages, hold
// less than a fifth of what they have room for: what is left of a peak
// once streams have left or engines dropped most of their blocks.
func (t *keyTable) sparse() bool {
	if len(t.cells) > minCells && shrinkDen*(t.live+t.reserved) < shrinkNum*len(t.cells) {
		return true
	}
	dense := int(t.pool.used) - len(t.pool.free)
	return len(t.pool.pages) > 1 && shrinkDen*dense < shrinkNum*len(t.pool.pages)*pageRecords
}

// compact rebuilds the cells for the live keys at rebuildLoad, and the
// dense entries into as few pages as they need (see rebuild).
func (t *keyTable) compact() {
	t.setMigration(nil)
	t.setNext(nil)
	t.rebuild(0, true)
}

// inlineOf returns the inline holders of dense entry d (Device words,
// then Host words, w each) when at most two slots hold it.
func inlineOf(d []uint64, w int) (uint32, bool) {
	var e [2]uint32
	n := 0
	for x := range w {
		for held := d[x] | d[w+x]; held != 0; held &= held - 1 {
			if n == len(e) {
				return 0, false
			}
			b := held & -held
			slot := uint32(x<<6 | bits.TrailingZeros64(held))
			var tiers uint32
			if d[x]&b != 0 {
				tiers |= tierDev
			}
			if d[w+x]&b != 0 {
				tiers |= tierHost
			}
			e[n] = entryPresent | tiers<<tierShift | slot
			n++
		}
	}
	return e[0] | e[1]<<entryBits, n > 0
}

// set makes slot's bits of k say dev and host, adding k's cell when k
// gains its first holder and dropping it when it loses its last.
func (t *keyTable) set(slot int, k kvindex.Key, dev, host bool) {
	var tiers uint32
	if dev {
		tiers |= tierDev
	}
	if host {
		tiers |= tierHost
	}
	mine := entryPresent | tiers<<tierShift | uint32(slot)
	i, ok := t.lookup(k)
	if !ok {
		if tiers != 0 {
			t.insert(k, i, mine)
		}
		return
	}
	h := t.cells[i].holders()
	if h&holdDense != 0 {
		d := t.dense(h &^ holdDense)
		w, b := slot>>6, uint64(1)<<(slot&63)
		t.touch(i)
		t.setBit(&d[w], b, dev)
		t.setBit(&d[t.words+w], b, host)
		if tiers != 0 {
			return
		}
		for _, x := range d {
			if x != 0 {
				return
			}
		}
		t.pool.release(h &^ holdDense)
		t.remove(i)
		return
	}
	e := entries(h)
	switch {
	case e[0] != 0 && int(e[0]&slotMask) == slot:
		e[0] = 0
	case e[1] != 0 && int(e[1]&slotMask) == slot:
		e[1] = 0
	}
	if tiers != 0 {
		switch {
		case e[0] == 0:
			e[0] = mine
		case e[1] == 0:
			e[1] = mine
		default:
			t.touch(i)
			t.storeHolders(i, t.promote(e[0], e[1], mine))
			return
		}
	}
	if e[0] == 0 {
		e[0], e[1] = e[1], 0
	}
	if e[0] == 0 {
		t.remove(i)
		return
	}
	t.storeHolders(i, e[0]|e[1]<<entryBits)
}

// promote moves a key's holders into a new dense entry and returns the
// holders naming it. The entry may be one a walk still reads through a
// cell it read before the entry was released: the caller has touched
// that walk's stripe since, and the entry is written with atomic stores.
func (t *keyTable) promote(entries ...uint32) uint32 {
	pages := len(t.pool.pages)
	d := t.pool.alloc(2 * t.words)
	if len(t.pool.pages) != pages {
		t.publish()
	}
	var bits [2 * maxSlots / 64]uint64
	for _, e := range entries {
		addEntry(bits[:2*t.words], t.words, e)
	}
	dst := t.dense(d)
	for x := range dst {
		t.storeWord(&dst[x], bits[x])
	}
	return holdDense | d
}

// addEntry sets the bits of inline entry e in the bitsets of dst (Device
// words, then Host words, w each). It reports false, setting nothing,
// when e names a slot beyond them, which only a torn read can make it.
func addEntry(dst []uint64, w int, e uint32) bool {
	if e == 0 {
		return true
	}
	slot := e & slotMask
	if int(slot>>6) >= w {
		return false
	}
	b := uint64(1) << (slot & 63)
	if e>>tierShift&tierDev != 0 {
		dst[slot>>6] |= b
	}
	if e>>tierShift&tierHost != 0 {
		dst[w+int(slot>>6)] |= b
	}
	return true
}

// setBit sets or clears b in the live word x.
func (t *keyTable) setBit(x *uint64, b uint64, on bool) {
	if on {
		t.storeWord(x, *x|b)
	} else {
		t.storeWord(x, *x&^b)
	}
}

// storeWord writes v into the live word x, atomically when walks without
// mu may read it.
func (t *keyTable) storeWord(x *uint64, v uint64) {
	if t.shared {
		atomic.StoreUint64(x, v)
	} else {
		*x = v
	}
}

// beginWrite opens a write of cells under mu. Atomic stores and stamps
// on every write cost decode + apply with the shared table up to 31 % of
// its blocks a second (BenchmarkDecodeApplyShared, in turn with plain
// stores), so a write makes them only when a walk without mu is under
// way. Otherwise it sets plain, and a walk that starts meanwhile sees it
// and waits for the write to end before it reads: each side stores its
// own flag before it loads the other's, so at least one sees the other.
func (t *keyTable) beginWrite() {
	t.shared = t.walkers.Load() != 0
	if !t.shared {
		t.plain.Store(true)
		if t.walkers.Load() != 0 {
			t.shared = true
			t.plain.Store(false)
		}
	}
	t.writes.Add(1)
}

// endWrite closes the write beginWrite opened; the caller still holds mu.
func (t *keyTable) endWrite() {
	t.writes.Add(1)
	if !t.shared {
		t.plain.Store(false)
	}
}

// touch stamps the stripe of cell i with the write under way, before
// the cell or a dense entry it names is written: a walk that began
// before the write and reads the stripe sees the stamp and walks again.
func (t *keyTable) touch(i int) {
	if !t.shared {
		return
	}
	s := i >> stripeShift
	if w := t.writes.Load(); t.stamps[s] != w {
		atomic.StoreUint64(&t.stamps[s], w)
	}
}

// store writes c into live cell i.
func (t *keyTable) store(i int, c cell) {
	t.touch(i)
	p := &t.cells[i]
	t.storeWord(&p.hi, c.hi)
	t.storeWord(&p.tagHold, c.tagHold)
}

// storeHolders writes h as live cell i's holders.
func (t *keyTable) storeHolders(i int, h uint32) {
	t.touch(i)
	p := &t.cells[i]
	c := cell{tagHold: p.tagHold}
	c.setHolders(h)
	t.storeWord(&p.tagHold, c.tagHold)
}

// homeOf returns k's home cell in an array of n cells.
func homeOf(k kvindex.Key, n int) int { return homeOfTag(tagOf(k), n) }

// tagOf returns the tag of k: the top half of k.Lo, uniform as XXH3
// output is.
func tagOf(k kvindex.Key) uint32 { return uint32(k.Lo >> 32) }

// homeOfTag returns the home cell of tag in an array of n cells: the tag
// scaled to [0, n), so homes follow the tags' order.
func homeOfTag(tag uint32, n int) int { return int(uint64(tag) * uint64(n) >> 32) }

// lookup returns the cell of k, or when k is not held the empty cell that
// ends its probe run, where insert puts it (-1 when there are no cells).
// The probe is not repeated by insert.
func (t *keyTable) lookup(k kvindex.Key) (int, bool) { return lookupIn(t.cells, k) }

// lookupIn is lookup in cells.
func lookupIn(cells []cell, k kvindex.Key) (int, bool) {
	n := len(cells)
	if n == 0 {
		return -1, false
	}
	for i := homeOf(k, n); ; {
		c := &cells[i]
		if !c.used() {
			return i, false
		}
		if c.holds(k) {
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// needsRebuild reports whether adding extra keys could push the live
// keys past maxLoad of the cells.
func (t *keyTable) needsRebuild(extra int) bool {
	return maxLoadDen*(t.live+extra) > maxLoadNum*len(t.cells)
}

// insert adds k, which the table does not hold, with holders h, in cell i
// if that is not -1 (the empty cell lookup found for k).
func (t *keyTable) insert(k kvindex.Key, i int, h uint32) {
	if t.mig == nil && t.next == nil && t.needsRebuild(1) {
		t.rebuildCells(1)
		i = -1
	}
	c := cell{hi: k.Hi, tagHold: uint64(tagOf(k))<<32 | uint64(h)}
	if i < 0 {
		i = emptyFrom(t.cells, homeOf(k, len(t.cells)))
	}
	t.store(i, c)
	t.live++
}

// emptyFrom returns the first empty cell from i on.
func emptyFrom(cells []cell, i int) int {
	n := len(cells)
	for cells[i].used() {
		if i++; i == n {
			i = 0
		}
	}
	return i
}

// reserve makes room for extra more keys at once, before a fill of up to
// that many, and says whether that took a rebuild. Made a change batch at
// a time, the room for a quarter-million keys would take some forty
// rebuilds at once, each reading every cell. A table of migrateFrom cells
// or more makes none ahead: the fill's writes grow it a step at a time,
// as any writer's do, and only if its keys need the room. Keys another
// slot holds already (a replica of a cached prefix) need none, and room
// made ahead for them was made for nothing, then given back: at 4.2 M
// keys that fill took 0.38–0.48 s, against 0.1 s for one of new keys
// (BenchmarkKeyTableFill).
func (t *keyTable) reserve(extra int) (grew bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if len(t.cells) < t.migrateFrom {
		grew = t.makeRoom(extra, 0)
	}
	t.reserved += extra
	return grew
}

// unreserve ends a fill's reservation of extra. Keys the table held
// already for other slots took no room: cells a reservation grew for
// them are rebuilt to rebuildLoad, and cells left sparse compacted.
func (t *keyTable) unreserve(extra int, grew bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.reserved -= extra
	switch {
	case t.sparse():
		t.compact()
	case grew && t.mig == nil && 20*rebuildLoadDen*t.live < 19*rebuildLoadNum*len(t.cells):
		t.rebuildCells(0)
	}
}

// rebuildCells builds a cell array for the live keys with room for extra
// more (see rebuild); the dense entries stay where they are.
func (t *keyTable) rebuildCells(extra int) { t.rebuild(extra, false) }

// rebuild builds a cell array for the live keys with room for extra more
// and, with repack, copies the dense entries into as few pages as they
// need, an entry left with at most two holders (slot and tiers) going
// back inline into its cell, as a key first held by them would be. It
// reads the old cells in order; as homes follow the tags' order, it
// writes the new ones nearly in order too. The new arrays are filled
// without mu, so that queries keep reading the old ones meanwhile; the
// caller holds wmu, so the cells do not change, and only the swap takes
// mu. A caller already holding mu (set, outside apply) must not reach
// here; apply makes room first.
func (t *keyTable) rebuild(extra int, repack bool) {
	n := max(minCells, ((t.live+extra)*rebuildLoadDen+rebuildLoadNum-1)/rebuildLoadNum)
	cells := cellArray(n)
	pool := t.pool
	if repack {
		pool = slab{}
	}
	size := 2 * t.words
	for i := range t.cells {
		c := t.cells[i]
		if !c.used() {
			continue
		}
		if h := c.holders(); repack && h&holdDense != 0 {
			src := t.dense(h &^ holdDense)
			if in, ok := inlineOf(src, t.words); ok {
				c.setHolders(in)
			} else {
				d := pool.alloc(size)
				copy(pool.at(d, size), src)
				c.setHolders(holdDense | d)
			}
		}
		cells[emptyFrom(cells, homeOfTag(c.tag(), n))] = c
	}
	stamps := make([]uint64, (n+stripeCells-1)>>stripeShift)
	t.mu.Lock()
	t.cells, t.pool, t.stamps = cells, pool, stamps
	t.publish()
	t.mu.Unlock()
}

// remove empties cell i. The later cells of its probe run whose home
// does not lie after the hole move back into it in turn, so every key
// stays reachable from its home through cells in use.
func (t *keyTable) remove(i int) {
	t.shiftOut(t.cells, i, true)
	t.live--
}

// shiftOut empties cell i of cells, the served ones (with stores walks
// may read) or a migration's.
func (t *keyTable) shiftOut(cells []cell, i int, served bool) {
	n := len(cells)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		c := &cells[j]
		if !c.used() {
			break
		}
		// The cell at j stays if its home lies cyclically in (i, j].
		h := homeOfTag(c.tag(), n)
		if i <= j {
			if i < h && h <= j {
				continue
			}
		} else if i < h || h <= j {
			continue
		}
		if served {
			t.store(i, *c)
		} else {
			cells[i] = *c
		}
		i = j
	}
	if served {
		t.store(i, cell{})
	} else {
		cells[i] = cell{}
	}
}

// storageBytes is the memory the table holds, by capacity.
func (t *keyTable) storageBytes() int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	cells := len(t.cells)
	if t.mig != nil {
		cells += len(t.mig.cells)
	}
	if t.next != nil {
		cells += t.next.n
	}
	return t.pool.bytes(2*t.words) + int64(cells)*int64(unsafe.Sizeof(cell{})) + int64(len(t.stamps))*8
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
	keys [walkBatch]kvindex.Key
	sink uint64
	// reads holds the stripes a walk without mu read, to check after it.
	reads []uint32
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

// tokensOf is resultOf in tokens of the walk's blocks: the slot's matched
// prefix on Device, and past it on Host only.
func (wr *walkResult) tokensOf(slot int) (device, hostOnly int, ok bool) {
	blocks, hostOnly, ok := wr.resultOf(slot)
	if !ok {
		return 0, 0, false
	}
	bs := wr.hasher.BlockSize()
	return (blocks - hostOnly) * bs, hostOnly * bs, true
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
// published slot still matching holds. It reads without mu while its
// reads stay unchanged through it (see tableView), and holding mu shared
// after walkTries tries that did not.
func (t *keyTable) walk(tokens []uint32, wr *walkResult) {
	for range walkTries {
		t.walkers.Add(1)
		if !t.plainEnded() {
			t.walkers.Add(-1)
			break
		}
		w := t.writes.Load()
		v := t.view.Load()
		ok := t.walkView(v, tokens, wr, true) && t.held(v, w, wr)
		t.walkers.Add(-1)
		if ok {
			return
		}
	}
	t.lockedWalks.Add(1)
	t.mu.RLock()
	t.walkView(t.view.Load(), tokens, wr, false)
	t.mu.RUnlock()
}

// plainEnded waits, a little, for a plain write under way to end; the
// caller counts among the walkers, so the next write will not be plain.
// It reports whether none is under way.
func (t *keyTable) plainEnded() bool {
	for range plainWaits {
		if !t.plain.Load() {
			return true
		}
		runtime.Gosched()
	}
	return !t.plain.Load()
}

// walkView walks view v; with check it notes every stripe it reads in
// wr.reads. It reports false when it meets what only a torn read would
// show.
func (t *keyTable) walkView(v *tableView, tokens []uint32, wr *walkResult, check bool) bool {
	bs := t.blockSize
	W := v.words
	wr.reset(W, bs, t.seed)
	wr.walked = true
	wr.reads = wr.reads[:0]
	any := uint64(0)
	for w, p := range v.published {
		wr.start[w], wr.alive[w] = p, p
		any |= p
	}
	n := len(tokens) / bs
	if any == 0 || len(v.cells) == 0 {
		// No cells: nothing is held, and nothing was read.
		if any != 0 {
			wr.stopAll(0)
		}
		return true
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
		batch *= walkGrowth
		keys := wr.keys[:m]
		for j := range keys {
			b := i + j
			parent = wr.hasher.BlockKey(parent, b > 0, tokens[b*bs:(b+1)*bs])
			keys[j] = parent
		}
		v.warm(keys, wr)
		for j := range keys {
			h, found, ok := v.find(keys[j], wr, check)
			if !ok {
				return false
			}
			if !found {
				break walk
			}
			var dev, host []uint64
			if h&holdDense != 0 {
				d, ok := v.dense(h &^ holdDense)
				if !ok {
					return false
				}
				dev, host = d[:W], d[W:2*W]
			} else {
				clear(wr.inline)
				e := entries(h)
				if !addEntry(wr.inline, W, e[0]) || !addEntry(wr.inline, W, e[1]) {
					return false
				}
				dev, host = wr.inline[:W], wr.inline[W:2*W]
			}
			left := uint64(0)
			for w, a := range wr.alive {
				if a == 0 {
					continue
				}
				dw, hw := atomic.LoadUint64(&dev[w]), atomic.LoadUint64(&host[w])
				has := dw | hw
				for stop := a &^ has; stop != 0; stop &= stop - 1 {
					wr.blocks[w<<6|bits.TrailingZeros64(stop)] = int32(i)
				}
				a &= has
				wr.alive[w] = a
				if ho := a &^ dw; ho != 0 {
					wr.addHostOnly(w, ho)
				}
				left |= a
			}
			if left == 0 {
				return true
			}
			i++
		}
	}
	wr.stopAll(i)
	return true
}

// stopAll ends every slot still matching at i blocks.
func (wr *walkResult) stopAll(i int) {
	for w, a := range wr.alive {
		for ; a != 0; a &= a - 1 {
			wr.blocks[w<<6|bits.TrailingZeros64(a)] = int32(i)
		}
	}
}

// held reports whether what wr's walk of v read, with the write count at
// w before it, was the table at one moment: v is still the table's view,
// and no write under way at w or begun since has changed a stripe the
// walk read.
func (t *keyTable) held(v *tableView, w uint64, wr *walkResult) bool {
	if t.view.Load() != v {
		return false
	}
	if w&1 == 0 && t.writes.Load() == w {
		return true
	}
	for _, s := range wr.reads {
		if atomic.LoadUint64(&v.stamps[s]) >= w {
			return false
		}
	}
	return true
}

// find returns the holders of k's cell, and found false when k is not
// held. With check it notes each stripe the probe enters in wr.reads. It
// returns ok false when the probe runs over every cell (only a table
// changing under the walk can make it).
func (v *tableView) find(k kvindex.Key, wr *walkResult, check bool) (h uint32, found, ok bool) {
	cells := v.cells
	n := len(cells)
	i := homeOf(k, n)
	s := -1
	tag := tagOf(k)
	for range n {
		if check && i>>stripeShift != s {
			s = i >> stripeShift
			wr.reads = append(wr.reads, uint32(s))
		}
		c := &cells[i]
		th := atomic.LoadUint64(&c.tagHold)
		if uint32(th) == 0 {
			return 0, false, true
		}
		if uint32(th>>32) == tag && atomic.LoadUint64(&c.hi) == k.Hi {
			return uint32(th), true, true
		}
		if i++; i == n {
			i = 0
		}
	}
	return 0, false, false
}

// dense returns dense entry d of the view, ok false when it has none such
// (a torn read's).
func (v *tableView) dense(d uint32) ([]uint64, bool) {
	p, size := int(d>>pageShift), 2*v.words
	if p >= len(v.pages) || len(v.pages[p]) < pageRecords*size {
		return nil, false
	}
	return pageItem(v.pages, d, size), true
}

// The walk's batches grow walkGrowth times from one block to walkBatch.
// A batch costs a round of two dependent cache misses (its cells, then
// their dense entries), and what a prompt that stops early loses is the
// hashing of the rest of its last batch. Larger rounds were measured
// (growing eightfold to 64 blocks: three rounds for an 8k-token prompt
// instead of eight) and not kept: 17-32 % off an 8k-token prompt's query
// over 262,144-block indexes, but 1.5 µs onto a 12-block prompt's, its
// hashing four times slower for a reason not found (see the performance
// log, "The walk's rounds").
const (
	walkBatch  = 16
	walkGrowth = 2
)

// warm loads the home cells of keys, then the dense entries those cells
// name, each pass's loads independent of each other.
func (v *tableView) warm(keys []kvindex.Key, wr *walkResult) {
	if len(keys) < 2 || len(v.cells) == 0 {
		return
	}
	var acc uint64
	var hs [walkBatch]uint32
	n := len(v.cells)
	for j, k := range keys {
		hs[j] = uint32(atomic.LoadUint64(&v.cells[homeOf(k, n)].tagHold))
	}
	for _, h := range hs[:len(keys)] {
		if h&holdDense != 0 {
			if d, ok := v.dense(h &^ holdDense); ok {
				acc += atomic.LoadUint64(&d[0])
			}
		}
	}
	wr.sink += acc
}

// warmChanges fetches the cells of up to keyBatch changes from their
// homes on, warmLines lines each, before set reads any, so that their
// cache misses overlap instead of stalling each change in turn. Every
// home's line goes first, the lines after them second: a key's lines
// share a page, and a fetch issued while that page's address
// translation is still being walked walks it again, which on a virtual
// machine costs more than the line (BenchmarkKeyTableChurn: 140–149 ns
// a change when each key's lines went together, 119–133 ns this way).
func (t *keyTable) warmChanges(changes []keyChange) {
	n := len(t.cells)
	if n == 0 {
		return
	}
	changes = changes[:min(len(changes), keyBatch)]
	for j := range changes {
		prefetch.Elem(t.cells, homeOf(changes[j].k, n))
	}
	for j := range changes {
		h := homeOf(changes[j].k, n)
		for l := 1; l < warmLines; l++ {
			prefetch.Elem(t.cells, h+l*cellsPerLine)
		}
	}
	// A migration's array is read too, by mirror, for each key whose
	// home the copy has passed.
	if m := t.mig; m != nil {
		for j := range changes {
			if k := changes[j].k; homeOf(k, n) < m.bound {
				prefetch.Elem(m.cells, homeOf(k, len(m.cells)))
			}
		}
	}
}

// keySource is a view's keys as fill reads them; *kvindex.Index is one.
type keySource interface {
	Resident() int
	ForEachKey(fn func(k kvindex.Key, onDevice, onHost bool))
}

// fill writes ix's keys for slot, which must not be published: nothing
// of it is visible until setPublished.
func (t *keyTable) fill(slot int, ix keySource, buf *[]keyChange) {
	n := ix.Resident()
	grew := t.reserve(n)
	ix.ForEachKey(func(k kvindex.Key, d, h bool) { t.push(slot, buf, k, d, h) })
	t.flush(slot, buf)
	t.unreserve(n, grew)
}

// withdraw clears slot's bits of every key of ix, the view the slot
// mirrored; the slot must already be unpublished.
func (t *keyTable) withdraw(slot int, ix keySource, buf *[]keyChange) {
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
//
// The views are compared block by block, by engine hash
// (ForEachKeyAgainst), and a key's bits are those of one block holding
// it. A key held by one block in each view, as engines name their blocks,
// ends exactly as next holds it; one several blocks hold may end on fewer
// tiers, never more: the first pass writes a subset of old ∩ next for
// every block that differs and leaves the others, which are already, and
// the second writes next's tiers of a block.
func (t *keyTable) replace(slot int, old, next *kvindex.Index, buf *[]keyChange) {
	old.ForEachKeyAgainst(next, func(k kvindex.Key, od, oh, nd, nh bool) {
		if nd != od || nh != oh {
			t.push(slot, buf, k, od && nd, oh && nh)
		}
	})
	t.flush(slot, buf)
	next.ForEachKeyAgainst(old, func(k kvindex.Key, nd, nh, od, oh bool) {
		if nd != od || nh != oh {
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
