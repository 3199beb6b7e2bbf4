package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// refBPE is the textbook algorithm, kept deliberately slow and separate from
// the model code: on strings, repeatedly find the adjacent pair with the
// lowest merge rank (the leftmost among equal ranks), join it, and stop when
// no adjacent pair has a rule.
func refBPE(units []string, ranks map[[2]string]int) []string {
	sym := append([]string(nil), units...)
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(sym); i++ {
			if r, ok := ranks[[2]string{sym[i], sym[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			return sym
		}
		joined := sym[at] + sym[at+1]
		sym = append(sym[:at], append([]string{joined}, sym[at+2:]...)...)
	}
}

// fixtureRanks reads model.merges of a fixture file in either spelling.
func fixtureRanks(t testing.TB, path string) (map[[2]string]int, map[string]uint32, bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Model struct {
			Vocab        map[string]uint32 `json:"vocab"`
			Merges       json.RawMessage   `json:"merges"`
			IgnoreMerges bool              `json:"ignore_merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	ranks := map[[2]string]int{}
	var lines []string
	if json.Unmarshal(f.Model.Merges, &lines) == nil {
		for i, l := range lines {
			a, b, _ := strings.Cut(l, " ")
			ranks[[2]string{a, b}] = i
		}
	} else {
		var pairs [][2]string
		if err := json.Unmarshal(f.Model.Merges, &pairs); err != nil {
			t.Fatal(err)
		}
		for i, p := range pairs {
			ranks[[2]string{p[0], p[1]}] = i
		}
	}
	return ranks, f.Model.Vocab, f.Model.IgnoreMerges
}

// refByteLevelIDs runs refBPE on the GPT-2 spelling of a raw word.
func refByteLevelIDs(t testing.TB, raw string, ranks map[[2]string]int, vocab map[string]uint32, ignoreMerges bool) []uint32 {
	alpha := newByteLevelAlphabet()
	if id, ok := vocab[alpha.encode(raw)]; ok && ignoreMerges {
		return []uint32{id}
	}
	units := make([]string, len(raw))
	for i := 0; i < len(raw); i++ {
		units[i] = alpha.encode(raw[i : i+1])
	}
	var ids []uint32
	for _, s := range refBPE(units, ranks) {
		id, ok := vocab[s]
		if !ok {
			t.Fatalf("reference produced %q, not in vocabulary", s)
		}
		ids = append(ids, id)
	}
	return ids
}

// mergeHeavy builds words from the pieces the fixture merges use, so that
// long merge chains and rank conflicts occur often.
var mergeHeavy = []string{"h", "e", "l", "o", " ", "t", "w", "r", "d", "i", "n", "s", "a", "1", "2", "3", "\n", "\xc3\xa9", "\xe4\xbd\xa0", "'", "y", "u", "<", "|", "."}

func TestBPEMatchesReference(t *testing.T) {
	for _, dir := range []string{"qwen2like", "llama3like", "gpt2like"} {
		tk := load(t, dir)
		ranks, vocab, ignore := fixtureRanks(t, filepath.Join("testdata", dir, "tokenizer.json"))
		r := rand.New(rand.NewPCG(7, uint64(len(dir))))
		for it := 0; it < 5000; it++ {
			var b strings.Builder
			n := 1 + r.IntN(12)
			if it%10 == 0 {
				n = smallWord + r.IntN(80) // exercise the heap path
			}
			for range n {
				b.WriteString(mergeHeavy[r.IntN(len(mergeHeavy))])
			}
			w := b.String()
			got := tk.p.model.encodeWord(w, nil, nil)
			want := refByteLevelIDs(t, w, ranks, vocab, ignore)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s %q:\n got %v\nwant %v", dir, w, got, want)
			}
		}
	}
}

// TestBPERandomVocabularies loads generated tokenizer.json files with many
// overlapping merges over a tiny alphabet, where merge order decides almost
// every result, and compares the model with the reference on words up to
// several hundred symbols (both the quadratic and the heap path).
func TestBPERandomVocabularies(t *testing.T) {
	for seed := uint64(0); seed < 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		tokens := []string{"a", "b", "c", "d"}
		vocab := map[string]uint32{}
		for i, s := range tokens {
			vocab[s] = uint32(i)
		}
		var merges [][2]string
		ranks := map[[2]string]int{}
		for len(merges) < 300 {
			a, b := tokens[r.IntN(len(tokens))], tokens[r.IntN(len(tokens))]
			if len(a)+len(b) > 12 {
				continue
			}
			if _, dup := ranks[[2]string{a, b}]; dup {
				continue
			}
			ranks[[2]string{a, b}] = len(merges)
			merges = append(merges, [2]string{a, b})
			if _, ok := vocab[a+b]; !ok {
				vocab[a+b] = uint32(len(vocab))
				tokens = append(tokens, a+b)
			}
		}
		dir := t.TempDir()
		doc := map[string]any{
			"added_tokens": []any{}, "normalizer": nil, "pre_tokenizer": nil, "post_processor": nil, "decoder": nil,
			"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": merges},
		}
		data, _ := json.Marshal(doc)
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		for it := 0; it < 2000; it++ {
			n := 1 + r.IntN(20)
			if it%10 == 0 {
				n = 1 + r.IntN(300)
			}
			units := make([]string, n)
			for i := range units {
				units[i] = string("abcd"[r.IntN(4)])
			}
			var want []uint32
			for _, s := range refBPE(units, ranks) {
				want = append(want, vocab[s])
			}
			got, err := tk.EncodeWith(strings.Join(units, ""), EncodeOptions{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d %q:\n got %v\nwant %v", seed, strings.Join(units, ""), got, want)
			}
		}
	}
}

// TestMergePathsAgree checks the heap path against the quadratic one on the
// same symbols, including lengths where both apply.
func TestMergePathsAgree(t *testing.T) {
	tk := load(t, "qwen2like")
	m := tk.p.model
	r := rand.New(rand.NewPCG(3, 4))
	for it := 0; it < 3000; it++ {
		var b strings.Builder
		for range 2 + r.IntN(smallWord-1) {
			b.WriteString(mergeHeavy[r.IntN(len(mergeHeavy))])
		}
		w := b.String()
		if len(w) > smallWord {
			w = w[:smallWord]
		}
		a := m.appendSymbols(w, nil)
		c := append([]uint32(nil), a...)
		na := m.merge(a, nil)
		nc := m.mergeLong(c, nil)
		if !reflect.DeepEqual(a[:na], c[:nc]) {
			t.Fatalf("%q: quadratic %v, heap %v", w, a[:na], c[:nc])
		}
	}
}
