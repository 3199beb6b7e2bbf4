package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// variantDir writes a copy of a fixture whose tokenizer.json is changed by
// edit, and returns its directory.
func variantDir(t *testing.T, fixture string, edit func(doc map[string]any)) string {
	t.Helper()
	src := filepath.Join("testdata", fixture)
	dir := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "tokenizer.json" {
			var doc map[string]any
			if err := json.Unmarshal(data, &doc); err != nil {
				t.Fatal(err)
			}
			edit(doc)
			if data, err = json.Marshal(doc); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadRejectsUnsupported(t *testing.T) {
	obj := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name        string
		edit        func(doc map[string]any)
		unsupported bool
		want        []string
	}{
		{"split back-reference", func(d map[string]any) {
			d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] = obj("Regex", `(a)\1`)
		}, true, []string{"pre_tokenizer.pretokenizers[0].pattern.Regex", "back-reference", `(a)\\1`}},
		{"split possessive", func(d map[string]any) {
			d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] = obj("Regex", `\p{L}++`)
		}, true, []string{"pre_tokenizer.pretokenizers[0].pattern.Regex", "possessive"}},
		{"split behavior", func(d map[string]any) {
			d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["behavior"] = "Sideways"
		}, false, []string{"pre_tokenizer.pretokenizers[0].behavior", "Sideways"}},
		{"split empty string pattern", func(d map[string]any) {
			d["pre_tokenizer"] = obj("type", "Split", "pattern", obj("String", ""), "behavior", "Isolated")
		}, false, []string{"pre_tokenizer.pattern.String", "empty pattern"}},
		{"split two patterns", func(d map[string]any) {
			d["pre_tokenizer"] = obj("type", "Split", "pattern", obj("String", " ", "Regex", " "), "behavior", "Isolated")
		}, false, []string{"pre_tokenizer.pattern", "exactly one"}},
		{"unicode scripts pre-tokenizer", func(d map[string]any) {
			d["pre_tokenizer"] = obj("type", "UnicodeScripts")
		}, true, []string{"pre_tokenizer.type", `"UnicodeScripts"`}},
		{"step after byte level", func(d map[string]any) {
			pre := d["pre_tokenizer"].(map[string]any)
			pre["pretokenizers"] = append(pre["pretokenizers"].([]any), obj("type", "Digits", "individual_digits", true))
		}, true, []string{"pre_tokenizer", "after ByteLevel"}},
		{"wordpiece model", func(d map[string]any) {
			d["model"].(map[string]any)["type"] = "WordPiece"
		}, true, []string{"model.type", "WordPiece"}},
		{"dropout", func(d map[string]any) {
			d["model"].(map[string]any)["dropout"] = 0.1
		}, true, []string{"model.dropout"}},
		{"subword prefix", func(d map[string]any) {
			d["model"].(map[string]any)["continuing_subword_prefix"] = "##"
		}, true, []string{"model.continuing_subword_prefix"}},
		{"bert normalizer", func(d map[string]any) {
			d["normalizer"] = obj("type", "BertNormalizer")
		}, true, []string{"normalizer.type", "BertNormalizer"}},
		{"precompiled normalizer", func(d map[string]any) {
			d["normalizer"] = obj("type", "Sequence", "normalizers", []any{obj("type", "NFC"), obj("type", "Precompiled", "precompiled_charsmap", "AAAA")})
		}, true, []string{"normalizer.normalizers[1].type", "Precompiled"}},
		{"malformed regex", func(d map[string]any) {
			d["normalizer"] = obj("type", "Replace", "pattern", obj("Regex", `(?<=a`), "content", " ")
		}, true, []string{"normalizer.pattern.Regex", "(?<=a"}},
		{"unknown post-processor", func(d map[string]any) {
			d["post_processor"] = obj("type", "Fancy")
		}, true, []string{"post_processor.type", "Fancy"}},
		{"truncation", func(d map[string]any) {
			d["truncation"] = obj("max_length", 16)
		}, true, []string{"truncation"}},
		{"merge out of vocabulary", func(d map[string]any) {
			d["model"].(map[string]any)["merges"] = []any{"x\u0120 y"}
		}, false, []string{"model.merges[0]", "missing from the vocabulary"}},
		{"malformed merge", func(d map[string]any) {
			d["model"].(map[string]any)["merges"] = []any{"a b c"}
		}, false, []string{"model.merges[0]"}},
	}
	for _, c := range cases {
		dir := variantDir(t, "qwen2like", c.edit)
		_, err := Load(dir)
		if err == nil {
			t.Errorf("%s: Load succeeded", c.name)
			continue
		}
		if got := errors.Is(err, ErrUnsupported); got != c.unsupported {
			t.Errorf("%s: errors.Is(ErrUnsupported) = %v: %v", c.name, got, err)
		}
		msg := err.Error()
		for _, w := range append(c.want, filepath.Join(dir, "tokenizer.json")) {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: error %q lacks %q", c.name, msg, w)
			}
		}
	}
}

func TestUnsupportedDecoderOnlyBreaksDecode(t *testing.T) {
	dir := variantDir(t, "qwen2like", func(d map[string]any) {
		d["decoder"] = map[string]any{"type": "WordPiece", "prefix": "##"}
	})
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tk.Encode("hello", nil)
	if err != nil || len(ids) != 1 {
		t.Fatalf("Encode: %v %v", ids, err)
	}
	_, err = tk.Decode(ids)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "decoder.type") {
		t.Fatalf("Decode err = %v", err)
	}
}

func TestLoadFileErrors(t *testing.T) {
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("missing file: %v", err)
	}
	dir := variantDir(t, "qwen2like", func(map[string]any) {})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Fatalf("bad config: %v", err)
	}
	dir = variantDir(t, "qwen2like", func(map[string]any) {})
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("{% for %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "chat_template.jinja") {
		t.Fatalf("bad template: %v", err)
	}
}

// TestMetaspaceVariants loads the SentencePiece fixture rewritten the way
// newer files spell it (normalizer null, Metaspace pre-tokenizer) and checks
// the prepend schemes and the split flag.
func TestMetaspaceVariants(t *testing.T) {
	legacy := load(t, "spmlike")
	sv := readFixtureVocab(t, "spmlike")
	meta := func(scheme string, split bool) *Tokenizer {
		dir := variantDir(t, "spmlike", func(d map[string]any) {
			d["normalizer"] = nil
			d["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
			d["decoder"] = map[string]any{"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
		})
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	enc := func(tk *Tokenizer, s string) []uint32 {
		ids, err := tk.EncodeWith(s, EncodeOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	want := enc(legacy, "Hello world")
	for _, tk := range []*Tokenizer{meta("first", false), meta("always", false), meta("first", true)} {
		if got := enc(tk, "Hello world"); !reflect.DeepEqual(got, want) {
			t.Errorf("Hello world: got %v, want %v", got, want)
		}
		if got, err := tk.Decode(want); err != nil || got != "Hello world" {
			t.Errorf("Decode = %q, %v", got, err)
		}
	}
	// "first" only prepends at the very start of the input, so text right
	// after a leading special token gets no "▁"; "always" and the legacy
	// Prepend normalizer add it to every stretch.
	if got, want := enc(meta("first", false), "<s>Hello"), sv.ids(t, "<s>", "H", "e", "ll", "o"); !reflect.DeepEqual(got, want) {
		t.Errorf("first: got %v, want %v", got, want)
	}
	for _, tk := range []*Tokenizer{meta("always", false), legacy} {
		if got, want := enc(tk, "<s>Hello"), sv.ids(t, "<s>", "\u2581Hello"); !reflect.DeepEqual(got, want) {
			t.Errorf("always: got %v, want %v", got, want)
		}
	}
	// split=true makes every "▁" start a new word, so "▁▁" cannot merge.
	if got, want := enc(meta("never", true), "a  b"), sv.ids(t, "a", "\u2581", "\u2581", "b"); !reflect.DeepEqual(got, want) {
		t.Errorf("split: got %v, want %v", got, want)
	}
	if got, want := enc(meta("never", false), "a  b"), sv.ids(t, "a", "\u2581\u2581", "b"); !reflect.DeepEqual(got, want) {
		t.Errorf("no split: got %v, want %v", got, want)
	}
}

func TestPostProcessorVariants(t *testing.T) {
	fv := readFixtureVocab(t, "qwen2like")
	cls, sep := fv.added["<|im_start|>"], fv.added["<|im_end|>"]
	hello := fv.ids(t, "hello")
	for _, typ := range []string{"RobertaProcessing", "BertProcessing"} {
		dir := variantDir(t, "qwen2like", func(d map[string]any) {
			d["post_processor"] = map[string]any{"type": typ, "cls": []any{"<|im_start|>", cls}, "sep": []any{"<|im_end|>", sep}}
		})
		tk, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tk.Encode("hello", nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := append(append([]uint32{cls}, hello...), sep); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v, want %v", typ, got, want)
		}
	}
	// add_eos_token from the config appends EOS, even after one in the text.
	dir := variantDir(t, "qwen2like", func(map[string]any) {})
	cfg := `{"eos_token": "<|im_end|>", "add_eos_token": true}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string][]uint32{
		"hello":           append(append([]uint32{}, hello...), sep),
		"hello<|im_end|>": append(append([]uint32{}, hello...), sep, sep),
	} {
		if got, _ := tk.Encode(text, nil); !reflect.DeepEqual(got, want) {
			t.Errorf("add_eos_token %q: got %v, want %v", text, got, want)
		}
	}
}

// TestAddedTokenOptions covers single_word, rstrip and normalized tokens.
func TestAddedTokenOptions(t *testing.T) {
	fv := readFixtureVocab(t, "qwen2like")
	toolID := fv.added["<tool_call>"]
	dir := variantDir(t, "qwen2like", func(d map[string]any) {
		for _, a := range d["added_tokens"].([]any) {
			a := a.(map[string]any)
			if a["content"] == "<tool_call>" {
				a["content"] = "ab"
				a["single_word"] = true
				a["rstrip"] = true
			}
		}
	})
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(s string) []uint32 {
		ids, err := tk.EncodeWith(s, EncodeOptions{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// Inside a word "ab" is plain text; alone it is the token and takes
	// the whitespace after it.
	if got, want := enc("cab"), fv.ids(t, "c", "a", "b"); !reflect.DeepEqual(got, want) {
		t.Errorf("cab: got %v, want %v", got, want)
	}
	if got, want := enc("c ab  d"), append(append(fv.ids(t, "c", " "), toolID), fv.ids(t, "d")...); !reflect.DeepEqual(got, want) {
		t.Errorf("c ab  d: got %v, want %v", got, want)
	}
	// normalized=true tokens are matched after NFC, in normalized form.
	dir = variantDir(t, "qwen2like", func(d map[string]any) {
		for _, a := range d["added_tokens"].([]any) {
			a := a.(map[string]any)
			if a["content"] == "<tool_call>" {
				a["content"] = "caf\u00e9"
				a["normalized"] = true
			}
		}
	})
	if tk, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	if got := enc("cafe\u0301!"); len(got) != 2 || got[0] != toolID {
		t.Errorf("normalized token: got %v", got)
	}
}
