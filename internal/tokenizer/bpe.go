package tokenizer

import (
	"math"
	"unicode/utf8"
)

// mergeRule is one line of model.merges: joining the pair gives token id,
// and rank is the line number (lower merges first).
type mergeRule struct {
	rank uint32
	id   uint32
}

// noMerge marks an adjacent pair that has no merge rule.
const noMerge = math.MaxUint64

// smallWord is the longest word merged with the quadratic scan; longer words
// (long runs of whitespace or punctuation, or whole SentencePiece segments)
// use the heap so that adversarial input stays O(n log n).
const smallWord = 48

// bpeModel is model.type "BPE" after loading. Symbols and merges work on
// token ids; the text keys of words are what the pre-tokenizer hands over:
// the raw bytes for byte-level models (the vocabulary's GPT-2 spelling is
// undone at load time, so encoding never spells text in that alphabet) and
// the vocabulary's own spelling otherwise.
type bpeModel struct {
	byteLevel bool
	// words maps a whole word to its id. It serves ignore_merges and, for
	// SentencePiece-style models, the lookup of single characters.
	words map[string]uint32
	// unit is the id of each single byte for byte-level models, -1 if the
	// vocabulary lacks it.
	unit   [256]int64
	merges map[uint64]mergeRule

	ignoreMerges bool
	byteFallback bool
	// fallback holds the ids of the <0xXX> tokens, -1 where missing.
	fallback [256]int64
	unk      int64 // -1: no unk_token
	fuseUnk  bool
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// pairRank packs the merge of (a, b) as rank<<32|id so that comparing packed
// values compares ranks; two pairs with equal rank are the same rule.
func (m *bpeModel) pairRank(a, b uint32) uint64 {
	r, ok := m.merges[pairKey(a, b)]
	if !ok {
		return noMerge
	}
	return uint64(r.rank)<<32 | uint64(r.id)
}

// encodeWord appends the ids of one pre-tokenized word to dst. A long
// word's merging ends early, leaving ids that mean nothing, once c sees
// the caller's context end; the caller then discards them.
func (m *bpeModel) encodeWord(w string, dst []uint32, c *canceller) []uint32 {
	if w == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.words[w]; ok {
			return append(dst, id)
		}
	}
	start := len(dst)
	dst = m.appendSymbols(w, dst)
	n := m.merge(dst[start:], c)
	return dst[:start+n]
}

// appendSymbols appends the initial symbols of w: one per byte for
// byte-level models, one per character otherwise, with byte_fallback and
// unk_token handling as the tokenizers library does it.
func (m *bpeModel) appendSymbols(w string, dst []uint32) []uint32 {
	lastUnk := false
	addUnk := func() {
		if m.unk < 0 {
			return // no unk_token: the tokenizers library drops the unit
		}
		if m.fuseUnk && lastUnk {
			return
		}
		dst = append(dst, uint32(m.unk))
		lastUnk = true
	}
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			if id := m.unit[w[i]]; id >= 0 {
				dst = append(dst, uint32(id))
				lastUnk = false
			} else {
				addUnk()
			}
		}
		return dst
	}
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		unit := w[i : i+n]
		i += n
		if id, ok := m.words[unit]; ok {
			dst = append(dst, id)
			lastUnk = false
			continue
		}
		if m.byteFallback {
			ok := true
			for k := 0; k < len(unit); k++ {
				if m.fallback[unit[k]] < 0 {
					ok = false
					break
				}
			}
			if ok {
				for k := 0; k < len(unit); k++ {
					dst = append(dst, uint32(m.fallback[unit[k]]))
				}
				lastUnk = false
				continue
			}
		}
		addUnk()
	}
	return dst
}

// merge applies merges to sym in place, lowest rank first and leftmost
// among equal ranks, and returns the new length. Only a long word's
// merging looks at c: a short one is bounded work.
func (m *bpeModel) merge(sym []uint32, c *canceller) int {
	n := len(sym)
	if n < 2 {
		return n
	}
	if n > smallWord {
		return m.mergeLong(sym, c)
	}
	var rk [smallWord - 1]uint64
	for i := 0; i+1 < n; i++ {
		rk[i] = m.pairRank(sym[i], sym[i+1])
	}
	for n > 1 {
		best, bi := uint64(noMerge), -1
		for i := 0; i+1 < n; i++ {
			if rk[i] < best {
				best, bi = rk[i], i
			}
		}
		if bi < 0 {
			break
		}
		sym[bi] = uint32(best)
		copy(sym[bi+1:n-1], sym[bi+2:n])
		if bi+1 < n-2 {
			copy(rk[bi+1:n-2], rk[bi+2:n-1])
		}
		n--
		if bi > 0 {
			rk[bi-1] = m.pairRank(sym[bi-1], sym[bi])
		}
		if bi+1 < n {
			rk[bi] = m.pairRank(sym[bi], sym[bi+1])
		}
	}
	return n
}

// heapEntry is a candidate merge of the symbol at pos with its successor;
// left and right record the pair it was computed for, so entries made stale
// by neighbouring merges are recognised and skipped.
type heapEntry struct {
	rank        uint32
	pos         int32
	left, right uint32
	id          uint32
}

func (a heapEntry) less(b heapEntry) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

type mergeHeap []heapEntry

func (h *mergeHeap) push(e heapEntry) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() heapEntry {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].less(s[m]) {
			m = l
		}
		if r < len(s) && s[r].less(s[m]) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// mergeLong is merge for long words: a priority queue of candidate pairs
// over a linked list of symbols, ordered by (rank, position) exactly like
// the quadratic scan. It gives up once c sees the caller's context end.
func (m *bpeModel) mergeLong(sym []uint32, c *canceller) int {
	n := len(sym)
	prev := make([]int32, n)
	next := make([]int32, n)
	dead := make([]bool, n)
	h := make(mergeHeap, 0, n)
	for i := range n {
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	try := func(p, q int32) {
		if r, ok := m.merges[pairKey(sym[p], sym[q])]; ok {
			h.push(heapEntry{rank: r.rank, pos: p, left: sym[p], right: sym[q], id: r.id})
		}
	}
	for i := 0; i+1 < n; i++ {
		if c.stop() {
			return n
		}
		try(int32(i), int32(i+1))
	}
	for len(h) > 0 {
		if c.stop() {
			break
		}
		e := h.pop()
		p := e.pos
		if dead[p] {
			continue
		}
		q := next[p]
		if q < 0 || sym[p] != e.left || sym[q] != e.right {
			continue
		}
		sym[p] = e.id
		dead[q] = true
		next[p] = next[q]
		if next[q] >= 0 {
			prev[next[q]] = p
		}
		if prev[p] >= 0 {
			try(prev[p], p)
		}
		if next[p] >= 0 {
			try(p, next[p])
		}
	}
	k := 0
	for i := 0; i < n; i++ {
		if !dead[i] {
			sym[k] = sym[i]
			k++
		}
	}
	return k
}
