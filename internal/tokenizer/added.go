package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         uint32
	content    string
	special    bool
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
}

// addedMatcher finds added tokens in text with the semantics of the
// tokenizers library's AddedVocabulary: non-overlapping matches, each the
// leftmost and then the longest one (Aho-Corasick LeftmostLongest), with
// single_word, lstrip and rstrip applied to each match. A byte trie gives
// the longest token at a position in time bounded by the longest token,
// whatever the number of tokens (Gemma's files carry thousands).
type addedMatcher struct {
	tokens []addedToken
	// nodes[0] is the root. A node's edges are sorted by byte.
	nodes []trieNode
	// first marks the bytes that start some token, for a quick skip.
	first [256]bool
}

type trieNode struct {
	edges []trieEdge
	token int32 // index into tokens of the token ending here, or -1
}

type trieEdge struct {
	b    byte
	next int32
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens, nodes: []trieNode{{token: -1}}}
	for i, t := range tokens {
		if t.content == "" {
			continue
		}
		m.first[t.content[0]] = true
		n := int32(0)
		for k := 0; k < len(t.content); k++ {
			n = m.child(n, t.content[k])
		}
		// The library keeps the first of two tokens with the same content.
		if m.nodes[n].token < 0 {
			m.nodes[n].token = int32(i)
		}
	}
	return m
}

// child returns the node under n for byte c, adding it if missing.
func (m *addedMatcher) child(n int32, c byte) int32 {
	edges := m.nodes[n].edges
	k := sort.Search(len(edges), func(i int) bool { return edges[i].b >= c })
	if k < len(edges) && edges[k].b == c {
		return edges[k].next
	}
	id := int32(len(m.nodes))
	m.nodes = append(m.nodes, trieNode{token: -1})
	edges = append(edges, trieEdge{})
	copy(edges[k+1:], edges[k:])
	edges[k] = trieEdge{b: c, next: id}
	m.nodes[n].edges = edges
	return id
}

func (m *addedMatcher) empty() bool { return m == nil || len(m.tokens) == 0 }

// longestAt returns the longest token matching s at i, or -1.
func (m *addedMatcher) longestAt(s string, i int) int {
	if !m.first[s[i]] {
		return -1
	}
	best, n := -1, int32(0)
	for k := i; k < len(s); k++ {
		edges := m.nodes[n].edges
		c := s[k]
		lo, hi := 0, len(edges)
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if edges[mid].b < c {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo == len(edges) || edges[lo].b != c {
			break
		}
		n = edges[lo].next
		if t := m.nodes[n].token; t >= 0 {
			best = int(t)
		}
	}
	return best
}

// isWordChar is the \w class of Rust's regex crate (Alphabetic, M, Nd, Pc,
// Join_Control), which decides single_word boundaries.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		r == 0x200C || r == 0x200D
}

// split calls text(seg, off) for each stretch of s that is not an added
// token and token(id) for each added token, in order. off is the byte
// offset of seg in s.
func (m *addedMatcher) split(s string, text func(seg string, off int), token func(id uint32)) {
	if m.empty() {
		if s != "" {
			text(s, 0)
		}
		return
	}
	emitted := 0 // end of what has been handed out so far
	for i := 0; i < len(s); {
		k := m.longestAt(s, i)
		if k < 0 {
			i++
			continue
		}
		t := &m.tokens[k]
		start, stop := i, i+len(t.content)
		// The automaton resumes after the raw match whatever happens to it.
		i = stop
		if t.singleWord {
			before, _ := utf8.DecodeLastRuneInString(s[:start])
			after, _ := utf8.DecodeRuneInString(s[stop:])
			if (start > 0 && isWordChar(before)) || (stop < len(s) && isWordChar(after)) {
				continue
			}
		}
		if t.lstrip {
			j := start
			for j > emitted {
				r, n := utf8.DecodeLastRuneInString(s[:j])
				if !unicode.IsSpace(r) {
					break
				}
				j -= n
			}
			start = j
		}
		if t.rstrip {
			for stop < len(s) {
				r, n := utf8.DecodeRuneInString(s[stop:])
				if !unicode.IsSpace(r) {
					break
				}
				stop += n
			}
		}
		if start < emitted {
			// Overlaps whitespace an earlier rstrip already took.
			continue
		}
		if start > emitted {
			text(s[emitted:start], emitted)
		}
		token(t.id)
		emitted = stop
		if i < stop {
			i = stop
		}
	}
	if emitted < len(s) {
		text(s[emitted:], emitted)
	}
}
