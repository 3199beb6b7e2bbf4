package prefillgen

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestTextWidths draws a million ids of each text and checks the mix of
// encoded widths against the tokenizer measurements the rows come from,
// and that every id is in the vocabulary.
func TestTextWidths(t *testing.T) {
	for _, c := range []struct {
		text Text
		want [4]float64 // fixint, uint8, uint16, uint32
	}{
		{English, [4]float64{0.349, 0.063, 0.576, 0.012}},
		{Chinese, [4]float64{0.105, 0.056, 0.515, 0.324}},
		{Uniform, [4]float64{128.0 / Vocabulary, 128.0 / Vocabulary, 65280.0 / Vocabulary, (Vocabulary - 65536.0) / Vocabulary}},
	} {
		ids := c.text.IDs(rand.New(rand.NewPCG(1, 2)), 1<<20)
		var got [4]float64
		for _, id := range ids {
			switch {
			case id >= Vocabulary:
				t.Fatalf("%v: id %d outside the vocabulary", c.text, id)
			case id < 128:
				got[0]++
			case id < 256:
				got[1]++
			case id < 65536:
				got[2]++
			default:
				got[3]++
			}
		}
		for w := range got {
			got[w] /= float64(len(ids))
			if math.Abs(got[w]-c.want[w]) > 0.01 {
				t.Errorf("%v: width %d is %.3f of the ids, want %.3f", c.text, w, got[w], c.want[w])
			}
		}
	}
}

// TestVariantsDiffer checks that a message's variants carry different
// token ids and that Rewrite moves through them, so that a decoder never
// sees the same widths message after message.
func TestVariantsDiffer(t *testing.T) {
	f := NewWith(t, Options{BlocksPerEvent: 64, Removals: true, Variants: 3})
	seen := map[string]int{}
	for i := range 6 {
		f.Rewrite(i, 10)
		// The first tokens and hashes change every iteration; the rest
		// of the payload names the variant.
		v := f.variants[i%3]
		seen[string(f.Payload[v.first[1]+4:])]++
	}
	if len(seen) != 3 {
		t.Fatalf("6 rewrites gave %d distinct token contents, want 3", len(seen))
	}
	for k, n := range seen {
		if n != 2 {
			t.Fatalf("a variant served %d of 6 rewrites, want 2 (%d bytes)", n, len(k))
		}
	}
}
