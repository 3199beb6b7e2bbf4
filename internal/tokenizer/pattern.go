package tokenizer

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// splitBehavior says what a split does with the matches of its pattern, as
// the tokenizers library's SplitDelimiterBehavior.
type splitBehavior int

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

var behaviorNames = map[string]splitBehavior{
	"Removed":            behaviorRemoved,
	"Isolated":           behaviorIsolated,
	"MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext":     behaviorMergedWithNext,
	"Contiguous":         behaviorContiguous,
}

// pattern finds the matches of one split or replace pattern. The kinds
// differ only in speed: each reports the matches the tokenizers library
// reports for the same pattern (leftmost first, non-overlapping, an empty
// match right after the previous match skipped).
type pattern struct {
	kind patternKind

	hand matcher         // patternHand
	lit  string          // patternLiteral
	pred func(rune) bool // patternRune

	goRe *regexp.Regexp // patternGo
	// wsGroup > 0 is the capture group of a trailing `\s+` alternative
	// whose `\s+(?!\S)` sibling was taken out for Go's engine.
	wsGroup int

	bt    *regexp2.Regexp // patternBacktrack
	runes *sync.Pool      // of *runeBuf, for patternBacktrack
}

type patternKind int

const (
	// patternHand: one of the hand-written matchers of split.go.
	patternHand patternKind = iota
	// patternLiteral: a String pattern, matched as plain text.
	patternLiteral
	// patternRune: every rune satisfying pred is a match of its own.
	patternRune
	// patternGo: Go's regexp, which for patterns it accepts chooses the
	// same match as a backtracking engine (leftmost-first) in linear time.
	patternGo
	// patternBacktrack: regexp2, a backtracking engine with lookaround,
	// for the patterns Go's regexp cannot express.
	patternBacktrack
)

// runeBuf holds a piece of text as runes and the byte offset of each rune
// (plus one past the end), for regexp2, which works on runes.
type runeBuf struct {
	runes []rune
	offs  []int
}

// sink receives the matches of a pattern in order.
type sink interface {
	match(start, end int)
}

// each reports every match of p in s to out.
func (p *pattern) each(s string, out sink) {
	if s == "" {
		// The library looks for no match in empty text, not even an
		// empty one.
		return
	}
	switch p.kind {
	case patternHand:
		for pos := 0; pos < len(s); {
			end := p.hand(s, pos)
			if end <= pos {
				_, n := runeAt(s, pos)
				pos += n
				continue
			}
			out.match(pos, end)
			pos = end
		}
	case patternLiteral:
		for pos := 0; pos < len(s); {
			k := strings.Index(s[pos:], p.lit)
			if k < 0 {
				break
			}
			out.match(pos+k, pos+k+len(p.lit))
			pos += k + len(p.lit)
		}
	case patternRune:
		for i, r := range s {
			if p.pred(r) {
				out.match(i, i+utf8.RuneLen(r))
			}
		}
	case patternGo:
		p.eachGo(s, out)
	case patternBacktrack:
		p.eachBacktrack(s, out)
	}
}

func (p *pattern) eachGo(s string, out sink) {
	last := -1 // end of the previous match
	for pos := 0; pos <= len(s); {
		// Go-engine patterns have no assertion that looks before pos, so
		// searching the suffix finds what a search from pos would.
		loc := p.goRe.FindStringSubmatchIndex(s[pos:])
		if loc == nil {
			return
		}
		start, end := pos+loc[0], pos+loc[1]
		if p.wsGroup > 0 && loc[2*p.wsGroup] >= 0 {
			end = whitespaceLookahead(s, start, end)
		}
		if start == end {
			if start != last {
				out.match(start, end)
				last = end
			}
			if start >= len(s) {
				return
			}
			_, n := runeAt(s, start)
			pos = start + n
			continue
		}
		out.match(start, end)
		last, pos = end, end
	}
}

// whitespaceLookahead turns the match [start, end) of the plain `\s+`
// alternative into what `\s+(?!\S)|\s+` matches there, given that no earlier
// alternative matched: the run minus its last rune when a non-space follows
// and the run has more than one rune, else the whole run.
func whitespaceLookahead(s string, start, end int) int {
	if end == len(s) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(s[start:end])
	if end-last > start {
		return end - last
	}
	return end
}

func (p *pattern) eachBacktrack(s string, out sink) {
	buf := p.runes.Get().(*runeBuf)
	defer p.runes.Put(buf)
	buf.runes, buf.offs = buf.runes[:0], buf.offs[:0]
	for i, r := range s {
		buf.runes = append(buf.runes, r)
		buf.offs = append(buf.offs, i)
	}
	buf.offs = append(buf.offs, len(s))
	n := len(buf.runes)
	last := -1
	for pos := 0; pos <= n; {
		m, err := p.bt.FindRunesMatchStartingAt(buf.runes, pos)
		if err != nil || m == nil {
			// err is only a match timeout, and none is set.
			return
		}
		start, end := m.Index, m.Index+m.Length
		if start == end {
			if start != last {
				out.match(buf.offs[start], buf.offs[end])
				last = end
			}
			pos = start + 1
			continue
		}
		out.match(buf.offs[start], buf.offs[end])
		last, pos = end, end
	}
}

// cutter turns the matches of a pattern in a piece of text into the pieces
// a split keeps, following the tokenizers library: the text is cut into
// matches and the gaps between them, invert swaps which is which, and the
// behaviour decides what happens to the matches. Kept pieces, empty ones
// dropped, go to the encoder's next pre-tokenizer step. An encoder keeps
// one cutter per step, so splitting allocates nothing.
type cutter struct {
	behavior splitBehavior
	invert   bool

	// Where pieces go: e.pre(step+1, piece of s, ...).
	e       *encoder
	step    int
	s       string
	atStart bool

	prev      int  // end of the last match
	held      bool // a piece is held back because the next may join it
	hs, he    int
	prevMatch bool
}

// reset prepares c to cut s for step i of e.
func (c *cutter) reset(e *encoder, i int, st *preStep, s string, atStart bool) {
	*c = cutter{behavior: st.behavior, invert: st.invert, e: e, step: i, s: s, atStart: atStart}
}

func (c *cutter) match(start, end int) {
	if c.prev != start {
		c.segment(c.prev, start, false)
	}
	c.segment(start, end, true)
	c.prev = end
}

// finish reports the gap after the last match and releases what is held.
func (c *cutter) finish() {
	if c.prev != len(c.s) {
		c.segment(c.prev, len(c.s), false)
	}
	if c.held {
		c.held = false
		c.out(c.hs, c.he)
	}
}

func (c *cutter) out(start, end int) {
	if start < end {
		c.e.pre(c.step+1, c.s[start:end], c.atStart && start == 0)
	}
}

func (c *cutter) hold(start, end int) {
	if c.held {
		c.out(c.hs, c.he)
	}
	c.held, c.hs, c.he = true, start, end
}

func (c *cutter) segment(start, end int, isMatch bool) {
	if c.invert {
		isMatch = !isMatch
	}
	switch c.behavior {
	case behaviorRemoved:
		if !isMatch {
			c.out(start, end)
		}
	case behaviorIsolated:
		c.out(start, end)
	case behaviorContiguous:
		// Runs of matches (and of gaps) become one piece.
		if c.held && isMatch == c.prevMatch {
			c.he = end
		} else {
			c.hold(start, end)
		}
	case behaviorMergedWithPrevious:
		// A match joins the gap before it.
		if c.held && isMatch && !c.prevMatch {
			c.he = end
		} else {
			c.hold(start, end)
		}
	case behaviorMergedWithNext:
		// A match joins the gap after it; only a match is ever held.
		switch {
		case c.held && !isMatch:
			c.held = false
			c.out(c.hs, end)
		case isMatch:
			c.hold(start, end)
		default:
			c.out(start, end)
		}
	}
	c.prevMatch = isMatch
}

// replaceAll replaces every match of p in s with to, as the Replace
// normalizer does.
func replaceAll(s string, p *pattern, to string) string {
	r := replacer{s: s, to: to}
	p.each(s, &r)
	if r.b.Len() == 0 && r.last == 0 {
		return s
	}
	r.b.WriteString(s[r.last:])
	return r.b.String()
}

type replacer struct {
	s, to string
	b     strings.Builder
	last  int
}

func (r *replacer) match(start, end int) {
	r.b.WriteString(r.s[r.last:start])
	r.b.WriteString(r.to)
	r.last = end
}

// patternError explains why a regex pattern cannot be used.
type patternError struct{ msg string }

func (e *patternError) Error() string { return e.msg }

// wsLookaheadTail is the ending shared by the GPT-2 family of patterns,
// which Go's regexp cannot express; see whitespaceLookahead.
const wsLookaheadTail = `|\s+(?!\S)|\s+`

// compileRegex builds a pattern for a Regex pattern of tokenizer.json,
// written in Oniguruma's syntax: a hand-written matcher for the known
// patterns, else Go's regexp where it can express the pattern, else the
// backtracking engine.
func compileRegex(src string) (*pattern, error) {
	if known, ok := knownPatterns()[src]; ok {
		return &pattern{kind: patternHand, hand: known.match}, nil
	}
	if p, err := compileGo(src); err == nil {
		return p, nil
	}
	expr, err := translatePattern(src, dialectBacktrack)
	if err != nil {
		return nil, err
	}
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, &patternError{fmt.Sprintf("pattern %q: %v", src, err)}
	}
	return &pattern{kind: patternBacktrack, bt: re, runes: &sync.Pool{New: func() any { return new(runeBuf) }}}, nil
}

// compileGo compiles src for Go's regexp, taking out a trailing
// `\s+(?!\S)` alternative (emulated by whitespaceLookahead).
func compileGo(src string) (*pattern, error) {
	body, tail := src, false
	if strings.HasSuffix(src, wsLookaheadTail) && topLevelAlternation(src, len(src)-len(wsLookaheadTail)) {
		body, tail = src[:len(src)-len(wsLookaheadTail)], true
	} else if src == wsLookaheadTail[1:] {
		body, tail = "", true
	}
	expr, err := translatePattern(body, dialectGo)
	if err != nil {
		return nil, err
	}
	if tail {
		ws, _ := translatePattern(`\s+`, dialectGo)
		if body == "" {
			expr = "(" + ws + ")"
		} else {
			expr = "(?:" + expr + ")|(" + ws + ")"
		}
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, err
	}
	p := &pattern{kind: patternGo, goRe: re}
	if tail {
		p.wsGroup = re.NumSubexp()
	}
	return p, nil
}

// topLevelAlternation reports whether the "|" at byte i of src is outside
// every group and character class.
func topLevelAlternation(src string, i int) bool {
	depth, class := 0, false
	for k := 0; k < i; k++ {
		switch c := src[k]; {
		case c == '\\':
			k++
		case class:
			if c == ']' {
				class = false
			}
		case c == '[':
			class = true
		case c == '(':
			depth++
		case c == ')':
			depth--
		}
	}
	return depth == 0 && !class
}

type dialect int

const (
	dialectGo dialect = iota
	dialectBacktrack
)

// Oniguruma's Unicode classes, spelled for the target engines. \s is the
// White_Space property; \w is letters, marks, numbers and connector
// punctuation; \d is decimal digits.
const (
	classSpace = `\t-\r\x{85}\p{Z}`
	classWord  = `\p{L}\p{M}\p{N}\p{Pc}`
	classDigit = `\p{Nd}`
	// The backtracking engine spells code points \uXXXX.
	classSpaceBT = `\t-\r\u0085\p{Z}`
)

// translatePattern rewrites an Oniguruma pattern for a target engine so that
// it matches the same text: shorthand classes get Oniguruma's Unicode
// meaning, and for the backtracking engine literals under (?i) match their
// whole case-folding orbit (it lower-cases instead of folding, so "ſ" would
// not match "s"). Constructs whose meaning differs between the engines and
// that no published tokenizer uses are rejected, as is anything that
// depends on text before the search position when the target is Go's
// engine (which is given suffixes).
func translatePattern(src string, d dialect) (string, error) {
	var b strings.Builder
	unsupported := func(what string) error {
		return &patternError{fmt.Sprintf("pattern %q: %s is not supported", src, what)}
	}
	inClass := false
	// fold tracks (?i) per open group, for the backtracking engine.
	fold := []bool{false}
	for i := 0; i < len(src); {
		r, n := utf8.DecodeRuneInString(src[i:])
		switch {
		case r == '\\':
			if i+1 >= len(src) {
				return "", unsupported("a trailing backslash")
			}
			c, cn := utf8.DecodeRuneInString(src[i+1:])
			i += 1 + cn
			switch c {
			case 's', 'd', 'w':
				b.WriteString(shorthand(c, false, inClass, d))
			case 'S', 'D', 'W':
				if inClass {
					return "", unsupported(`a negated shorthand class (\S, \D, \W) inside brackets`)
				}
				b.WriteString(shorthand(unicode.ToLower(c), true, false, d))
			case 'h':
				if inClass {
					b.WriteString(`0-9a-fA-F`)
				} else {
					b.WriteString(`[0-9a-fA-F]`)
				}
			case 'b', 'B', 'G', 'K', 'R', 'X', 'k', 'g', 'H', 'y', 'Y', 'O', 'N':
				return "", unsupported(`\` + string(c))
			case 'A', 'z', 'Z':
				if d == dialectGo {
					return "", unsupported("an anchor with Go's engine")
				}
				b.WriteString(`\` + string(c))
			case 'u':
				if d == dialectGo && i+4 <= len(src) {
					b.WriteString(`\x{` + src[i:i+4] + `}`)
					i += 4
				} else {
					b.WriteString(`\u`)
				}
			case 'p', 'P', 'x':
				// Copy a braced argument whole, so that its "}" is not
				// taken for the end of a quantifier.
				b.WriteString(`\` + string(c))
				if strings.HasPrefix(src[i:], "{") {
					end := strings.IndexByte(src[i:], '}')
					if end < 0 {
						return "", unsupported(`an unterminated \` + string(c) + "{")
					}
					b.WriteString(src[i : i+end+1])
					i += end + 1
				}
			default:
				if c >= '1' && c <= '9' && !inClass {
					return "", unsupported("a back-reference")
				}
				b.WriteString(`\` + string(c))
			}
			continue
		case inClass:
			if r == '[' {
				return "", unsupported("a nested character class")
			}
			if r == '&' && strings.HasPrefix(src[i:], "&&") {
				return "", unsupported("class intersection")
			}
			if r == ']' {
				inClass = false
			}
			b.WriteRune(r)
		case r == '[':
			if d == dialectBacktrack && fold[len(fold)-1] {
				return "", unsupported("a character class under (?i)")
			}
			inClass = true
			b.WriteRune(r)
			// A "]" right after "[" or "[^" is a literal.
			if strings.HasPrefix(src[i+1:], "^") {
				b.WriteByte('^')
				i++
			}
			if strings.HasPrefix(src[i+1:], "]") {
				b.WriteString(`\]`)
				i++
			}
		case r == '(':
			on, off, rest, isFlags := parseFlagGroup(src[i:])
			cur := fold[len(fold)-1]
			if isFlags {
				if strings.ContainsAny(on+off, "mxsaudlW") {
					return "", unsupported("an inline option other than i")
				}
				if strings.Contains(on, "i") {
					cur = true
				}
				if strings.Contains(off, "i") {
					cur = false
				}
				if rest == ")" {
					// (?i) applies to the rest of the enclosing group.
					fold[len(fold)-1] = cur
					if d == dialectGo {
						b.WriteString(src[i : i+flagGroupLen(src[i:])])
					}
					i += flagGroupLen(src[i:])
					continue
				}
				fold = append(fold, cur)
				if d == dialectGo {
					b.WriteString(src[i : i+flagGroupLen(src[i:])])
				} else {
					b.WriteString("(?:")
				}
				i += flagGroupLen(src[i:])
				continue
			}
			if strings.HasPrefix(src[i:], "(?<=") || strings.HasPrefix(src[i:], "(?<!") {
				if d == dialectGo {
					return "", unsupported("look-behind with Go's engine")
				}
			}
			if strings.HasPrefix(src[i:], "(?~") || strings.HasPrefix(src[i:], "(?#") {
				return "", unsupported("an absent or comment group")
			}
			fold = append(fold, cur)
			b.WriteRune(r)
		case r == ')':
			if len(fold) > 1 {
				fold = fold[:len(fold)-1]
			}
			b.WriteRune(r)
		case (r == '^' || r == '$') && d == dialectGo:
			return "", unsupported("an anchor with Go's engine")
		case r == '^' || r == '$':
			// Oniguruma's ^ and $ match at every line boundary.
			b.WriteString("(?m:" + string(r) + ")")
		case (r == '+' || r == '?' || r == '*') && strings.HasPrefix(src[i+n:], "+"):
			return "", unsupported("a possessive quantifier")
		case d == dialectBacktrack && fold[len(fold)-1] && unicode.IsLetter(r):
			b.WriteString(foldClass(r))
		default:
			b.WriteRune(r)
		}
		i += n
	}
	if inClass {
		return "", unsupported("an unterminated character class")
	}
	return b.String(), nil
}

// shorthand spells \s, \d or \w (negated when neg) for the target engine.
func shorthand(c rune, neg, inClass bool, d dialect) string {
	var body string
	switch c {
	case 's':
		body = classSpace
		if d == dialectBacktrack {
			body = classSpaceBT
		}
	case 'd':
		body = classDigit
	case 'w':
		body = classWord
	}
	if inClass {
		return body
	}
	if neg {
		return "[^" + body + "]"
	}
	return "[" + body + "]"
}

// foldClass is a class of every rune that simple case folding maps onto
// the same rune as r.
func foldClass(r rune) string {
	orbit := []rune{r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		orbit = append(orbit, f)
	}
	if len(orbit) == 1 {
		return string(r)
	}
	return "[" + string(orbit) + "]"
}

// parseFlagGroup recognises "(?flags)" and "(?flags:" at the start of s.
func parseFlagGroup(s string) (on, off, rest string, ok bool) {
	if !strings.HasPrefix(s, "(?") {
		return "", "", "", false
	}
	k := 2
	neg := false
	for k < len(s) {
		c := s[k]
		switch {
		case c == '-':
			neg = true
		case c == ':' || c == ')':
			if k == 2 {
				return "", "", "", false
			}
			return on, off, s[k : k+1], true
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			if neg {
				off += string(c)
			} else {
				on += string(c)
			}
		default:
			return "", "", "", false
		}
		k++
	}
	return "", "", "", false
}

// flagGroupLen is the length of the "(?flags:" or "(?flags)" prefix of s.
func flagGroupLen(s string) int {
	return strings.IndexAny(s, ":)") + 1
}
