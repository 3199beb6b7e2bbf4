package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// fixtureVocab reads a fixture's tokenizer.json directly (not through the
// loader) so that expected ids come from the file, not from the code under
// test.
type fixtureVocab struct {
	vocab map[string]uint32
	added map[string]uint32
	alpha *byteLevelAlphabet
	byteL bool
}

func readFixtureVocab(t testing.TB, dir string) *fixtureVocab {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		AddedTokens []struct {
			ID      uint32 `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
		Model struct {
			Vocab map[string]uint32 `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	fv := &fixtureVocab{vocab: f.Model.Vocab, added: map[string]uint32{}, alpha: newByteLevelAlphabet(), byteL: dir != "spmlike"}
	for _, a := range f.AddedTokens {
		fv.added[a.Content] = a.ID
	}
	return fv
}

// ids maps tokens to ids: "<...>" names an added token when it is one,
// anything else is a vocabulary token given as raw text (spelled in the
// byte alphabet here for byte-level fixtures).
func (fv *fixtureVocab) ids(t testing.TB, toks ...string) []uint32 {
	t.Helper()
	out := []uint32{}
	for _, tok := range toks {
		if id, ok := fv.added[tok]; ok {
			out = append(out, id)
			continue
		}
		key := tok
		if fv.byteL {
			key = fv.alpha.encode(tok)
		}
		id, ok := fv.vocab[key]
		if !ok {
			t.Fatalf("token %q (%q) not in fixture vocabulary", tok, key)
		}
		out = append(out, id)
	}
	return out
}

func load(t testing.TB, dir string) *Tokenizer {
	t.Helper()
	tk, err := Load(filepath.Join("testdata", dir))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// The expected segmentations below are worked out by hand from the split
// pattern and the merge ranks in fixtureMerges; the comments give the
// reasoning for the cases where rank order decides.
func TestEncodeHandWorked(t *testing.T) {
	type tc struct {
		dir, text string
		special   bool
		want      []string
	}
	cases := []tc{
		// h e l l o: "h e"(2) < "l l"(5) < "he ll"(7) < "hell o"(8).
		// " world": " w"(9), "o r"(10), " w or"(11), "l d"(12), " wor ld"(13).
		{"qwen2like", "hello world", true, []string{"hello", " world"}},
		// "l l"(5) outranks "e l"(6); afterwards no rule joins e+ll.
		{"qwen2like", "Hello", true, []string{"H", "e", "ll", "o"}},
		// " the": " t"(1), "h e"(2), " t he"(3). " hello" is built by
		// "hello" first and " hello"(14) last, as " h" has no rule.
		{"qwen2like", "the hello", true, []string{"t", "he", " hello"}},
		{"qwen2like", " the", true, []string{" the"}},
		// Qwen2 splits digits one by one, so "1 2" never applies; " a"(17)
		// outranks "a n"(29), so " and" does not form without ignore_merges.
		{"qwen2like", "it's 123 and 1234", true, []string{"it", "'s", " ", "1", "2", "3", " a", "n", "d", " ", "1", "2", "3", "4"}},
		// Llama-3 groups up to three digits and, with ignore_merges, emits
		// whole-word vocabulary hits (" and") directly.
		{"llama3like", "it's 123 and 1234", false, []string{"it", "'s", " ", "123", " and", " ", "123", "4"}},
		{"llama3like", "it's", true, []string{"<|begin_of_text|>", "it", "'s"}},
		// GPT-2 keeps the space with the digits (" 123" is one piece, which
		// BPE leaves as " " + "123" for want of a rule).
		{"gpt2like", "it's 123 and 1234", false, []string{"it", "'s", " ", "123", " a", "n", "d", " ", "123", "4"}},
		// Case-insensitive contractions in Llama-3/Qwen2, not in GPT-2.
		{"qwen2like", "IT'S", true, []string{"I", "T", "'", "S"}},
		{"gpt2like", "IT'S", false, []string{"I", "T", "'", "S"}},
		// A whitespace run gives its last space to the next word.
		{"qwen2like", "hi  there  ", true, []string{"h", "i", " ", " the", "r", "e", "  "}},
		{"gpt2like", "   hello", false, []string{"  ", " hello"}},
		// Newline runs: "\n\n"(20) then a lone "\n".
		{"llama3like", "Hello\n\n\nworld", false, []string{"H", "e", "ll", "o", "\n\n", "\n", "w", "or", "ld"}},
		// Punctuation keeps trailing newlines in Llama-3/Qwen2: ".\n"(38).
		{"qwen2like", "hi.\nyou", true, []string{"h", "i", ".\n", "y", "ou"}},
		{"qwen2like", "hi. you", true, []string{"h", "i", ".", " you"}},
		// Multi-byte merges: é is C3 A9 (23), 你 is E4 BD A0 (24, 25).
		{"qwen2like", "é你好", true, []string{"é", "你", "\xe5", "\xa5", "\xbd"}},
		// NFC (Qwen2) composes e + U+0301 into é first; Llama-3 has no
		// normalizer and the mark becomes its own punctuation-class piece.
		{"qwen2like", "e\u0301", true, []string{"é"}},
		{"llama3like", "e\u0301", false, []string{"e", "\xcc", "\x81"}},
		// Special tokens are matched before BPE.
		{"qwen2like", "<|im_start|>user\nhi<|im_end|>\n", true, []string{"<|im_start|>", "u", "s", "er", "\n", "h", "i", "<|im_end|>", "\n"}},
		{"qwen2like", "a<tool_call>b", true, []string{"a", "<tool_call>", "b"}},
		// Not an added token in Llama-3: plain text.
		{"llama3like", "<|im_end|>", false, []string{"<|", "i", "m", "_", "e", "n", "d", "|", ">"}},
		// ignore_merges: " zebra" is a vocabulary word no merge builds.
		{"llama3like", " zebra", false, []string{" zebra"}},
		{"gpt2like", " zebra", false, []string{" ", "z", "e", "b", "r", "a"}},
		// lstrip on <mask> takes the whitespace before it.
		{"gpt2like", "a \t<mask> b", false, []string{"a", "<mask>", " ", "b"}},
		// add_bos_token=true: BOS first, even when the text starts with
		// one, as transformers does.
		{"gpt2like", "hello", true, []string{"<s>", "hello"}},
		{"gpt2like", "<s>hello", true, []string{"<s>", "<s>", "hello"}},
		{"gpt2like", "", true, []string{"<s>"}},
		{"qwen2like", "", true, []string{}},
		// SentencePiece style: "▁" replaces spaces and is prepended;
		// the whole text is one BPE word; byte fallback for ☃ and '.
		{"spmlike", "Hello world", true, []string{"<s>", "\u2581Hello", "\u2581world"}},
		{"spmlike", "Hi ☃", false, []string{"\u2581H", "i", "\u2581", "<0xE2>", "<0x98>", "<0x83>"}},
		{"spmlike", "it's", false, []string{"\u2581", "i", "t", "<0x27>", "s"}},
		// Prepend applies to every stretch between added tokens.
		{"spmlike", "the<s>the", false, []string{"\u2581the", "<s>", "\u2581the"}},
	}
	vocabs := map[string]*fixtureVocab{}
	toks := map[string]*Tokenizer{}
	for _, c := range cases {
		if vocabs[c.dir] == nil {
			vocabs[c.dir] = readFixtureVocab(t, c.dir)
			toks[c.dir] = load(t, c.dir)
		}
		want := vocabs[c.dir].ids(t, c.want...)
		got, err := toks[c.dir].EncodeWith(c.text, EncodeOptions{AddSpecialTokens: c.special}, nil)
		if err != nil {
			t.Fatalf("%s %q: %v", c.dir, c.text, err)
		}
		if len(got) == 0 {
			got = []uint32{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s %q (special=%v):\n got %v\nwant %v %q", c.dir, c.text, c.special, got, want, c.want)
		}
	}
}

func TestEncodeAppendsToDst(t *testing.T) {
	tk := load(t, "qwen2like")
	dst := []uint32{7, 7}
	got, err := tk.Encode("hello", dst)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]uint32{7, 7}, readFixtureVocab(t, "qwen2like").ids(t, "hello")...)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// The BOS rule looks at the encoding, not at what dst held before.
	g := load(t, "gpt2like")
	fv := readFixtureVocab(t, "gpt2like")
	got, err = g.Encode("hello", fv.ids(t, "<s>"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fv.ids(t, "<s>", "<s>", "hello"); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestInvalidUTF8(t *testing.T) {
	tk := load(t, "qwen2like")
	if _, err := tk.Encode("ab\xffcd", nil); !errors.Is(err, ErrInvalidUTF8) {
		t.Fatalf("err = %v, want ErrInvalidUTF8", err)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	texts := []string{
		"", "hello world", "  leading and trailing  ", "tabs\tand\r\nCRLF\n\n\n",
		"emoji 🦀🏳️‍🌈 and 你好世界, naïve café", "<|im_start|>user\nhi<|im_end|>",
		"x = [1, 22, 333, 4444]; // it's 'quoted' DON'T", "\u00a0\u3000\u2028 odd spaces",
	}
	for _, dir := range []string{"qwen2like", "llama3like", "gpt2like", "spmlike"} {
		tk := load(t, dir)
		for _, s := range texts {
			ids, err := tk.EncodeWith(s, EncodeOptions{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tk.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			want := s
			if dir == "spmlike" {
				// The Strip decoder removes the space the normalizer
				// prepended; added tokens are not in this text.
				if strings.Contains(s, "<") {
					continue
				}
			}
			if got != want {
				t.Errorf("%s: Decode(Encode(%q)) = %q", dir, s, got)
			}
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	tk := load(t, "qwen2like")
	if _, err := tk.Decode([]uint32{1 << 30}); err == nil {
		t.Fatal("want error for unknown id")
	}
	// A cut multi-byte character decodes to U+FFFD, as in the library.
	fv := readFixtureVocab(t, "qwen2like")
	got, err := tk.Decode(fv.ids(t, "\xe5", "\xa5", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if got != "\uFFFDa" {
		t.Fatalf("got %q", got)
	}
}

func TestTokenLookups(t *testing.T) {
	tk := load(t, "qwen2like")
	fv := readFixtureVocab(t, "qwen2like")
	if id, ok := tk.TokenID("<|im_end|>"); !ok || id != fv.added["<|im_end|>"] {
		t.Fatalf("TokenID(<|im_end|>) = %d, %v", id, ok)
	}
	if id, ok := tk.TokenID("\u0120world"); !ok || id != fv.ids(t, " world")[0] {
		t.Fatalf("TokenID(Ġworld) = %d, %v", id, ok)
	}
	if tk.VocabSize() != len(fv.vocab)+len(fv.added) {
		t.Fatalf("VocabSize = %d, want %d", tk.VocabSize(), len(fv.vocab)+len(fv.added))
	}
	if !tk.HasChatTemplate() || tk.Dir() != filepath.Join("testdata", "qwen2like") {
		t.Fatal("metadata")
	}
}

// TestConcurrentUse runs encoders and template renders in parallel against
// one Tokenizer (meaningful under -race) and checks results stay equal to
// the sequential ones while the word cache is shared.
func TestConcurrentUse(t *testing.T) {
	tk := load(t, "qwen2like")
	texts := []string{"hello world", "it's 123", "<|im_start|>hi<|im_end|>", strings.Repeat("the hello world ", 50)}
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i], _ = tk.Encode(s, nil)
	}
	msgs := []Message{{"user", "hello"}}
	wantChat, err := tk.EncodeChat(msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []uint32
			for it := 0; it < 200; it++ {
				i := (g + it) % len(texts)
				buf, _ = tk.Encode(texts[i], buf[:0])
				if !reflect.DeepEqual(buf, want[i]) {
					errs <- "encode mismatch"
					return
				}
				c, err := tk.EncodeChat(msgs, nil)
				if err != nil || !reflect.DeepEqual(c, wantChat) {
					errs <- "chat mismatch"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}
