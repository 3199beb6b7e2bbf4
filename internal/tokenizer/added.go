package tokenizer

import (
	"sort"
	"strings"
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
// single_word, lstrip and rstrip applied to each match. Candidates are
// bucketed by first byte and tried longest first, which gives the same
// answer as the automaton for the few hundred tokens models carry.
type addedMatcher struct {
	tokens  []addedToken
	byFirst [256][]int32 // indices into tokens, longest content first
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens}
	for i, t := range tokens {
		if t.content == "" {
			continue
		}
		c := t.content[0]
		m.byFirst[c] = append(m.byFirst[c], int32(i))
	}
	for c := range m.byFirst {
		b := m.byFirst[c]
		sort.SliceStable(b, func(i, j int) bool {
			return len(tokens[b[i]].content) > len(tokens[b[j]].content)
		})
	}
	return m
}

func (m *addedMatcher) empty() bool { return m == nil || len(m.tokens) == 0 }

// longestAt returns the longest token matching s at i, or -1.
func (m *addedMatcher) longestAt(s string, i int) int {
	for _, k := range m.byFirst[s[i]] {
		if strings.HasPrefix(s[i:], m.tokens[k].content) {
			return int(k)
		}
	}
	return -1
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
