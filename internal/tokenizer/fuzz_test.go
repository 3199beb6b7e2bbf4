package tokenizer

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode checks, on every fixture, that encoding never panics, that ids
// stay in the vocabulary, and that Decode(Encode(s)) == s wherever the
// tokenizer is lossless for s: always for llama3like; for qwen2like when s
// is already NFC; for gpt2like unless s holds the whitespace-eating <mask>;
// for spmlike unless s holds an added token (the legacy Prepend applies
// per stretch) or "▁" itself.
func FuzzEncode(f *testing.F) {
	dirs := []string{"qwen2like", "llama3like", "gpt2like", "spmlike"}
	toks := make([]*Tokenizer, len(dirs))
	for i, d := range dirs {
		toks[i] = load(f, d)
	}
	for _, s := range []string{
		"", "hello world", "it's 123 and 1234", "<|im_start|>user\nhi<|im_end|>\n", "a <mask> b",
		"e\u0301 你好 🦀", "  \n\n\t x", "\xff\xfe", "<s>x</s>", "'S'LL'ſ", strings.Repeat("ab", 40),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, tk := range toks {
			ids, err := tk.EncodeWith(s, EncodeOptions{}, nil)
			if !utf8.ValidString(s) {
				if !errors.Is(err, ErrInvalidUTF8) {
					t.Fatalf("%s: invalid UTF-8 accepted: %v", dirs[i], err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", dirs[i], err)
			}
			for _, id := range ids {
				if int(id) >= tk.VocabSize() {
					t.Fatalf("%s: id %d out of range", dirs[i], id)
				}
			}
			if _, err := tk.Encode(s, nil); err != nil {
				t.Fatalf("%s: Encode: %v", dirs[i], err)
			}
			check := true
			switch dirs[i] {
			case "qwen2like":
				check = norm.NFC.IsNormalString(s)
			case "gpt2like":
				check = !strings.Contains(s, "<mask>")
			case "spmlike":
				check = !strings.Contains(s, "<s>") && !strings.Contains(s, "</s>") &&
					!strings.Contains(s, "<unk>") && !strings.Contains(s, "\u2581")
			}
			if !check {
				continue
			}
			got, err := tk.Decode(ids)
			if err != nil {
				t.Fatalf("%s: Decode: %v", dirs[i], err)
			}
			if got != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", dirs[i], s, got)
			}
		}
	})
}
