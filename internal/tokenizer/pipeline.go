package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normStep is one normalizer of tokenizer.json, applied to each stretch of
// text between added tokens.
type normStep struct {
	kind    normKind
	form    norm.Form
	prepend string
	pat     *pattern // Replace pattern
	to      string   // Replace content
	left    bool     // Strip
	right   bool     // Strip
}

type normKind int

const (
	normUnicode normKind = iota
	normPrepend
	normReplace
	normLowercase
	normStrip
	normStripAccents
)

func (n *normStep) apply(s string) string {
	switch n.kind {
	case normUnicode:
		// IsNormalString is a cheap quick check; most prompts already are.
		if n.form.IsNormalString(s) {
			return s
		}
		return n.form.String(s)
	case normPrepend:
		if s == "" {
			return s
		}
		return n.prepend + s
	case normReplace:
		if n.pat.kind == patternLiteral {
			return strings.ReplaceAll(s, n.pat.lit, n.to)
		}
		return replaceAll(s, n.pat, n.to)
	case normLowercase:
		return lowercase(s)
	case normStrip:
		if n.left {
			s = strings.TrimLeftFunc(s, isSpace)
		}
		if n.right {
			s = strings.TrimRightFunc(s, isSpace)
		}
		return s
	case normStripAccents:
		// Every mark goes, spacing and enclosing ones too.
		if strings.IndexFunc(s, isMark) < 0 {
			return s
		}
		return strings.Map(func(r rune) rune {
			if isMark(r) {
				return -1
			}
			return r
		}, s)
	}
	return s
}

// lowercase maps each rune to its full Unicode lowercase, as Rust's
// char::to_lowercase does: the simple mapping, except U+0130 (İ), the one
// rune whose unconditional lowercase is two runes. There is no
// context-dependent final sigma.
func lowercase(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || (c >= 'A' && c <= 'Z') {
			ascii = false
			break
		}
	}
	if ascii {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == 0x130 {
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// preStep is one pre-tokenizer of tokenizer.json.
type preStep struct {
	kind preKind

	// preSplit, and preByteLevel with useRegex (Isolated), and
	// preMetaspace with splitOnRep (MergedWithNext).
	pat      *pattern
	behavior splitBehavior
	invert   bool

	// preByteLevel.
	addPrefixSpace bool
	useRegex       bool

	// preMetaspace.
	replacement string
	prepend     prependScheme
	splitOnRep  bool

	// preFixedLength: runes per piece.
	length int
}

type preKind int

const (
	preSplit preKind = iota
	preByteLevel
	preMetaspace
	preFixedLength
)

type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// postSpecial is what the post_processor adds around a single sequence.
type postSpecial struct {
	prefix, suffix []uint32
}

// decodeStep is one decoder of tokenizer.json, applied to the list of token
// strings as the tokenizers library's decode_chain does.
type decodeStep struct {
	kind decodeKind

	from, to string // Replace

	content     string // Strip
	start, stop int    // Strip

	replacement string // Metaspace
	prepend     prependScheme
}

type decodeKind int

const (
	decodeByteLevel decodeKind = iota
	decodeReplace
	decodeByteFallback
	decodeFuse
	decodeStrip
	decodeMetaspace
)

func (d *decodeStep) apply(toks []string, alpha *byteLevelAlphabet) []string {
	switch d.kind {
	case decodeByteLevel:
		var b strings.Builder
		for _, t := range toks {
			if raw, ok := alpha.decode(t); ok {
				b.WriteString(raw)
			} else {
				// A token outside the alphabet (an added token such as
				// "<｜begin▁of▁sentence｜>") passes through unchanged.
				b.WriteString(t)
			}
		}
		return []string{lossyUTF8(b.String())}
	case decodeReplace:
		for i, t := range toks {
			toks[i] = strings.ReplaceAll(t, d.from, d.to)
		}
		return toks
	case decodeByteFallback:
		out := toks[:0:0]
		var pending []byte
		flush := func() {
			if pending == nil {
				return
			}
			if utf8.Valid(pending) {
				out = append(out, string(pending))
			} else {
				for range pending {
					out = append(out, "\uFFFD")
				}
			}
			pending = nil
		}
		for _, t := range toks {
			if b, ok := parseByteToken(t); ok {
				pending = append(pending, b)
				continue
			}
			flush()
			out = append(out, t)
		}
		flush()
		return out
	case decodeFuse:
		return []string{strings.Join(toks, "")}
	case decodeStrip:
		for i, t := range toks {
			for k := 0; k < d.start && strings.HasPrefix(t, d.content); k++ {
				t = t[len(d.content):]
			}
			for k := 0; k < d.stop && strings.HasSuffix(t, d.content); k++ {
				t = t[:len(t)-len(d.content)]
			}
			toks[i] = t
		}
		return toks
	case decodeMetaspace:
		for i, t := range toks {
			t = strings.ReplaceAll(t, d.replacement, " ")
			if i == 0 && d.prepend != prependNever {
				t = strings.TrimPrefix(t, " ")
			}
			toks[i] = t
		}
		return toks
	}
	return toks
}

// parseByteToken recognises the <0xXX> tokens of byte_fallback.
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>' {
		return 0, false
	}
	hex := func(c byte) (byte, bool) {
		switch {
		case c >= '0' && c <= '9':
			return c - '0', true
		case c >= 'A' && c <= 'F':
			return c - 'A' + 10, true
		case c >= 'a' && c <= 'f':
			return c - 'a' + 10, true
		}
		return 0, false
	}
	hi, ok1 := hex(t[3])
	lo, ok2 := hex(t[4])
	return hi<<4 | lo, ok1 && ok2
}

// lossyUTF8 replaces each maximal invalid subsequence with U+FFFD, as Rust's
// String::from_utf8_lossy does (Go's strings.ToValidUTF8 would fold a whole
// run of invalid bytes into one replacement).
func lossyUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError || n > 1 {
			b.WriteString(s[i : i+n])
			i += n
			continue
		}
		b.WriteString("\uFFFD")
		i += invalidPrefixLen(s[i:])
	}
	return b.String()
}

// invalidPrefixLen is the length of the maximal prefix of s that starts a
// well-formed UTF-8 sequence without completing one (at least 1).
func invalidPrefixLen(s string) int {
	c := s[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	k := 1
	for ; k <= need && k < len(s); k++ {
		b := s[k]
		if k == 1 {
			if b < lo || b > hi {
				break
			}
		} else if b < 0x80 || b > 0xBF {
			break
		}
	}
	return k
}

func applyNorms(steps []normStep, s string) string {
	for i := range steps {
		s = steps[i].apply(s)
	}
	return s
}
