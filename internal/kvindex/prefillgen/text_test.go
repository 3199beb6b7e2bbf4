package prefillgen

import (
	"encoding/binary"
	"flag"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/tokenizer"
)

var realWidthsFrom = flag.String("real_widths_from", "", "a tokenizer directory (Qwen3's): write realwidths.bin again from the module's Go source and README before checking it")

// widthClass is an id's MessagePack width class: 0 fixint, 1 uint8, 2
// uint16, 3 uint32.
func widthClass(id uint32) int {
	switch {
	case id < 128:
		return 0
	case id < 256:
		return 1
	case id < 65536:
		return 2
	}
	return 3
}

// writeRealWidths tokenizes the module's README and Go source (internal/
// and cmd/, in path order) with the tokenizer in dir and writes their
// ids' widths to realwidths.bin.
func writeRealWidths(t *testing.T, dir string) {
	tk, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("..", "..", "..")
	files := []string{filepath.Join(root, "README.md")}
	for _, sub := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, sub), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(files[1:])
	var classes []byte
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tk.Encode(string(text), nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, id := range ids {
			classes = append(classes, byte(widthClass(id)))
		}
	}
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(classes)))
	packed := make([]byte, (len(classes)+3)/4)
	for i, c := range classes {
		packed[i/4] |= c << (2 * (i % 4))
	}
	if err := os.WriteFile("realwidths.bin", append(out, packed...), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote the widths of %d ids from %d files", len(classes), len(files))
	realWidths, _ = os.ReadFile("realwidths.bin")
}

// TestRealWidths checks the embedded real widths: enough ids for 64
// messages of Blocks*BlockSize, the mix of widths they were written with
// (docs/performance-log.md, "Fresh token ids in every message"), and
// that Real ids follow them in order.
func TestRealWidths(t *testing.T) {
	if *realWidthsFrom != "" {
		writeRealWidths(t, *realWidthsFrom)
	}
	n, class := RealWidths()
	if n < DefaultVariants*Blocks*BlockSize || len(realWidths) != 4+(n+3)/4 {
		t.Fatalf("%d ids in %d bytes", n, len(realWidths))
	}
	var mix [4]float64
	for i := range n {
		mix[class(i)]++
	}
	for w, want := range []float64{0.184, 0.076, 0.721, 0.019} {
		if got := mix[w] / float64(n); math.Abs(got-want) > 0.005 {
			t.Errorf("width %d is %.3f of the ids, want %.3f", w, got, want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	at := rand.New(rand.NewPCG(1, 2)).IntN(n)
	for i, id := range Real.IDs(rng, 10000) {
		if id >= Vocabulary || widthClass(id) != class((at+i)%n) {
			t.Fatalf("id %d = %d, class %d, want class %d", i, id, widthClass(id), class((at+i)%n))
		}
	}
}

// TestUniformIDs checks that uniform ids cover the vocabulary's widths in
// proportion to their ranges.
func TestUniformIDs(t *testing.T) {
	ids := Uniform.IDs(rand.New(rand.NewPCG(1, 2)), 1<<20)
	var got [4]float64
	for _, id := range ids {
		if id >= Vocabulary {
			t.Fatalf("id %d outside the vocabulary", id)
		}
		got[widthClass(id)]++
	}
	want := [4]float64{128.0 / Vocabulary, 128.0 / Vocabulary, 65280.0 / Vocabulary, (Vocabulary - 65536.0) / Vocabulary}
	for w := range got {
		if g := got[w] / float64(len(ids)); math.Abs(g-want[w]) > 0.005 {
			t.Errorf("width %d is %.4f of the ids, want %.4f", w, g, want[w])
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
