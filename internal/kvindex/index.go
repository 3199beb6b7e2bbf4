package kvindex

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// Defaults applied by New to zero or negative Config fields; they match
// the service defaults of R-CFG-2 and R-CFG-3.
const (
	DefaultBlockSize = 128
	DefaultMaxBlocks = 262144
)

var (
	// ErrBlockSize reports a BlockStored event whose block size differs
	// from the index's; its keys would never match a query.
	ErrBlockSize = errors.New("block size mismatch")
	// ErrTokenCount reports a BlockStored event whose token count is not
	// its block count times its block size.
	ErrTokenCount = errors.New("token count does not match block count")
	// ErrUnknownParent reports a live BlockStored event whose parent the
	// index does not know: an event was lost and the stream needs a
	// snapshot (R-IDX-5).
	ErrUnknownParent = errors.New("unknown parent block")
	// ErrCapacity reports that a new entry was needed while MaxBlocks
	// entries were held and none of them was a ghost to evict.
	ErrCapacity = errors.New("block capacity exhausted")
	// ErrEvent reports an event kind or medium the index does not know.
	ErrEvent = errors.New("invalid event")
)

// Mode tells Apply whether an event is a live delta or part of a snapshot.
type Mode uint8

const (
	// Delta is a live event: an unknown parent is a lost event and an error.
	Delta Mode = iota
	// Snapshot is a replayed full state, parent first: an unknown parent
	// is a suffix orphaned by eviction, kept without a content key and
	// never a hit (R-IDX-5).
	Snapshot
	// History is a delta applied to a view that may lack blocks stored
	// before it began (a history window or a live-only stream): an
	// unknown parent is such a block, and its children are orphans,
	// kept and counted like a snapshot's, not a lost event.
	History
)

func (m Mode) String() string {
	switch m {
	case Snapshot:
		return "snapshot"
	case History:
		return "history"
	}
	return "delta"
}

// Config sizes one index.
type Config struct {
	// BlockSize is the number of tokens per block; BlockStored events
	// must carry the same size. Zero means DefaultBlockSize.
	BlockSize int
	// HashSeed seeds the content keys; it need not match the engine's.
	HashSeed uint64
	// MaxBlocks bounds the number of entries, ghosts included (R-CFG-2).
	// Zero means DefaultMaxBlocks; values above 16,777,215 are clamped
	// to it, since table cells address entries with 24 bits.
	MaxBlocks int
}

// Match is the contiguous prefix of a query found in the index (R-IDX-3),
// in blocks; callers multiply by the block size.
type Match struct {
	// DeviceBlocks counts prefix blocks with a Device replica.
	DeviceBlocks int
	// HostOnlyBlocks counts prefix blocks with a Host replica and no
	// Device replica.
	HostOnlyBlocks int
}

// Blocks returns the length of the matched prefix in blocks.
func (m Match) Blocks() int { return m.DeviceBlocks + m.HostOnlyBlocks }

// Stats counts events, or parts of events, that the index tolerated
// without changing its state. Counters are cumulative over the index's
// life, Clear included.
type Stats struct {
	// OrphanBlocks counts blocks stored while their parent was unknown
	// to the index or itself an orphan (R-IDX-5): they are kept without
	// a content key, never hits, until a store with a known parent keys
	// them.
	OrphanBlocks uint64
	// UnresolvedReplicas counts tokenless BlockStored hashes that the
	// index did not know, so it could not attach the replica to a key.
	UnresolvedReplicas uint64
	// UnknownRemovals counts BlockRemoved hashes that were unknown or
	// not on the named tier.
	UnknownRemovals uint64
	// GhostEvictions counts ghosts dropped to make room for new entries.
	GhostEvictions uint64
	// NonPlainBlocks counts blocks of BlockStored events that are not
	// plain text (LoRA, multimodal, salted, other KV cache groups,
	// remote), which are not indexed (R-WIRE-5).
	NonPlainBlocks uint64
	// UnservedBlocks counts blocks stored on a tier that is neither
	// Device nor Host (disk, external, unknown): they are kept as
	// mappings so their children resolve, never as hits.
	UnservedBlocks uint64
}

// Tier bits of an entry; bit i is kvevent.Medium i.
const (
	tierDevice uint8 = 1 << kvevent.Device
	tierHost   uint8 = 1 << kvevent.Host
)

// flagQueued marks an entry that is on the ghost queue.
const flagQueued uint8 = 1 << 3

// flagUnkeyed marks an orphan: a block the engine holds whose parent the
// index did not know when it was stored, so its content key could not be
// computed. It is in the engine-hash table only, never a hit, but it
// keeps its tiers so that removals, tokenless replicas and a later store
// with a known parent (which gives it its key) all find it: a Host copy
// announced while the block was an orphan is then still known once the
// block is reachable again.
const flagUnkeyed uint8 = 1 << 4

// entry is one engine block, 32 bytes; its tier bits, flagQueued and
// flagUnkeyed are in the parallel meta slice, one byte each, which keeps
// the struct free of padding. An entry on neither tier is a ghost: it
// keeps its engine hash → key mapping so that children and tokenless
// replicas can still resolve it, but it is not a hit.
type entry struct {
	key    Key
	engine kvevent.EngineHash
}

// Index is the prefix index of one stream (one instance and DP rank).
//
// Entries live in one slice addressed by slot; an open-addressing table of
// slots finds them by engine hash, which keeps a resident block near 40
// bytes of heap (a Go map keyed by 16-byte keys would cost several times
// that). No table finds them by content key: events name blocks by engine
// hash, and queries walk the directory's shared key table, which the
// observer keeps (see SetObserver); a calibration compares two views by
// engine hash (ForEachKeyAgainst). A KeyLookup built on demand finds keys
// for tests and benchmarks.
//
// Several entries may share a content key: content an engine names by two
// hashes, or a collision of keys (an engine names the same content by the
// same hash, so both are rare). Each entry's removals touch only its own
// tiers, and the index tells the observer each entry's own tiers: a key two
// entries share may then read as held on fewer tiers than it is, never on
// more. A KeyLookup sees the union of their tiers.
//
// An Index is not safe for concurrent use; the directory serialises access.
// Counts, Len, Stats, Config, ForEach, ForEachKey, ForEachKeyAgainst and
// Lookup only read, so they may run concurrently with each other under a
// shared (read) lock;
// Apply, Clear and AdoptKeys need exclusive access.
type Index struct {
	cfg    Config
	hasher Hasher

	entries  []entry
	meta     []uint8 // per slot: tier bits, flagQueued, flagUnkeyed
	byEngine table

	// gen counts the calls that may have changed entries, so that a
	// KeyLookup can tell it is out of date.
	gen uint64

	// ghosts queues slots in the order they became ghosts, for eviction.
	// A ghost revived stays queued, lazily: eviction passes over queued
	// slots that are not ghosts and drops them from the queue. Every
	// ghost is queued, each slot at most once (flagQueued), so the queue
	// costs four bytes per ghost, none per resident block.
	ghosts slotQueue

	device, host int
	stats        Stats

	// chunk holds the keys of the blocks being stored.
	chunk [chunkBlocks]Key

	// drops counts the observer calls with dropped true, so that a run
	// can end after the event that made one (see ApplyRun).
	drops uint64

	// observe, when set, is told every content key whose tiers may have
	// changed (see SetObserver).
	observe func(k Key, onDevice, onHost, dropped bool)
}

// SetObserver makes fn be called after every change that may alter the
// tiers a content key is held on, with the tiers of the entry that changed
// (of one of them for a key several entries share: then a key may be told
// to be on fewer tiers than the union of its entries, never on more). It
// lets a caller mirror which keys the index holds without rescanning it:
// calls come in the order of the changes, a parent's before its
// children's when a chain is stored, and Clear reports every key that was
// on a tier as on none. dropped is true when the change may have taken a
// tier away from the key (a removal, a clear, a key replaced) and false
// when it can only have added one: a mirror must show drops at once not
// to report blocks the engine no longer holds, while additions may wait
// to be written together. fn runs inside Apply and Clear and must not
// call the index. nil stops the calls.
func (ix *Index) SetObserver(fn func(k Key, onDevice, onHost, dropped bool)) { ix.observe = fn }

// ForEachKey calls fn for every keyed entry on a tier with its content key
// and its own tiers; a key held by several entries comes once per entry.
// fn must not modify the index.
func (ix *Index) ForEachKey(fn func(k Key, onDevice, onHost bool)) {
	for i := range ix.entries {
		if !keyedOnTier(ix.meta[i]) {
			continue
		}
		t := ix.tiers(uint32(i))
		fn(ix.entries[i].key, t&tierDevice != 0, t&tierHost != 0)
	}
}

// ForEachKeyAgainst calls fn for every keyed entry of ix on a tier with
// its content key, its own tiers and the tiers of other's entry with the
// same engine hash, if that entry holds the same key (none otherwise).
// Two views of one engine name the same blocks by the same hashes, so
// this compares them block by block without a table by key; a key one
// view holds under another hash reads as not held by it. Neither index
// may change meanwhile.
func (ix *Index) ForEachKeyAgainst(other *Index, fn func(k Key, onDevice, onHost, otherDevice, otherHost bool)) {
	var slots [warmBatch]uint32
	var hashes [warmBatch]kvevent.EngineHash
	for base := 0; base < len(ix.entries); {
		// Batches of hashes, whose cells in other are fetched together
		// (see warmEntries): the views are out of cache at full size.
		n := 0
		for ; base < len(ix.entries) && n < warmBatch; base++ {
			if !keyedOnTier(ix.meta[base]) {
				continue
			}
			slots[n], hashes[n] = uint32(base), ix.entries[base].engine
			n++
		}
		other.warmEntries(hashes[:n])
		for j := range n {
			e := &ix.entries[slots[j]]
			t := ix.tiers(slots[j])
			var o uint8
			if s, ok := other.findEngine(e.engine); ok && other.meta[s]&flagUnkeyed == 0 && other.entries[s].key == e.key {
				o = other.tiers(s)
			}
			fn(e.key, t&tierDevice != 0, t&tierHost != 0, o&tierDevice != 0, o&tierHost != 0)
		}
	}
}

// notify tells the observer the tiers of slot s under its key, and
// whether the change may have dropped one; an orphan has no key to tell.
func (ix *Index) notify(s uint32, dropped bool) {
	if ix.observe == nil || ix.meta[s]&flagUnkeyed != 0 {
		return
	}
	t := ix.tiers(s)
	ix.tell(ix.entries[s].key, t&tierDevice != 0, t&tierHost != 0, dropped)
}

// tell calls the observer, which must be set, counting drops.
func (ix *Index) tell(k Key, onDevice, onHost, dropped bool) {
	if dropped {
		ix.drops++
	}
	ix.observe(k, onDevice, onHost, dropped)
}

// New returns an empty index. It allocates little: storage grows by
// a quarter at a time up to cfg.MaxBlocks entries.
func New(cfg Config) *Index {
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	if cfg.MaxBlocks > maxSlots {
		cfg.MaxBlocks = maxSlots
	}
	return &Index{
		cfg:      cfg,
		hasher:   *NewHasher(cfg.BlockSize, cfg.HashSeed),
		byEngine: newTable(cfg.MaxBlocks),
	}
}

// Config returns the configuration in effect, defaults applied.
func (ix *Index) Config() Config { return ix.cfg }

// Len returns the number of entries, ghosts included.
func (ix *Index) Len() int { return len(ix.entries) }

// Counts returns the number of Device and of Host replicas; a block on
// both tiers counts in both. Entries sharing a content key count
// separately, as the engine holds each of them.
func (ix *Index) Counts() (deviceBlocks, hostBlocks int) { return ix.device, ix.host }

// Stats returns the tolerated-anomaly counters.
func (ix *Index) Stats() Stats { return ix.stats }

// Clear drops every entry, ghosts included, keeping the storage for the
// state that usually follows (an AllBlocksCleared is followed by a full
// re-announcement). Stats are kept.
func (ix *Index) Clear() {
	if ix.observe != nil {
		for i := range ix.entries {
			if keyedOnTier(ix.meta[i]) {
				ix.tell(ix.entries[i].key, false, false, true)
			}
		}
	}
	ix.gen++
	ix.entries = ix.entries[:0]
	ix.meta = ix.meta[:0]
	ix.byEngine.reset()
	ix.ghosts.reset()
	ix.device, ix.host = 0, 0
}

// ForEach calls fn for every entry, ghosts (on neither tier) and orphans
// included, in no particular order; an orphan's key is the zero Key. fn
// must not modify the index.
func (ix *Index) ForEach(fn func(h kvevent.EngineHash, k Key, onDevice, onHost bool)) {
	for i := range ix.entries {
		e := &ix.entries[i]
		t := ix.tiers(uint32(i))
		fn(e.engine, e.key, t&tierDevice != 0, t&tierHost != 0)
	}
}

// Lookup reports the tiers holding the block with engine hash h; ok is
// false when the index has no entry for it (a ghost has an entry on
// neither tier).
func (ix *Index) Lookup(h kvevent.EngineHash) (onDevice, onHost, ok bool) {
	s, found := ix.findEngine(h)
	if !found {
		return false, false, false
	}
	t := ix.tiers(s)
	return t&tierDevice != 0, t&tierHost != 0, true
}

// Apply applies one event. Errors wrap ErrBlockSize, ErrTokenCount,
// ErrUnknownParent, ErrCapacity or ErrEvent; any of them means the index
// no longer mirrors the engine and the stream must be recovered from a
// snapshot. Validation errors and ErrUnknownParent leave the index
// untouched. ErrCapacity may leave the blocks before the failing one
// applied; the index stays internally consistent.
//
// Tokenless BlockStored events (Host offload copies announced by hash)
// attach their tier to the entry already mapped to each hash, orphans
// included. A hash the index does not know is counted in Stats and
// otherwise ignored rather than failing the stream: the replica is only
// a missed hit, and the periodic snapshot resync repairs it.
func (ix *Index) Apply(ev *kvevent.Event, mode Mode) error {
	ix.gen++
	switch ev.Kind {
	case kvevent.BlockStored:
		_, err := ix.applyStored(ev, nil, mode, 0)
		return err
	case kvevent.BlockRemoved:
		return ix.applyRemoved(ev)
	case kvevent.AllBlocksCleared:
		ix.Clear()
		return nil
	}
	return fmt.Errorf("kvindex: event kind %d: %w", ev.Kind, ErrEvent)
}

// tierOf returns the tier bit of a served medium and 0 for the others
// (disk, external, unknown), whose replicas are never hits.
func tierOf(m kvevent.Medium) (uint8, error) {
	switch {
	case m.Served():
		return 1 << m, nil
	case m <= kvevent.OtherMedium:
		return 0, nil
	}
	return 0, fmt.Errorf("kvindex: medium %d: %w", m, ErrEvent)
}

// ApplyRun applies the leading events of evs as Apply applies each, one
// after another, and returns how many it applied; when one fails, it is
// evs[n], and the events before it are applied. It applies at least one
// event, and joins to a plain-text stored event the ones after it that
// continue its run: stored events of plain text on its tier, each one's
// parent the last block of the one before, up to the one that brings the
// run to maxBlocks blocks. A run's blocks are fetched and keyed in chunks
// across its events, as one event's are: SGLang sends every store as
// events of one page each, each the child of the one before, and an
// event of one block costs mostly what every event costs. It stops after
// an event that may have taken a tier away from a key (an observer call
// with dropped true: a block stored again with other content), so that
// the caller can show that change before the next event applies.
//
// Removals join too: a BlockRemoved and the BlockRemoved events on its
// medium after it, up to the one that brings them to maxBlocks blocks,
// are one step, as one event naming all their blocks would be (SGLang
// sends a removal a page). Their drops are then shown together once the
// run is applied, no later than a removal of as many blocks in one event.
func (ix *Index) ApplyRun(evs []kvevent.Event, mode Mode, maxBlocks int) (int, error) {
	if len(evs) == 0 {
		return 0, nil
	}
	if evs[0].Kind == kvevent.BlockRemoved {
		return ix.applyRemovedRun(evs, maxBlocks)
	}
	if evs[0].Kind != kvevent.BlockStored {
		if err := ix.Apply(&evs[0], mode); err != nil {
			return 0, err
		}
		return 1, nil
	}
	ix.gen++
	return ix.applyStored(&evs[0], evs[1:], mode, maxBlocks)
}

// applyStored applies stored event ev and the events of more that join
// its run (see ApplyRun; none when maxBlocks is at most ev's blocks),
// and returns how many events it applied, ev included.
func (ix *Index) applyStored(ev *kvevent.Event, more []kvevent.Event, mode Mode, maxBlocks int) (int, error) {
	if !ev.PlainText {
		ix.stats.NonPlainBlocks += uint64(len(ev.BlockHashes))
		return 1, nil
	}
	tier, err := tierOf(ev.Medium)
	if err != nil {
		return 0, err
	}
	if tier == 0 {
		ix.stats.UnservedBlocks += uint64(len(ev.BlockHashes))
		if len(ev.TokenIDs) == 0 {
			return 1, nil // a copy of known blocks on a tier with no hits
		}
	}
	if len(ev.TokenIDs) == 0 {
		ix.warmEntries(ev.BlockHashes)
		for _, h := range ev.BlockHashes {
			if s, ok := ix.findEngine(h); ok {
				ix.setTier(s, tier)
			} else {
				ix.stats.UnresolvedReplicas++
			}
		}
		return 1, nil
	}
	bs := ix.cfg.BlockSize
	if ev.BlockSize != bs {
		return 0, fmt.Errorf("kvindex: stored event has block size %d, index has %d: %w", ev.BlockSize, bs, ErrBlockSize)
	}
	if len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		return 0, fmt.Errorf("kvindex: stored event has %d tokens for %d blocks of %d: %w",
			len(ev.TokenIDs), len(ev.BlockHashes), bs, ErrTokenCount)
	}
	var parent Key
	hasParent := false
	if ev.HasParent {
		s, ok := ix.findEngine(ev.ParentHash)
		switch {
		case !ok && mode == Delta:
			return 0, fmt.Errorf("kvindex: parent %v of %d stored blocks: %w", ev.ParentHash, len(ev.BlockHashes), ErrUnknownParent)
		case !ok || ix.meta[s]&flagUnkeyed != 0:
			// A known orphan's child is no lost event, even live.
			if err := ix.storeOrphans(ev.BlockHashes, tier); err != nil {
				return 0, err
			}
			return 1, nil
		}
		parent, hasParent = ix.entries[s].key, true
	}
	if tier == 0 {
		more = nil // unserved blocks count per event (UnservedBlocks)
	}
	return ix.storeRun(ev, more[:joining(ev, more, maxBlocks)], parent, hasParent, tier)
}

// joining returns how many events at the start of more continue the run
// of checked stored event ev: plain-text stored events on its medium,
// with its block size and as many blocks of tokens as hashes, each one's
// parent the last block of the one before, up to the one that brings the
// run to maxBlocks blocks. Each of them is then applied as ev is once the
// one before is: its parent, just stored, has the key the chain gives it.
func joining(ev *kvevent.Event, more []kvevent.Event, maxBlocks int) int {
	blocks, last := len(ev.BlockHashes), ev.BlockHashes[len(ev.BlockHashes)-1]
	n := 0
	for ; n < len(more) && blocks < maxBlocks; n++ {
		e := &more[n]
		if e.Kind != kvevent.BlockStored || !e.PlainText || e.Medium != ev.Medium || e.BlockSize != ev.BlockSize ||
			len(e.BlockHashes) == 0 || len(e.TokenIDs) != len(e.BlockHashes)*ev.BlockSize ||
			!e.HasParent || e.ParentHash != last {
			break
		}
		blocks, last = blocks+len(e.BlockHashes), e.BlockHashes[len(e.BlockHashes)-1]
	}
	return n
}

// storeRun stores the blocks of ev and then of the events of more, the
// chain that continues parent, and returns how many events it applied.
// Blocks go in chunks across events: the table cells a chunk will probe
// are fetched up front (see warmEngine) so that their cache misses
// overlap each other and the hashing, instead of stalling every block in
// turn. The keys of a chunk are computed before its blocks are stored,
// which changes nothing: a key depends on the tokens and the chain alone.
// A store that fails ends the run at its event; one that may have taken
// a tier away from a key ends it after its event.
func (ix *Index) storeRun(ev *kvevent.Event, more []kvevent.Event, parent Key, hasParent bool, tier uint8) (int, error) {
	bs := ix.cfg.BlockSize
	event := func(i int) *kvevent.Event { // event i of the run
		if i == 0 {
			return ev
		}
		return &more[i-1]
	}
	var (
		hashes [chunkBlocks]kvevent.EngineHash
		// block j of the chunk is block blk[j] of event evt[j]
		evt, blk [chunkBlocks]int
	)
	drops := ix.drops
	e, b := 0, 0 // the next block to take: block b of event e
	for e <= len(more) {
		n := 0
		for ; n < chunkBlocks && e <= len(more); n++ {
			cur := event(e)
			hashes[n], evt[n], blk[n] = cur.BlockHashes[b], e, b
			if b++; b == len(cur.BlockHashes) {
				e, b = e+1, 0
			}
		}
		keys := ix.chunk[:n]
		ix.warmEngine(hashes[:n])
		ix.warmGhosts(n)
		for j := range keys {
			keys[j] = ix.hasher.BlockKey(parent, hasParent, event(evt[j]).TokenIDs[blk[j]*bs:(blk[j]+1)*bs])
			parent, hasParent = keys[j], true
		}
		for j := range n {
			if blk[j] == 0 && evt[j] > 0 && ix.drops != drops {
				return evt[j], nil
			}
			if err := ix.store(hashes[j], keys[j], tier); err != nil {
				return evt[j], fmt.Errorf("kvindex: stored block %d of %d (hash %v): %w", blk[j], len(event(evt[j]).BlockHashes), hashes[j], err)
			}
		}
	}
	return 1 + len(more), nil
}

// chunkBlocks is how many blocks storeRun fetches and keys at once.
const chunkBlocks = 16

func (ix *Index) applyRemoved(ev *kvevent.Event) error {
	tier, err := tierOf(ev.Medium)
	if err != nil || tier == 0 {
		return err
	}
	ix.warmEntries(ev.BlockHashes)
	ix.remove(ev.BlockHashes, tier)
	return nil
}

// remove drops tier from the blocks of hashes.
func (ix *Index) remove(hashes []kvevent.EngineHash, tier uint8) {
	for _, h := range hashes {
		s, ok := ix.findEngine(h)
		if !ok || !ix.clearTier(s, tier) {
			ix.stats.UnknownRemovals++
		}
	}
}

// applyRemovedRun applies evs[0], a BlockRemoved, and the removals that
// join it (see ApplyRun), and returns how many it applied. The blocks of
// a run of small removals are fetched together, a warmBatch at a time.
func (ix *Index) applyRemovedRun(evs []kvevent.Event, maxBlocks int) (int, error) {
	ix.gen++
	tier, err := tierOf(evs[0].Medium)
	if err != nil {
		return 0, err
	}
	n, blocks := 1, len(evs[0].BlockHashes)
	for n < len(evs) && blocks < maxBlocks && evs[n].Kind == kvevent.BlockRemoved && evs[n].Medium == evs[0].Medium {
		blocks += len(evs[n].BlockHashes)
		n++
	}
	if tier == 0 {
		return n, nil // no replica on a tier without hits is kept
	}
	var hashes [warmBatch]kvevent.EngineHash
	for i := 0; i < n; {
		if hs := evs[i].BlockHashes; len(hs) > len(hashes) {
			// warmEntries takes a large event a batch at a time.
			ix.warmEntries(hs)
			ix.remove(hs, tier)
			i++
			continue
		}
		// Whole events, as many as fill a batch, at least one.
		k := 0
		for ; i < n && k+len(evs[i].BlockHashes) <= len(hashes); i++ {
			k += copy(hashes[k:], evs[i].BlockHashes)
		}
		ix.warmEntries(hashes[:k])
		ix.remove(hashes[:k], tier)
	}
	return n, nil
}

// storeOrphans sets tier on the blocks of hashes, whose parent has no
// content key, creating orphan entries for those it does not know. A
// known entry keeps its key: the engine hash names the content, and the
// key came from a store whose parent was known. Blocks on a tier with no
// hits are not kept: a child of theirs is an orphan either way. It may
// leave the blocks before a failing one stored, like store.
func (ix *Index) storeOrphans(hashes []kvevent.EngineHash, tier uint8) error {
	ix.stats.OrphanBlocks += uint64(len(hashes))
	if tier == 0 {
		return nil
	}
	for i, h := range hashes {
		if s, ok := ix.findEngine(h); ok {
			ix.setTier(s, tier)
			continue
		}
		s, err := ix.allocSlot()
		if err != nil {
			return fmt.Errorf("kvindex: orphan block %d of %d (hash %v): %w", i, len(hashes), h, err)
		}
		ix.entries[s] = entry{engine: h}
		ix.meta[s] = tier | flagUnkeyed
		ix.insertEngine(s)
		ix.addCount(tier, 1)
	}
	return nil
}

// AdoptKeys gives each orphan of ix the content key that from holds for
// the same engine hash, keeping the orphan's own tiers, and returns how
// many it keyed. from must be an index of the same stream (same block
// size and hash seed): an engine hash names the content of its whole
// chain, so a key from knew is the key ix would have computed had it
// known the parent. A full state (a snapshot, a full-state batch) uses
// it, so that one taken while a block's parent was evicted does not
// forget what the view it replaces knew of the block: once the parent is
// stored again, the block is a hit again without being announced again.
func (ix *Index) AdoptKeys(from *Index) int {
	// OrphanBlocks counts every orphan ever stored: none, nothing to scan.
	if from == nil || ix.stats.OrphanBlocks == 0 || from.cfg.BlockSize != ix.cfg.BlockSize || from.cfg.HashSeed != ix.cfg.HashSeed {
		return 0
	}
	ix.gen++
	n := 0
	for s := range ix.entries {
		if ix.meta[s]&flagUnkeyed == 0 {
			continue
		}
		f, ok := from.findEngine(ix.entries[s].engine)
		if !ok || from.meta[f]&flagUnkeyed != 0 {
			continue
		}
		ix.setKey(uint32(s), from.entries[f].key)
		n++
	}
	return n
}

// store maps h to k and sets tier on it, creating the entry if needed.
// Tier 0 (a medium with no hits) only keeps the mapping, as a ghost when
// the entry is new, so that children stored on a served tier resolve. It
// changes nothing when it fails.
func (ix *Index) store(h kvevent.EngineHash, k Key, tier uint8) error {
	if s, ok := ix.findEngine(h); ok {
		if ix.meta[s]&flagUnkeyed != 0 || ix.entries[s].key != k {
			ix.setKey(s, k)
		}
		if tier != 0 {
			ix.setTier(s, tier)
		}
		return nil
	}
	s, err := ix.allocSlot()
	if err != nil {
		return err
	}
	ix.entries[s] = entry{key: k, engine: h}
	ix.meta[s] = tier
	ix.insertEngine(s)
	if tier == 0 {
		ix.pushGhost(s)
	} else {
		ix.notify(s, false)
	}
	ix.addCount(tier, 1)
	return nil
}

// setKey gives slot s content key k, keeping its tiers: an orphan gets
// its first key, or a keyed entry follows the engine reusing its hash for
// other content (for example after a hash seed change). The observer
// learns that the old key, if there was one, is on no tier (another entry
// may still hold it: an under-report), and the tiers of the new.
func (ix *Index) setKey(s uint32, k Key) {
	orphan := ix.meta[s]&flagUnkeyed != 0
	old := ix.entries[s].key
	ix.entries[s].key = k
	ix.meta[s] &^= flagUnkeyed
	if ix.observe != nil && ix.tiers(s) != 0 {
		if !orphan {
			ix.tell(old, false, false, true)
		}
		ix.notify(s, false)
	}
}

// allocSlot returns a slot for a new entry, growing storage or evicting
// the oldest ghost. The returned slot is in no table and no list.
func (ix *Index) allocSlot() (uint32, error) {
	n := len(ix.entries)
	if n < ix.cfg.MaxBlocks {
		if ix.byEngine.needsGrow(n + 1) {
			ix.rebuildTable(n + 1)
		}
		if n == cap(ix.entries) {
			// A quarter more, not double: a resident entry then carries
			// at most a quarter of one in spare capacity. The copies add
			// up to four per entry over a fill, cheap sequential moves.
			ix.growStorage(min(max(n+n/4, 16), ix.cfg.MaxBlocks))
		}
		ix.entries = ix.entries[:n+1]
		ix.meta = ix.meta[:n+1]
		return uint32(n), nil
	}
	s, ok := ix.oldestGhost()
	if !ok {
		return 0, fmt.Errorf("kvindex: %d entries, none a ghost: %w", n, ErrCapacity)
	}
	ix.deleteEngine(s)
	ix.stats.GhostEvictions++
	return s, nil
}

func (ix *Index) growStorage(c int) {
	n := len(ix.entries)
	grown := make([]entry, n, c)
	copy(grown, ix.entries)
	ix.entries = grown
	meta := make([]uint8, n, c)
	copy(meta, ix.meta)
	ix.meta = meta
}

// Reserve makes room for n entries (at most MaxBlocks) at once, so that
// filling the index to n copies and rehashes nothing on the way; grown a
// quarter at a time, a fill copies every entry up to four times and
// rehashes the table at each step. A snapshot reserves what the view it
// replaces held.
func (ix *Index) Reserve(n int) {
	n = min(n, ix.cfg.MaxBlocks)
	if n > cap(ix.entries) {
		ix.growStorage(n)
	}
	if ix.byEngine.needsGrow(n) {
		ix.rebuildTable(n)
	}
}

// Resident returns the number of entries on some tier: Len without the
// ghosts.
func (ix *Index) Resident() int {
	n := 0
	for _, m := range ix.meta {
		if m&(tierDevice|tierHost) != 0 {
			n++
		}
	}
	return n
}

func (ix *Index) addCount(tier uint8, d int) {
	if tier&tierDevice != 0 {
		ix.device += d
	}
	if tier&tierHost != 0 {
		ix.host += d
	}
}

// keyedOnTier reports whether meta byte m is an entry's that a query may
// hit: on a tier, and with a content key (not an orphan).
func keyedOnTier(m uint8) bool { return m&(tierDevice|tierHost) != 0 && m&flagUnkeyed == 0 }

// tiers returns the tier bits of slot s.
func (ix *Index) tiers(s uint32) uint8 { return ix.meta[s] & (tierDevice | tierHost) }

// setTier adds a replica on tier to slot s, reviving it if it was a ghost
// (it stays queued; see ghosts).
func (ix *Index) setTier(s uint32, tier uint8) {
	m := ix.meta[s]
	if m&tier != 0 {
		return
	}
	ix.meta[s] = m | tier
	ix.addCount(tier, 1)
	ix.notify(s, false)
}

// clearTier drops the replica on tier from slot s and reports whether it
// was there. An entry left on neither tier becomes a ghost.
func (ix *Index) clearTier(s uint32, tier uint8) bool {
	m := ix.meta[s]
	if m&tier == 0 {
		return false
	}
	m &^= tier
	ix.meta[s] = m
	ix.addCount(tier, -1)
	if m&(tierDevice|tierHost) == 0 {
		ix.pushGhost(s)
	}
	ix.notify(s, true)
	return true
}

// pushGhost queues slot s, which has just become a ghost, unless it is
// still queued from an earlier time: then it keeps that place, and is
// evicted as early as a ghost of that time would be.
func (ix *Index) pushGhost(s uint32) {
	if ix.meta[s]&flagQueued != 0 {
		return
	}
	ix.meta[s] |= flagQueued
	ix.ghosts.push(s, ix.cfg.MaxBlocks)
}

// oldestGhost takes the oldest queued ghost off the queue, dropping the
// queued slots before it that were revived; ok is false when there is no
// ghost.
func (ix *Index) oldestGhost() (uint32, bool) {
	for {
		s, ok := ix.ghosts.pop()
		if !ok {
			return 0, false
		}
		ix.meta[s] &^= flagQueued
		if ix.tiers(s) == 0 {
			return s, true
		}
	}
}

// slotQueue is a FIFO ring of slots that grows by doubling up to the
// number of slots an index can have.
type slotQueue struct {
	buf     []uint32
	head, n int
}

func (q *slotQueue) reset() { q.head, q.n = 0, 0 }

// push appends s; the queue never holds more than limit slots.
func (q *slotQueue) push(s uint32, limit int) {
	if q.n == len(q.buf) {
		grown := make([]uint32, min(max(2*q.n, 16), limit))
		for i := range q.n {
			grown[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = grown, 0
	}
	i := q.head + q.n
	if i >= len(q.buf) {
		i -= len(q.buf)
	}
	q.buf[i] = s
	q.n++
}

func (q *slotQueue) pop() (uint32, bool) {
	if q.n == 0 {
		return 0, false
	}
	s := q.buf[q.head]
	if q.head++; q.head == len(q.buf) {
		q.head = 0
	}
	q.n--
	return s, true
}

// entryBytes is the size of one entry record.
const entryBytes = int64(unsafe.Sizeof(entry{}))

// StorageBytes is the memory the index's storage holds, by capacity.
func (ix *Index) StorageBytes() int64 {
	return int64(cap(ix.entries))*entryBytes + int64(cap(ix.meta)) + int64(len(ix.ghosts.buf))*4 +
		int64(len(ix.byEngine.cells))*4
}

// MaxStorageBytes bounds what an index of this configuration holds at
// any moment, whatever it is fed: MaxBlocks entries and their meta bytes,
// and while they grow the old storage (smaller) beside the new; a ghost
// queue of MaxBlocks slots, and the old one beside it while it grows; and
// the engine-hash table at the size MaxBlocks entries need. A KeyLookup
// is its caller's, not the index's.
func (c Config) MaxStorageBytes() int64 {
	n := c.MaxBlocks
	if n <= 0 {
		n = DefaultMaxBlocks
	}
	n = min(n, maxSlots)
	return 2*int64(n)*(entryBytes+1) + 2*4*int64(n) + 4*int64(tableSize(n, n))
}
