package main

import (
	"io"
	"slices"
	"testing"

	"github.com/kvcar/kvcar/internal/server"
	"github.com/kvcar/kvcar/internal/tokenizer"
)

// TestTokenizerAddSpecialTokensFlag: --tokenizer_add_special_tokens makes
// chat prompts carry the tokenizer's special tokens on top of what the
// template writes, as an engine that encodes the rendered chat with
// add_special_tokens=true sees them; without it the template alone places
// BOS. The gpt2like fixture sets add_bos_token and its template writes
// bos_token, so the flag gives two BOS ids.
func TestTokenizerAddSpecialTokensFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"--tokenizer_add_special_tokens"}, true}} {
		f, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if f.tokenizerSpecial != c.want {
			t.Errorf("%q: tokenizerSpecial = %v, want %v", c.args, f.tokenizerSpecial, c.want)
		}
	}
	tok, err := tokenizer.Load("../../internal/tokenizer/testdata/gpt2like")
	if err != nil {
		t.Fatal(err)
	}
	bos, ok := tok.TokenID("<s>")
	if !ok {
		t.Fatal("no <s> in the fixture")
	}
	msgs := []server.ChatMessage{{Role: "user", Content: "hello world"}}
	plain, err := chatTokenizer{t: tok}.EncodeChat(t.Context(), msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(plain) < 2 || plain[0] != bos || plain[1] == bos {
		t.Fatalf("without the flag: %v, want one leading BOS %d from the template", plain, bos)
	}
	special, err := chatTokenizer{t: tok, special: true}.EncodeChat(t.Context(), msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]uint32{bos}, plain...); !slices.Equal(special, want) {
		t.Fatalf("with the flag: %v, want %v", special, want)
	}
}
