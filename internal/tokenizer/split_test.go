package tokenizer

import (
	"math/rand/v2"
	"reflect"
	"strings"
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
