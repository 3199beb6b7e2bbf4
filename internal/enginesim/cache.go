package enginesim

import (
	"cmp"
	"container/list"
	"encoding/binary"
	"slices"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/zeebo/xxh3"
)

// blockRec is one block the engine knows, resident on at least one tier.
type blockRec struct {
	hash      kvevent.EngineHash
	parent    kvevent.EngineHash
	hasParent bool
	tokens    []uint32
	// born orders blocks for a deterministic snapshot.
	born uint64
	// order is the block's place in birth order, scratch for ordered.
	order int32

	dev  *list.Element // in cache.device while on Device
	host *list.Element // in cache.host while on Host
}

// cache is one DP rank's block cache: two LRU tiers over one block table.
// It is owned by the rank goroutine. Mutations append the events the
// engine would announce to the batch under construction.
type cache struct {
	blockSize  int
	devCap     int
	hostCap    int
	seed       uint64
	blocks     map[kvevent.EngineHash]*blockRec
	device     *list.List // front = most recently used
	host       *list.List
	born       uint64
	hashBuf    []byte
	wrongBlock bool // announce a block_size that is not the real one
}

func newCache(blockSize, devCap, hostCap int, seed uint64) *cache {
	return &cache{
		blockSize: blockSize,
		devCap:    devCap,
		hostCap:   hostCap,
		seed:      seed,
		blocks:    make(map[kvevent.EngineHash]*blockRec),
		device:    list.New(),
		host:      list.New(),
	}
}

// chainHashes computes the engine's own 64-bit block hashes for the full
// blocks of tokens: each is a seeded XXH3-64 over the parent hash and the
// block's tokens, so equal prefixes give equal hashes. kvcar must never
// rely on this being its content key.
func (c *cache) chainHashes(tokens []uint32) []kvevent.EngineHash {
	n := len(tokens) / c.blockSize
	out := make([]kvevent.EngineHash, n)
	var parent kvevent.EngineHash
	for i := 0; i < n; i++ {
		b := c.hashBuf[:0]
		if i > 0 {
			b = binary.BigEndian.AppendUint64(b, parent.Lo)
		}
		for _, t := range tokens[i*c.blockSize : (i+1)*c.blockSize] {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		c.hashBuf = b
		parent = kvevent.IntHash(xxh3.HashSeed(b, c.seed))
		out[i] = parent
	}
	return out
}

func (c *cache) blockTokens(tokens []uint32, i int) []uint32 {
	return tokens[i*c.blockSize : (i+1)*c.blockSize]
}

// addStored appends a BlockStored with tokens. Under the wrong block size
// fault the event stays well formed but claims blocks twice as long, each
// block's tokens sent twice, so only the block_size check can catch it.
func (c *cache) addStored(b *kvevent.Batch, hashes []kvevent.EngineHash, parent kvevent.EngineHash, hasParent bool, tokens []uint32, m kvevent.Medium) {
	if !c.wrongBlock {
		b.AddStored(hashes, parent, hasParent, tokens, c.blockSize, m)
		return
	}
	doubled := make([]uint32, 0, 2*len(tokens))
	for i := 0; i+c.blockSize <= len(tokens); i += c.blockSize {
		blk := tokens[i : i+c.blockSize]
		doubled = append(append(doubled, blk...), blk...)
	}
	b.AddStored(hashes, parent, hasParent, doubled, 2*c.blockSize, m)
}

// oracle reports the contiguous reusable prefix without touching state.
func (c *cache) oracle(tokens []uint32) (deviceTokens, hostOnlyTokens int) {
	for _, h := range c.chainHashes(tokens) {
		r := c.blocks[h]
		switch {
		case r == nil:
			return
		case r.dev != nil:
			deviceTokens += c.blockSize
		case r.host != nil:
			hostOnlyTokens += c.blockSize
		default:
			return
		}
	}
	return
}

// run collects consecutive blocks that become resident on one tier so
// they go out as a single BlockStored, parent first.
type run struct {
	hashes    []kvevent.EngineHash
	tokens    []uint32
	parent    kvevent.EngineHash
	hasParent bool
}

func (c *cache) flush(b *kvevent.Batch, r *run, m kvevent.Medium) {
	if len(r.hashes) == 0 {
		return
	}
	c.addStored(b, r.hashes, r.parent, r.hasParent, r.tokens, m)
	// The batch copied what it was given: the next run reuses the
	// storage.
	*r = run{hashes: r.hashes[:0], tokens: r.tokens[:0]}
}

// prefill serves one prompt the way a prefix-caching engine does: reuse
// the contiguous cached prefix (loading Host-only blocks back to Device),
// compute and store the rest, and evict least recently used blocks that
// are not part of this prompt when a tier is full.
func (c *cache) prefill(tokens []uint32, b *kvevent.Batch) (deviceHit, hostHit int) {
	hashes := c.chainHashes(tokens)
	pinned := make(map[kvevent.EngineHash]struct{}, len(hashes))
	for _, h := range hashes {
		pinned[h] = struct{}{}
	}

	var loaded, fresh run
	i := 0
	// Reused prefix.
	for ; i < len(hashes); i++ {
		r := c.blocks[hashes[i]]
		if r == nil {
			break
		}
		if r.dev != nil {
			c.flush(b, &loaded, kvevent.Device)
			deviceHit += c.blockSize
			continue
		}
		if r.host == nil {
			break
		}
		hostHit += c.blockSize
		if !c.makeDeviceRoom(pinned, b) {
			// No room to load it: the rest is computed without caching.
			c.flush(b, &loaded, kvevent.Device)
			c.touch(hashes[:i])
			return
		}
		r.dev = c.device.PushFront(r)
		if len(loaded.hashes) == 0 {
			loaded.parent, loaded.hasParent = c.parentOf(hashes, i)
		}
		loaded.hashes = append(loaded.hashes, r.hash)
		loaded.tokens = append(loaded.tokens, r.tokens...)
	}
	c.flush(b, &loaded, kvevent.Device)

	// Computed suffix.
	stored := i
	for ; i < len(hashes); i++ {
		r := c.blocks[hashes[i]]
		if (r == nil || r.dev == nil) && !c.makeDeviceRoom(pinned, b) {
			break
		}
		parent, hasParent := c.parentOf(hashes, i)
		if r == nil {
			r = c.newRec(hashes[i], parent, hasParent, c.blockTokens(tokens, i))
		} else {
			// A suffix block survived its evicted parent: relink it.
			r.parent, r.hasParent = parent, hasParent
		}
		if r.dev == nil {
			r.dev = c.device.PushFront(r)
		}
		if len(fresh.hashes) == 0 {
			fresh.parent, fresh.hasParent = parent, hasParent
		}
		fresh.hashes = append(fresh.hashes, r.hash)
		fresh.tokens = append(fresh.tokens, r.tokens...)
		stored = i + 1
	}
	c.flush(b, &fresh, kvevent.Device)
	c.touch(hashes[:stored])
	return deviceHit, hostHit
}

func (c *cache) parentOf(hashes []kvevent.EngineHash, i int) (kvevent.EngineHash, bool) {
	if i == 0 {
		return kvevent.EngineHash{}, false
	}
	return hashes[i-1], true
}

func (c *cache) newRec(h, parent kvevent.EngineHash, hasParent bool, tokens []uint32) *blockRec {
	c.born++
	r := &blockRec{hash: h, parent: parent, hasParent: hasParent, tokens: slices.Clone(tokens), born: c.born}
	c.blocks[h] = r
	return r
}

// touch marks a prompt's Device blocks as most recently used, deepest
// first, so that the root ends up freshest and the LRU tail holds leaves:
// an engine frees a request's blocks in reverse so suffixes go first.
func (c *cache) touch(hashes []kvevent.EngineHash) {
	for i := len(hashes) - 1; i >= 0; i-- {
		if r := c.blocks[hashes[i]]; r != nil && r.dev != nil {
			c.device.MoveToFront(r.dev)
		}
	}
}

// makeDeviceRoom evicts the least recently used unpinned Device block
// when Device is full, offloading it to Host when Host is enabled. It
// reports false when every Device block is pinned.
func (c *cache) makeDeviceRoom(pinned map[kvevent.EngineHash]struct{}, b *kvevent.Batch) bool {
	if c.device.Len() < c.devCap {
		return true
	}
	victim := lruVictim(c.device, pinned)
	if victim == nil {
		return false
	}
	if c.hostCap > 0 && victim.host == nil && c.makeHostRoom(pinned, b) {
		victim.host = c.host.PushFront(victim)
		// A Host copy is announced by hash only; the subscriber resolves
		// it through the Device copy it already knows (WIRE.md).
		b.AddStored([]kvevent.EngineHash{victim.hash}, kvevent.EngineHash{}, false, nil, 0, kvevent.Host)
	}
	c.device.Remove(victim.dev)
	victim.dev = nil
	b.AddRemoved([]kvevent.EngineHash{victim.hash}, kvevent.Device)
	c.forgetIfGone(victim)
	return true
}

func (c *cache) makeHostRoom(pinned map[kvevent.EngineHash]struct{}, b *kvevent.Batch) bool {
	if c.host.Len() < c.hostCap {
		return true
	}
	victim := lruVictim(c.host, pinned)
	if victim == nil {
		return false
	}
	c.host.Remove(victim.host)
	victim.host = nil
	b.AddRemoved([]kvevent.EngineHash{victim.hash}, kvevent.Host)
	c.forgetIfGone(victim)
	return true
}

func lruVictim(l *list.List, pinned map[kvevent.EngineHash]struct{}) *blockRec {
	for e := l.Back(); e != nil; e = e.Prev() {
		r := e.Value.(*blockRec)
		if _, ok := pinned[r.hash]; !ok {
			return r
		}
	}
	return nil
}

func (c *cache) forgetIfGone(r *blockRec) {
	if r.dev == nil && r.host == nil {
		delete(c.blocks, r.hash)
	}
}

// storeChain places the full blocks of tokens, as one chain from the root,
// on tier m and announces them as one BlockStored with tokens. Blocks
// that do not fit (every resident block of the tier is in the chain) are
// left out. It returns the hashes of the whole chain.
func (c *cache) storeChain(tokens []uint32, m kvevent.Medium, b *kvevent.Batch) []kvevent.EngineHash {
	hashes := c.chainHashes(tokens)
	pinned := make(map[kvevent.EngineHash]struct{}, len(hashes))
	for _, h := range hashes {
		pinned[h] = struct{}{}
	}
	var out run
	stored := 0
	for i, h := range hashes {
		parent, hasParent := c.parentOf(hashes, i)
		r := c.blocks[h]
		if m == kvevent.Host {
			if c.hostCap == 0 || (r == nil || r.host == nil) && !c.makeHostRoom(pinned, b) {
				break
			}
		} else if (r == nil || r.dev == nil) && !c.makeDeviceRoom(pinned, b) {
			break
		}
		if r = c.blocks[h]; r == nil {
			r = c.newRec(h, parent, hasParent, c.blockTokens(tokens, i))
		} else {
			r.parent, r.hasParent = parent, hasParent
		}
		if m == kvevent.Host {
			if r.host == nil {
				r.host = c.host.PushFront(r)
			}
		} else if r.dev == nil {
			r.dev = c.device.PushFront(r)
		}
		out.hashes = append(out.hashes, h)
		out.tokens = append(out.tokens, r.tokens...)
		stored = i + 1
	}
	c.flush(b, &out, m)
	if m == kvevent.Host {
		for i := stored - 1; i >= 0; i-- {
			c.host.MoveToFront(c.blocks[hashes[i]].host)
		}
	} else {
		c.touch(hashes[:stored])
	}
	return hashes
}

// remove drops the tier-m copies of hashes and announces the ones that
// were resident.
func (c *cache) remove(hashes []kvevent.EngineHash, m kvevent.Medium, b *kvevent.Batch) {
	var gone []kvevent.EngineHash
	for _, h := range hashes {
		r := c.blocks[h]
		if r == nil {
			continue
		}
		if m == kvevent.Host && r.host != nil {
			c.host.Remove(r.host)
			r.host = nil
		} else if m == kvevent.Device && r.dev != nil {
			c.device.Remove(r.dev)
			r.dev = nil
		} else {
			continue
		}
		gone = append(gone, h)
		c.forgetIfGone(r)
	}
	if len(gone) > 0 {
		b.AddRemoved(gone, m)
	}
}

func (c *cache) clear(b *kvevent.Batch) {
	clear(c.blocks)
	c.device.Init()
	c.host.Init()
	b.AddCleared()
}

// ordered returns the resident blocks parent first: a depth-first walk of
// the forest whose roots are blocks without a resident parent (true roots
// and orphans), siblings in the order they were first stored. The forest
// is laid out in flat arrays indexed by birth order rather than in a map
// of child lists: a 262,144-block snapshot is ordered in one sort and one
// lookup per block.
func (c *cache) ordered() []*blockRec {
	byBirth := make([]*blockRec, 0, len(c.blocks))
	for _, r := range c.blocks {
		byBirth = append(byBirth, r)
	}
	slices.SortFunc(byBirth, func(a, b *blockRec) int { return cmp.Compare(a.born, b.born) })
	for i, r := range byBirth {
		r.order = int32(i)
	}
	// parentOf[i] is the birth index of block i's resident parent, -1 for
	// a root; children of i are firstChild[i]..firstChild[i+1] in kids,
	// in birth order because i is visited in birth order.
	parentOf := make([]int32, len(byBirth))
	firstChild := make([]int32, len(byBirth)+1)
	for i, r := range byBirth {
		parentOf[i] = -1
		if r.hasParent {
			if p := c.blocks[r.parent]; p != nil {
				parentOf[i] = p.order
				firstChild[parentOf[i]+1]++
			}
		}
	}
	for i := range byBirth {
		firstChild[i+1] += firstChild[i]
	}
	kids := make([]int32, firstChild[len(byBirth)])
	fill := slices.Clone(firstChild[:len(byBirth)])
	for i, p := range parentOf {
		if p >= 0 {
			kids[fill[p]] = int32(i)
			fill[p]++
		}
	}
	out := make([]*blockRec, 0, len(byBirth))
	stack := make([]int32, 0, 64)
	for root, p := range parentOf {
		if p >= 0 {
			continue
		}
		stack = append(stack[:0], int32(root))
		for len(stack) > 0 {
			i := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			out = append(out, byBirth[i])
			for k := firstChild[i+1] - 1; k >= firstChild[i]; k-- {
				stack = append(stack, kids[k])
			}
		}
	}
	return out
}
