package tokenizer

import "unicode/utf8"

// byteLevelAlphabet is GPT-2's reversible byte-to-rune table, which every
// byte-level BPE vocabulary is spelled in. Printable Latin-1 bytes stand for
// themselves; the remaining 68 bytes (controls, space, 0x7F-0xA0, 0xAD) are
// given the runes 256, 257, ... in byte order, so that no vocabulary token
// contains whitespace or control characters ("Ġ" is U+0120, the space).
type byteLevelAlphabet struct {
	toRune [256]rune
	toByte [256 + 68]int16 // -1 where the rune is not in the alphabet
}

func newByteLevelAlphabet() *byteLevelAlphabet {
	a := &byteLevelAlphabet{}
	for i := range a.toByte {
		a.toByte[i] = -1
	}
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !printable(b) {
			r = next
			next++
		}
		a.toRune[b] = r
		a.toByte[r] = int16(b)
	}
	return a
}

// decode maps a vocabulary token back to the raw bytes it stands for. It
// reports false when the token contains a rune outside the alphabet, which
// no byte-level pre-tokenizer output can contain.
func (a *byteLevelAlphabet) decode(tok string) (string, bool) {
	buf := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r < 0 || int(r) >= len(a.toByte) || a.toByte[r] < 0 {
			return "", false
		}
		buf = append(buf, byte(a.toByte[r]))
	}
	return string(buf), true
}

// encode spells raw bytes in the alphabet (used by tests and fixtures).
func (a *byteLevelAlphabet) encode(raw string) string {
	buf := make([]byte, 0, 2*len(raw))
	for i := 0; i < len(raw); i++ {
		buf = utf8.AppendRune(buf, a.toRune[raw[i]])
	}
	return string(buf)
}
