package enginesim

import "strings"

// ToyVocabSize bounds the ids of the toy tokenizer, about the vocabulary
// size of current models, so that its ids look like real ones.
const ToyVocabSize = 150000

// ToyTokenize is the emulated engine's tokenizer, a toy that only has to
// be deterministic: text is split on Unicode white space and each word
// becomes the 64-bit FNV-1a hash of its bytes modulo ToyVocabSize. Equal
// texts give equal ids and a text that extends another by whole words
// extends its ids, which is all the prefix cache needs. It knows nothing
// of any real model; a router that knows the real ids sends them instead
// (a token-id prompt, or TokenIDsField for chat).
func ToyTokenize(text string) []uint32 {
	words := strings.Fields(text)
	out := make([]uint32, len(words))
	for i, w := range words {
		out[i] = toyTokenID(w)
	}
	return out
}

func toyTokenID(word string) uint32 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(word); i++ {
		h ^= uint64(word[i])
		h *= prime64
	}
	return uint32(h % ToyVocabSize)
}

// ChatMessage is one chat message after its content parts have been
// joined into one text.
type ChatMessage struct {
	Role    string
	Content string
}

// FlattenChat is the toy chat template: every message becomes
// "<|role|> content\n" and the prompt ends with "<|assistant|>", the
// generation prompt. A conversation's flattened prompt therefore starts
// with the flattened prompt of each of its earlier turns, so follow-up
// turns reuse the cached blocks of the previous ones as they would with a
// real template.
func FlattenChat(msgs []ChatMessage) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|> ")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("<|assistant|>")
	return b.String()
}

// ChatTokenIDs returns the token ids the engine serves for a chat request
// with msgs and no TokenIDsField: the toy tokenizer over FlattenChat.
func ChatTokenIDs(msgs []ChatMessage) []uint32 { return ToyTokenize(FlattenChat(msgs)) }
