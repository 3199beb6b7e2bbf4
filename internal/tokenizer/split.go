package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The regex patterns below are the exact Split patterns (as they read after
// JSON decoding) that published tokenizer.json files use. Go's regexp has no
// lookahead, so instead of compiling them each one is recognised by its text
// and served by a hand-written matcher that reproduces the backtracking
// semantics of the Oniguruma engine the tokenizers library uses: at a
// position the alternatives are tried left to right and the first that
// matches wins (not the longest), and greedy quantifiers give back
// characters when the rest of the alternative needs them.
const (
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	patternQwen2Marks = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	// DeepSeek-V3 (and R1) split three times: numbers, runs of CJK
	// ideographs and kana, then words. The CR and LF inside classes are
	// the characters themselves in these files, not escapes.
	patternDeepSeekDigits = `\p{N}{1,3}`
	patternDeepSeekCJK    = "[一-龥\u3040-ゟ゠-ヿ]+"
	patternDeepSeekWords  = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// matcher returns the end (byte offset) of the pattern's match that starts
// exactly at byte offset i of s, or -1 when no alternative matches there.
// Callers guarantee i < len(s) and that s is valid UTF-8.
type matcher func(s string, i int) int

// splitPattern describes one recognised pattern.
type splitPattern struct {
	name  string
	match matcher
}

// knownPatterns maps pattern text to its matcher.
func knownPatterns() map[string]splitPattern {
	return map[string]splitPattern{
		patternGPT2:           {"gpt2", matchGPT2},
		patternLlama3:         {"llama3", func(s string, i int) int { return matchLlamaFamily(s, i, 3, false) }},
		patternQwen2:          {"qwen2", func(s string, i int) int { return matchLlamaFamily(s, i, 1, false) }},
		patternQwen2Marks:     {"qwen2-marks", func(s string, i int) int { return matchLlamaFamily(s, i, 1, true) }},
		patternDeepSeekDigits: {"deepseek-digits", matchDigits3},
		patternDeepSeekCJK:    {"deepseek-cjk", matchDeepSeekCJK},
		patternDeepSeekWords:  {"deepseek-words", matchDeepSeekWords},
	}
}

// Character classes. \s in Oniguruma (Unicode mode) and Rust is the Unicode
// White_Space property, which is what unicode.IsSpace tests.
func isSpace(r rune) bool  { return unicode.IsSpace(r) }
func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isMark(r rune) bool   { return unicode.IsMark(r) }

// isPunctGPT2 is [^\s\p{L}\p{N}].
func isPunctGPT2(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return utf8.RuneError, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// spanWhile returns the end of the run of runes starting at i that satisfy f.
func spanWhile(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		r, n := runeAt(s, i)
		if !f(r) {
			break
		}
		i += n
	}
	return i
}

// matchContraction matches 's|'t|'re|'ve|'m|'ll|'d at i, case-sensitively or
// under Unicode simple case folding. Under folding the only non-ASCII rune
// that folds onto one of these letters is U+017F LATIN SMALL LETTER LONG S,
// which folds to 's'.
func matchContraction(s string, i int, fold bool) int {
	if s[i] != '\'' {
		return -1
	}
	j := i + 1
	lower := func(k int) (byte, int) {
		r, n := runeAt(s, k)
		if n == 0 {
			return 0, 0
		}
		if fold {
			if r == 0x17F {
				return 's', n
			}
			if r >= 'A' && r <= 'Z' {
				r += 'a' - 'A'
			}
		}
		if r >= utf8.RuneSelf {
			return 0, n
		}
		return byte(r), n
	}
	c, n := lower(j)
	switch c {
	case 's', 't', 'm', 'd':
		return j + n
	case 'r', 'v':
		if c2, n2 := lower(j + n); c2 == 'e' {
			return j + n + n2
		}
	case 'l':
		if c2, n2 := lower(j + n); c2 == 'l' {
			return j + n + n2
		}
	}
	return -1
}

// matchWhitespaceTail handles the shared tail `\s+(?!\S)|\s+` at a position
// holding whitespace: the whole run if it ends the text or is followed by
// more whitespace (impossible for a maximal run), otherwise the run minus its
// last rune so that the lookahead sees whitespace, and if that leaves nothing
// the single rune via the plain `\s+`.
func matchWhitespaceTail(s string, i int) int {
	end := spanWhile(s, i, isSpace)
	if end == i {
		return -1
	}
	if end == len(s) {
		return end
	}
	// Back off one rune: the run is followed by \S, so (?!\S) only holds
	// before the run's last rune.
	_, last := utf8.DecodeLastRuneInString(s[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// matchGPT2 implements patternGPT2.
func matchGPT2(s string, i int) int {
	if e := matchContraction(s, i, false); e >= 0 {
		return e
	}
	r, n := runeAt(s, i)
	// ` ?X+` alternatives: an optional leading space then a run of X.
	j, rj := i, r
	if r == ' ' {
		if r2, n2 := runeAt(s, i+n); n2 > 0 {
			j, rj = i+n, r2
		}
	}
	for _, class := range [...]func(rune) bool{isLetter, isNumber, isPunctGPT2} {
		if class(rj) {
			return spanWhile(s, j, class)
		}
		// Without the optional space, r itself must start the run.
		if j != i && class(r) {
			return spanWhile(s, i, class)
		}
	}
	if isSpace(r) {
		return matchWhitespaceTail(s, i)
	}
	return -1
}

// matchLlamaFamily implements patternLlama3 (maxDigits 3), patternQwen2
// (maxDigits 1) and, with marks, patternQwen2Marks.
func matchLlamaFamily(s string, i int, maxDigits int, marks bool) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if e := matchContraction(s, i, true); e >= 0 {
		return e
	}
	letter := isLetter
	punct := isPunctGPT2
	if marks {
		letter = func(r rune) bool { return isLetter(r) || isMark(r) }
		punct = func(r rune) bool { return isPunctGPT2(r) && !isMark(r) }
	}
	r, n := runeAt(s, i)
	// [^\r\n\p{L}\p{N}]?LETTER+ : one optional prefix rune, then letters.
	if r != '\r' && r != '\n' && !isLetter(r) && !isNumber(r) {
		if r2, n2 := runeAt(s, i+n); n2 > 0 && letter(r2) {
			return spanWhile(s, i+n, letter)
		}
	}
	if letter(r) {
		return spanWhile(s, i, letter)
	}
	// \p{N}{1,k}
	if isNumber(r) {
		e := i
		for k := 0; k < maxDigits && e < len(s); k++ {
			rr, nn := runeAt(s, e)
			if !isNumber(rr) {
				break
			}
			e += nn
		}
		return e
	}
	// ` ?PUNCT+[\r\n]*`
	j := -1
	if punct(r) {
		j = i
	} else if r == ' ' {
		if r2, n2 := runeAt(s, i+n); n2 > 0 && punct(r2) {
			j = i + n
		}
	}
	if j >= 0 {
		e := spanWhile(s, j, punct)
		return spanWhile(s, e, func(r rune) bool { return r == '\r' || r == '\n' })
	}
	if !isSpace(r) {
		return -1
	}
	return matchNewlineOrSpaces(s, i)
}

// matchNewlineOrSpaces is the shared tail `\s*[\r\n]+|\s+(?!\S)|\s+` at a
// position holding whitespace.
func matchNewlineOrSpaces(s string, i int) int {
	// \s*[\r\n]+ : greedy \s* gives back until a newline can follow, so the
	// match ends just after the last \r or \n of the whitespace run.
	end := spanWhile(s, i, isSpace)
	lastNL := -1
	for k := i; k < end; k++ {
		if c := s[k]; c == '\r' || c == '\n' {
			lastNL = k
		}
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	return matchWhitespaceTail(s, i)
}

// isPunctuation is the tokenizers library's punctuation test for the
// Punctuation and BertPreTokenizer pre-tokenizers: ASCII punctuation
// (symbols such as $ and + included) or a Unicode punctuation category.
func isPunctuation(r rune) bool {
	if r < utf8.RuneSelf {
		return r > ' ' && r < 0x7F && !(r >= '0' && r <= '9') && !(r >= 'a' && r <= 'z') && !(r >= 'A' && r <= 'Z')
	}
	return unicode.IsPunct(r)
}

// matchWhitespaceWords is the Whitespace pre-tokenizer's `\w+|[^\w\s]+`,
// with the Rust regex crate's Unicode \w (isWordChar) and \s.
func matchWhitespaceWords(s string, i int) int {
	r, _ := runeAt(s, i)
	switch {
	case isWordChar(r):
		return spanWhile(s, i, isWordChar)
	case !isSpace(r):
		return spanWhile(s, i, func(r rune) bool { return !isWordChar(r) && !isSpace(r) })
	}
	return -1
}

// runeSplit is a split where every rune satisfying pred is a match.
func runeSplit(pred func(rune) bool, behavior splitBehavior) preStep {
	return preStep{kind: preSplit, pat: &pattern{kind: patternRune, pred: pred}, behavior: behavior}
}

// matchDigits3 implements patternDeepSeekDigits.
func matchDigits3(s string, i int) int {
	e := i
	for k := 0; k < 3 && e < len(s); k++ {
		r, n := runeAt(s, e)
		if !isNumber(r) {
			break
		}
		e += n
	}
	if e == i {
		return -1
	}
	return e
}

// isDeepSeekCJK is the class of patternDeepSeekCJK: the CJK Unified
// Ideographs U+4E00-U+9FA5, Hiragana and Katakana.
func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FA5) || (r >= 0x3040 && r <= 0x30FF)
}

// matchDeepSeekCJK implements patternDeepSeekCJK.
func matchDeepSeekCJK(s string, i int) int {
	if e := spanWhile(s, i, isDeepSeekCJK); e > i {
		return e
	}
	return -1
}

func isASCIIPunct(r rune) bool {
	return (r >= '!' && r <= '/') || (r >= ':' && r <= '@') || (r >= '[' && r <= '`') || (r >= '{' && r <= '~')
}

func isASCIILetter(r rune) bool { return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') }

func isLetterOrMark(r rune) bool { return isLetter(r) || isMark(r) }

func isPunctOrSymbol(r rune) bool { return unicode.IsPunct(r) || unicode.IsSymbol(r) }

// matchDeepSeekWords implements patternDeepSeekWords, alternative by
// alternative as matchLlamaFamily does.
func matchDeepSeekWords(s string, i int) int {
	r, n := runeAt(s, i)
	r2, n2 := runeAt(s, i+n)
	// [ASCII punctuation][A-Za-z]+
	if isASCIIPunct(r) && n2 > 0 && isASCIILetter(r2) {
		return spanWhile(s, i+n, isASCIILetter)
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if r != '\r' && r != '\n' && !isLetter(r) && !isPunctOrSymbol(r) && n2 > 0 && isLetterOrMark(r2) {
		return spanWhile(s, i+n, isLetterOrMark)
	}
	if isLetterOrMark(r) {
		return spanWhile(s, i, isLetterOrMark)
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	j := -1
	if isPunctOrSymbol(r) {
		j = i
	} else if r == ' ' && n2 > 0 && isPunctOrSymbol(r2) {
		j = i + n
	}
	if j >= 0 {
		e := spanWhile(s, j, isPunctOrSymbol)
		return spanWhile(s, e, func(r rune) bool { return r == '\r' || r == '\n' })
	}
	if !isSpace(r) {
		return -1
	}
	return matchNewlineOrSpaces(s, i)
}
