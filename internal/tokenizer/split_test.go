package tokenizer

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// regexSplit is the reference for the hand-written matchers: the original
// pattern run by a backtracking engine that supports lookahead, cut with
// Isolated behaviour (matches and the gaps between them).
func regexSplit(t testing.TB, re *regexp2.Regexp, s string) []string {
	t.Helper()
	var out []string
	// regexp2 reports rune indexes; convert through a rune slice.
	runes := []rune(s)
	last := 0
	m, err := re.FindStringMatch(s)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		if m.Index > last {
			out = append(out, string(runes[last:m.Index]))
		}
		out = append(out, string(runes[m.Index:m.Index+m.Length]))
		last = m.Index + m.Length
	}
	if err != nil {
		t.Fatal(err)
	}
	if last < len(runes) {
		out = append(out, string(runes[last:]))
	}
	return out
}

func handSplit(match matcher, s string) []string {
	var out []string
	gap := 0
	for pos := 0; pos < len(s); {
		end := match(s, pos)
		if end < 0 {
			_, n := runeAt(s, pos)
			pos += n
			continue
		}
		if gap < pos {
			out = append(out, s[gap:pos])
		}
		out = append(out, s[pos:end])
		pos, gap = end, end
	}
	if gap < len(s) {
		out = append(out, s[gap:])
	}
	return out
}

// splitPool holds the characters that exercise every branch of the
// patterns: each class, both cases of the contraction letters, newline
// kinds, Unicode spaces, marks, non-ASCII digits and letters.
var splitPool = []string{
	"a", "b", "s", "t", "S", "T", "R", "E", "V", "M", "L", "D", "r", "e", "v", "m", "l", "d",
	"'", "'", "'s", "'LL", "'Re", "'vE", "'d", "'M",
	" ", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u2028", "\u0085",
	"1", "2", "3", "4", "٣", "Ⅻ", "½",
	".", ",", "!", "?", "-", "_", "(", ")", "<", "|", ">", "$", "€", "🦀", "\u200b",
	"é", "ß", "你", "好", "Ω", "İ", "e\u0301", "\u0301", "\u0300", "\u093f", "क",
	"ひ", "ア", "ー", "。", "、", "+", "^", "`", "~", "\u0903", "龦", "\U00020000",
}

func randomSplitInput(r *rand.Rand) string {
	var b strings.Builder
	n := r.IntN(24)
	for range n {
		b.WriteString(splitPool[r.IntN(len(splitPool))])
	}
	return b.String()
}

func TestSplitMatchesRegexReference(t *testing.T) {
	for text, p := range knownPatterns() {
		t.Run(p.name, func(t *testing.T) {
			re := regexp2.MustCompile(text, regexp2.None)
			r := rand.New(rand.NewPCG(1, uint64(len(text))))
			fixed := []string{
				"", "Hello world", "hello  world", "a\n\n b", "x  \n  y", "   ", "trailing   ",
				"it's IT'S it'S We'LL", "12345 678", " 12", "a.\n\nb", "a!!\r\n\r\nb", "tab\tsep",
				"\u00a0\u00a0x", "mark\u0301s", "e\u0301\u0301", "\u0301start", "你好世界", " ?!", "?!\n",
			}
			for _, s := range fixed {
				if got, want := handSplit(p.match, s), regexSplit(t, re, s); !reflect.DeepEqual(got, want) {
					t.Errorf("%q:\n hand  %q\n regex %q", s, got, want)
				}
			}
			for range 5000 {
				s := randomSplitInput(r)
				if got, want := handSplit(p.match, s), regexSplit(t, re, s); !reflect.DeepEqual(got, want) {
					t.Fatalf("%q:\n hand  %q\n regex %q", s, got, want)
				}
			}
		})
	}
}

// The reference engine lower-cases with .NET rules and does not fold U+017F
// (ſ) onto s, while Oniguruma and Rust's regex apply Unicode simple case
// folding, under which (?i)'s matches "'ſ". The matcher follows the latter.
func TestSplitLongS(t *testing.T) {
	got := handSplit(knownPatterns()[patternQwen2].match, "it'ſ")
	if want := []string{"it", "'ſ"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	got = handSplit(matchGPT2, "it'ſ")
	if want := []string{"it", "'", "ſ"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("gpt2: got %q, want %q", got, want)
	}
}

// FuzzSplit compares the hand-written matchers with the regex reference on
// arbitrary text (U+017F aside, see TestSplitLongS).
func FuzzSplit(f *testing.F) {
	type ref struct {
		name  string
		match matcher
		re    *regexp2.Regexp
	}
	var refs []ref
	for text, p := range knownPatterns() {
		refs = append(refs, ref{p.name, p.match, regexp2.MustCompile(text, regexp2.None)})
	}
	for _, s := range []string{"Hello  world\n\n", "it's 'LL 12345", "a.\r\n b", "\u00a0x\u0301"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0x17F) {
			return
		}
		for _, r := range refs {
			if got, want := handSplit(r.match, s), regexSplit(t, r.re, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s %q:\n hand  %q\n regex %q", r.name, s, got, want)
			}
		}
	})
}

// matchList collects a pattern's matches.
type matchList [][2]int

func (m *matchList) match(start, end int) { *m = append(*m, [2]int{start, end}) }

func matchesOf(p *pattern, s string) matchList {
	var m matchList
	p.each(s, &m)
	return m
}

// TestEnginesAgree runs every known pattern through the two general
// engines as well, Go's regexp (with the `\s+(?!\S)` emulation) and
// regexp2 (with Oniguruma's classes and case folding translated, so "'ſ"
// matches (?i)'s there too), and checks that they find the hand matcher's
// matches.
func TestEnginesAgree(t *testing.T) {
	for text, known := range knownPatterns() {
		t.Run(known.name, func(t *testing.T) {
			hand := &pattern{kind: patternHand, hand: known.match}
			goPat, err := compileGo(text)
			if err != nil {
				t.Fatalf("Go engine: %v", err)
			}
			expr, err := translatePattern(text, dialectBacktrack)
			if err != nil {
				t.Fatalf("regexp2 translation: %v", err)
			}
			bt := &pattern{kind: patternBacktrack, bt: regexp2.MustCompile(expr, regexp2.None), runes: &sync.Pool{New: func() any { return new(runeBuf) }}}
			r := rand.New(rand.NewPCG(7, uint64(len(text))))
			inputs := []string{"it'ſ IT'ſ", "a  b\n\n c", "x\u3000\u3000y", "12345你好ひらがな。"}
			for range 3000 {
				inputs = append(inputs, randomSplitInput(r))
			}
			for _, s := range inputs {
				want := matchesOf(hand, s)
				if got := matchesOf(goPat, s); !reflect.DeepEqual(got, want) {
					t.Fatalf("Go engine on %q:\n got  %v\n want %v", s, got, want)
				}
				if got := matchesOf(bt, s); !reflect.DeepEqual(got, want) {
					t.Fatalf("regexp2 on %q:\n got  %v\n want %v", s, got, want)
				}
			}
		})
	}
}

// TestEmptyMatches checks the library's rule for empty matches (none right
// after the previous match) in both general engines: `a*` on "baab" matches
// at 0, over "aa", and at the end.
func TestEmptyMatches(t *testing.T) {
	want := matchList{{0, 0}, {1, 3}, {4, 4}}
	goPat, err := compileGo("a*")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp2.MustCompile("a*", regexp2.None)
	bt := &pattern{kind: patternBacktrack, bt: re, runes: &sync.Pool{New: func() any { return new(runeBuf) }}}
	for name, p := range map[string]*pattern{"go": goPat, "regexp2": bt} {
		if got := matchesOf(p, "baab"); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v, want %v", name, got, want)
		}
	}
	if got := replaceAll("baab", goPat, "-"); got != "-b-b-" {
		t.Errorf("replace: got %q, want %q", got, "-b-b-")
	}
}
