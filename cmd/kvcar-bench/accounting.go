package main

// prefixLRU models one engine rank's Device cache at the trace's block
// granularity, with the emulated engine's rules (enginesim's cache
// without a Host tier): a prompt reuses its contiguous cached prefix,
// computes and stores the rest, evicting the least recently used block
// that is not part of the prompt when full, then marks its blocks used
// deepest first so the root is the freshest. Blocks are named by chain
// keys (chainKeys), the way the engine names them by hashing the parent
// and the block's tokens, so equal keys mean equal prefixes.
//
// The bounds of the trace replay (one unbounded cache; one cache with
// every engine's capacity) and the reuse cross-check come from this
// model; TestPrefixLRUMatchesEngine checks it against a real emulated
// engine fed the expanded token ids.
type prefixLRU struct {
	// capacity in blocks; 0 is unbounded.
	capacity int
	nodes    map[uint64]*lruNode
	// head.next is the most recently used, head.prev the least.
	head lruNode
}

type lruNode struct {
	key        uint64
	prev, next *lruNode
}

func newPrefixLRU(capacity int) *prefixLRU {
	c := &prefixLRU{capacity: capacity, nodes: make(map[uint64]*lruNode)}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

func (c *prefixLRU) unlink(n *lruNode) {
	n.prev.next, n.next.prev = n.next, n.prev
}

func (c *prefixLRU) pushFront(n *lruNode) {
	n.prev, n.next = &c.head, c.head.next
	c.head.next.prev = n
	c.head.next = n
}

// resident reports how many blocks the cache holds.
func (c *prefixLRU) resident() int { return len(c.nodes) }

// hit is the number of leading keys the cache holds, without touching
// anything.
func (c *prefixLRU) hit(keys []uint64) int {
	for i, k := range keys {
		if c.nodes[k] == nil {
			return i
		}
	}
	return len(keys)
}

// serve runs one prompt of full blocks keys through the cache and
// returns how many of its leading blocks were reused.
func (c *prefixLRU) serve(keys []uint64) int {
	hit := c.hit(keys)
	stored := hit
	for i := hit; i < len(keys); i++ {
		if c.nodes[keys[i]] != nil {
			// A suffix block that outlived its evicted parent: kept, not
			// reused (the prefix broke before it).
			stored = i + 1
			continue
		}
		if !c.makeRoom(keys) {
			break
		}
		n := &lruNode{key: keys[i]}
		c.nodes[keys[i]] = n
		c.pushFront(n)
		stored = i + 1
	}
	for i := stored - 1; i >= 0; i-- {
		if n := c.nodes[keys[i]]; n != nil {
			c.unlink(n)
			c.pushFront(n)
		}
	}
	return hit
}

// makeRoom evicts the least recently used block that is not one of the
// prompt's when the cache is full; it reports false when every resident
// block is the prompt's.
func (c *prefixLRU) makeRoom(prompt []uint64) bool {
	if c.capacity <= 0 || len(c.nodes) < c.capacity {
		return true
	}
	for n := c.head.prev; n != &c.head; n = n.prev {
		if !contains(prompt, n.key) {
			c.unlink(n)
			delete(c.nodes, n.key)
			return true
		}
	}
	return false
}

// contains is linear: a victim is almost always found at the first try,
// as the prompt's blocks were all just used.
func contains(keys []uint64, k uint64) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// chainKeys appends the chain keys of the request's first n blocks: key
// i mixes key i−1 with hash id i, so a key names the whole prefix up to
// its block, as the trace defines reuse (equal ids at the same
// position after equal ids).
func chainKeys(dst []uint64, r *traceRequest, n int) []uint64 {
	var k uint64
	for _, id := range r.HashIDs[:n] {
		k = splitmix64(k*0x100000001b3 ^ splitmix64(id))
		dst = append(dst, k)
	}
	return dst
}

// reuse is what a cache model saved over a sequence of requests.
type reuse struct {
	Requests    int   `json:"requests"`
	InputTokens int64 `json:"input_tokens"`
	// SavedTokens are full 512-token blocks reused, in tokens: what an
	// engine that caches whole blocks can skip.
	SavedTokens int64 `json:"saved_tokens"`
	// Blocks and HitBlocks count every hash id, the partial last block
	// included, the way the trace's README counts its cross-check
	// figures.
	Blocks    int64 `json:"blocks"`
	HitBlocks int64 `json:"hit_blocks"`
}

func (r reuse) savedPct() float64 { return pct(r.SavedTokens, r.InputTokens) }
func (r reuse) blockPct() float64 { return pct(r.HitBlocks, r.Blocks) }

// sharedReuse serves every request, in order, from one cache of capacity
// blocks (0: unbounded): the shared-unbounded bound and the
// pooled-capacity reference. A partial last block counts as a hit block
// when the whole prefix before it was reused and an earlier request had
// the same prefix ending in that id (the cross-check's rule); it never
// counts as saved tokens, since no engine caches a partial block.
func sharedReuse(reqs []traceRequest, capacity int) reuse {
	c := newPrefixLRU(capacity)
	partial := make(map[uint64]struct{})
	var out reuse
	var keys []uint64
	for i := range reqs {
		r := &reqs[i]
		full := r.fullBlocks()
		keys = chainKeys(keys[:0], r, len(r.HashIDs))
		hit := c.serve(keys[:full])
		out.Requests++
		out.InputTokens += int64(r.Input)
		out.SavedTokens += int64(hit) * TraceBlockTokens
		out.Blocks += int64(len(r.HashIDs))
		out.HitBlocks += int64(hit)
		if full < len(keys) {
			// The trace never reuses a prefix first seen as a partial
			// block as a full one, so full-block keys need no set here.
			last := keys[full]
			if _, seen := partial[last]; seen && hit == full {
				out.HitBlocks++
			}
			partial[last] = struct{}{}
		}
	}
	return out
}
