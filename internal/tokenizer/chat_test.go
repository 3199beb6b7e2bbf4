package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func renderFile(t *testing.T, name string, msgs []Message, opts ChatOptions, tokens map[string]string) (string, error) {
	t.Helper()
	tmpl, err := compileTemplate(readTemplate(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	tk := &Tokenizer{dir: "test", tmpl: tmpl, tokens: tokens}
	return tk.RenderChat(msgs, opts)
}

// The expected strings are the publicly documented prompt formats of each
// model family.
func TestChatTemplates(t *testing.T) {
	llamaTokens := map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
	mistralTokens := map[string]string{"bos_token": "<s>", "eos_token": "</s>"}
	cases := []struct {
		name, file string
		msgs       []Message
		opts       ChatOptions
		tokens     map[string]string
		want       string
		wantErr    string
	}{
		{
			name: "qwen2 default system", file: "qwen2.jinja",
			msgs: []Message{{"user", "Hello!"}}, opts: ChatOptions{AddGenerationPrompt: true},
			want: "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			name: "qwen2 own system, no generation prompt", file: "qwen2.jinja",
			msgs: []Message{{"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hey."}},
			want: "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHey.<|im_end|>\n",
		},
		{
			// `message['content'] | trim` binds tighter than +.
			name: "llama3", file: "llama3.jinja", tokens: llamaTokens,
			msgs: []Message{{"system", "S "}, {"user", "  Hello! "}}, opts: ChatOptions{AddGenerationPrompt: true},
			want: "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		},
		{
			name: "llama3 without bos_token configured", file: "llama3.jinja",
			msgs: []Message{{"user", "x"}},
			want: "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>",
		},
		{
			name: "mistral", file: "mistral.jinja", tokens: mistralTokens,
			msgs: []Message{{"user", " Hello! "}, {"assistant", "Hi there."}, {"user", "How are you?"}},
			want: "<s>[INST] Hello! [/INST] Hi there.</s>\n[INST] How are you? [/INST]",
		},
		{
			name: "mistral raise_exception", file: "mistral.jinja", tokens: mistralTokens,
			msgs: []Message{{"assistant", "first"}}, wantErr: "Conversation roles must alternate",
		},
		{
			name: "mistral unknown role", file: "mistral.jinja", tokens: mistralTokens,
			msgs: []Message{{"system", "x"}}, wantErr: "roles must alternate",
		},
		{
			// namespace, reversed slices, `is string`, `in`, split, lstrip,
			// rstrip, strip with arguments, loop.index0/last, undefined
			// message.tool_calls.
			name: "qwen3 reasoning", file: "qwen3.jinja",
			msgs: []Message{{"system", "S"}, {"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "Q2"}, {"assistant", "<think>r2</think>A2"}},
			want: "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n" +
				"<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n",
		},
		{
			name: "qwen3 enable_thinking=false from kwargs", file: "qwen3.jinja",
			msgs: []Message{{"user", "Q"}},
			opts: ChatOptions{AddGenerationPrompt: true, Kwargs: map[string]any{"enable_thinking": false}},
			want: "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
		},
		{
			name: "qwen3 enable_thinking unset", file: "qwen3.jinja",
			msgs: []Message{{"user", "Q"}}, opts: ChatOptions{AddGenerationPrompt: true},
			want: "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
		},
	}
	for _, c := range cases {
		got, err := renderFile(t, c.file, c.msgs, c.opts, c.tokens)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err = %v, want %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

// TestTemplateSourceNewlines checks the Jinja lexer rules applied before
// compiling: trim_blocks, lstrip_blocks, CRLF and one dropped final newline.
func TestTemplateSourceNewlines(t *testing.T) {
	cases := map[string]string{
		"{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n": "a\nb\n",
		"    {% if true %}\nx\n    {% endif %}\n":                  "x\n",
		"{{ messages[0].content }}\n":                              "a",
		"{{ messages[0].content }}\n\n":                            "a\n",
		"{{ messages[0].content }}\r\nz\r\n":                       "a\nz",
	}
	for src, want := range cases {
		tmpl, err := compileTemplate(src)
		if err != nil {
			t.Fatal(err)
		}
		tk := &Tokenizer{tmpl: tmpl}
		got, err := tk.RenderChat([]Message{{"user", "a"}, {"user", "b"}}, ChatOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%q: got %q, want %q", src, got, want)
		}
	}
}

func TestChatThroughLoad(t *testing.T) {
	msgs := []Message{{"user", "hello"}}

	// qwen2like: template string in tokenizer_config.json; no BOS.
	q := load(t, "qwen2like")
	qv := readFixtureVocab(t, "qwen2like")
	ids, err := q.EncodeChat(msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := qv.ids(t, "<|im_start|>", "s", "y", "s", "t", "e", "m", "\n", "Y", "ou", " a", "r", "e", " a")
	if !reflect.DeepEqual(ids[:len(want)], want) {
		t.Fatalf("qwen2 chat ids start %v, want %v", ids[:len(want)], want)
	}
	prompt, _ := q.ApplyChatTemplate(msgs, true)
	if direct, _ := q.EncodeWith(prompt, EncodeOptions{}, nil); !reflect.DeepEqual(direct, ids) {
		t.Fatal("EncodeChat differs from encoding the rendered prompt")
	}

	// llama3like: named templates, "default" used; the template writes the
	// BOS, so EncodeChat has exactly one, and AddSpecialTokens adds the
	// post_processor's second one (what an engine encoding rendered chat
	// prompts with add_special_tokens=true computes).
	l := load(t, "llama3like")
	lv := readFixtureVocab(t, "llama3like")
	bos := lv.ids(t, "<|begin_of_text|>")[0]
	ids, err = l.EncodeChat(msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantStart := lv.ids(t, "<|begin_of_text|>", "<|start_header_id|>", "u", "s", "er", "<|end_header_id|>", "\n\n", "hello", "<|eot_id|>", "<|start_header_id|>")
	if !reflect.DeepEqual(ids[:len(wantStart)], wantStart) {
		t.Fatalf("llama3 chat ids %v, want prefix %v", ids, wantStart)
	}
	both, err := l.EncodeChatWith(msgs, ChatOptions{AddGenerationPrompt: true, AddSpecialTokens: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if both[0] != bos || both[1] != bos || !reflect.DeepEqual(both[1:], ids) {
		t.Fatalf("AddSpecialTokens: %v", both[:4])
	}

	// gpt2like: chat_template.jinja wins over tokenizer_config.json;
	// bos_token given as an AddedToken object.
	g := load(t, "gpt2like")
	out, err := g.ApplyChatTemplate(msgs, true)
	if err != nil || out != "<s>[INST] hello [/INST]" {
		t.Fatalf("gpt2like chat = %q, %v", out, err)
	}

	// spmlike: chat_template.json.
	s := load(t, "spmlike")
	out, err = s.ApplyChatTemplate([]Message{{"user", "Hello"}, {"assistant", "Hello"}}, false)
	if err != nil || out != "<s>[INST] Hello [/INST] Hello</s>" {
		t.Fatalf("spmlike chat = %q, %v", out, err)
	}
	sv := readFixtureVocab(t, "spmlike")
	ids, err = s.EncodeChat([]Message{{"user", "Hello"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != sv.added["<s>"] || ids[1] == sv.added["<s>"] {
		t.Fatalf("spmlike chat ids %v: want exactly one leading <s>", ids)
	}
}

func TestNoChatTemplate(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("testdata", "qwen2like", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tk.HasChatTemplate() {
		t.Fatal("HasChatTemplate")
	}
	if _, err := tk.EncodeChat([]Message{{"user", "x"}}, nil); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("err = %v", err)
	}
	// Without tokenizer_config.json nothing adds a BOS.
	ids, err := tk.Encode("hello", nil)
	if err != nil || len(ids) != 1 {
		t.Fatalf("ids %v, %v", ids, err)
	}
}
