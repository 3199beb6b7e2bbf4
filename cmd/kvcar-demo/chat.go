package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/tokenizer"
)

// demoSystem is the system prompt every conversation starts with, long
// enough to fill several KV blocks.
const demoSystem = `You are the support assistant of a company that runs large language model inference for other teams.
Answer in the language of the question. Be precise and brief; when a question is about latency, give numbers with units.
Keep code in fenced blocks. 你好！ Привет! مرحبا! नमस्ते! If you do not know, say so.`

var demoQuestions = []string{
	"What does a prefix cache hit save?",
	"How long is the time to first token for a 12k-token prompt without a hit?",
	"为什么多轮对话适合缓存感知路由？",
	"Show a curl command that sends a chat request.",
}

var demoAnswers = []string{
	"The prefill of the cached tokens: the engine reuses their KV blocks instead of recomputing them.",
	"It grows with the uncached tokens; for 12k tokens it is dominated by prefill, typically seconds.",
	"因为每一轮的提示都以上一轮的完整对话开头，所以上一轮所在的实例已经缓存了大部分前缀。",
	"```sh\ncurl -sS localhost:8888/v1/chat/completions -d '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n```",
}

// demoDocument is shared by the text completions, which ask different
// questions about it.
const demoDocument = "Release notes, version 2.4:\n\n1. The router now tokenizes chat and text prompts with the model's own tokenizer.\n" +
	"2. Prefix lookups use the same token ids as the engine's KV cache events.\n3. Unsupported tokenizer files are refused at start-up.\n\nQuestion: "

// chatLoad sends multi-turn conversations that share a system prompt, and
// text completions that share a document, as chat and text (no token ids):
// kvcar tokenizes them with the model's tokenizer and chat template and
// routes them cache-aware; each line shows what the engine reused.
func chatLoad(ctx context.Context, base string, engines devcluster.Engines, tok *tokenizer.Tokenizer, o options) error {
	fmt.Fprintf(o.out, "\nchat and text requests, tokenized by kvcar with %s:\n", o.tokenizer)
	var reused, total, requests int
	report := func(what string, tokens int, res completion) {
		hit := res.Engine.DeviceHitTokens + res.Engine.HostHitTokens
		reused += hit
		total += tokens
		requests++
		fmt.Fprintf(o.out, "%-22s %5d tokens -> %s dp%d  kvcar hit ratio %.2f, engine reused %5d\n",
			what, tokens, res.prefill, res.Engine.DPRank, res.hitRatio, hit)
		// Let the prefill's KV events reach kvcar, as a user's next turn
		// follows the answer.
		time.Sleep(20 * time.Millisecond)
	}
	const conversations = 4
	histories := make([][]tokenizer.Message, conversations)
	for c := range histories {
		histories[c] = []tokenizer.Message{{Role: "system", Content: demoSystem}}
	}
	for turn := range 3 {
		for c := range conversations {
			k := (c + turn) % len(demoQuestions)
			histories[c] = append(histories[c], tokenizer.Message{Role: "user", Content: demoQuestions[k]})
			ids, err := tok.EncodeChat(histories[c], nil)
			if err != nil {
				return err
			}
			msgs := make([]map[string]string, len(histories[c]))
			for i, m := range histories[c] {
				msgs[i] = map[string]string{"role": m.Role, "content": m.Content}
			}
			res, err := post(ctx, base+"/v1/chat/completions", engines, map[string]any{"model": "enginesim", "max_tokens": 4, "messages": msgs})
			if err != nil {
				return err
			}
			report(fmt.Sprintf("chat %d turn %d:", c+1, turn+1), len(ids), res)
			histories[c] = append(histories[c], tokenizer.Message{Role: "assistant", Content: demoAnswers[k]})
		}
	}
	for _, q := range demoQuestions {
		prompt := demoDocument + q
		ids, err := tok.Encode(prompt, nil)
		if err != nil {
			return err
		}
		res, err := post(ctx, base+"/v1/completions", engines, map[string]any{"model": "enginesim", "max_tokens": 4, "prompt": prompt})
		if err != nil {
			return err
		}
		report("text:", len(ids), res)
	}
	fmt.Fprintf(o.out, "\n%d chat and text requests, %d prompt tokens: the engines reused %d (%.1f%% of prompt tokens)\n",
		requests, total, reused, 100*float64(reused)/float64(max(total, 1)))
	return nil
}
