// Package tokenizer turns OpenAI-style prompts into the token ids an xLLM
// engine computes for them, so that the router can look up the engine whose
// KV cache holds the longest prefix of exactly those ids.
//
// # What it owns
//
// The package loads a HuggingFace tokenizer directory (the directory passed
// as --tokenizer_path, the same one the engine reads) and reimplements, for
// the supported subset, what the HuggingFace tokenizers library does with
// tokenizer.json plus what the engine does with tokenizer_config.json:
//
//   - tokenizer.json: added_tokens, normalizer, pre_tokenizer, the BPE model,
//     post_processor and decoder;
//   - the chat template, looked up in the order the xLLM service uses:
//     chat_template.json, chat_template.jinja, then the "chat_template" key
//     of tokenizer_config.json (a string, or a list of named templates of
//     which "default" is used);
//   - bos_token, eos_token, unk_token, pad_token, add_bos_token and
//     add_eos_token from tokenizer_config.json.
//
// Anything in tokenizer.json outside the supported subset makes Load fail
// with an error naming the file and the JSON path of the unsupported part,
// instead of silently producing ids that differ from the engine's: a wrong
// id sequence is worse than none, because the prefix lookup would then miss
// without anyone noticing.
//
// # What it must not touch
//
// No network I/O and no model download: Load reads only the files in the
// directory it is given. There is no package-level mutable state; a
// *Tokenizer is immutable after Load (apart from an internal, bounded,
// mutex-guarded word cache) and is safe for concurrent use.
//
// # Supported tokenizer.json subset
//
// Model: "BPE" with vocab and merges (either "a b" strings or ["a","b"]
// pairs), ignore_merges, byte_fallback, unk_token and fuse_unk; dropout must
// be null, and continuing_subword_prefix / end_of_word_suffix must be empty.
//
// Byte-level BPE (GPT-2, Qwen2/2.5/3, Llama-3 style): the pre_tokenizer is
// ByteLevel, or a Sequence of Split steps with one of the recognised regex
// patterns (behavior "Isolated", invert false) followed by ByteLevel. Go's
// regexp package has no lookahead, which these patterns need for
// `\s+(?!\S)`, so each recognised pattern has a hand-written splitter that
// follows the backtracking regex semantics of the original (leftmost
// alternative wins, greedy quantifiers give back). Recognised patterns:
//
//   - GPT-2 (also what ByteLevel with use_regex=true applies):
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   - Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   - Qwen2 (also Qwen2.5 and Qwen3): as Llama-3 with \p{N} instead of \p{N}{1,3}
//   - Qwen2 with combining marks: as Qwen2 with [\p{L}\p{M}]+ for letters and
//     [^\s\p{L}\p{M}\p{N}] for punctuation
//
// Any other Split pattern fails with "unsupported pre_tokenizer pattern".
//
// SentencePiece-style BPE (Llama-2, Mistral, Gemma style, converted from a
// sentencepiece model): pre_tokenizer null or Metaspace (replacement and
// prepend_scheme "always", "first" or "never"; split must be false), the
// normalizer usually Sequence[Prepend("▁"), Replace(" ", "▁")], and
// byte_fallback to <0xXX> tokens.
//
// Normalizers: null, NFC, NFD, NFKC, NFKD, Prepend, Replace with a String
// pattern, and Sequence of these.
//
// Post-processors: null, ByteLevel (offsets only, no ids), TemplateProcessing
// (the "single" template), RobertaProcessing, BertProcessing, and Sequence of
// these.
//
// Decoders: ByteLevel, Metaspace, and Sequence of Replace, ByteFallback,
// Fuse, Strip and ByteLevel. Decoding is only needed for tests and
// diagnostics; an unsupported decoder makes Decode fail, not Load.
//
// # Special tokens and BOS
//
// Added tokens (special or not) are matched in the raw text before
// normalisation and BPE, leftmost-longest, honouring lstrip, rstrip,
// single_word and normalized, the way the tokenizers library does. So
// "<|im_start|>" written in a prompt becomes its id.
//
// Encode adds special tokens the way the engine's encode(text,
// add_special_tokens=true) does: first the tokenizer.json post_processor
// (TemplateProcessing of Llama-3 prepends <|begin_of_text|>; ByteLevel of
// Qwen2 adds nothing), then, when tokenizer_config.json sets
// add_bos_token / add_eos_token to true, bos_token / eos_token are put at
// the start / end unless already there. No BOS is added otherwise.
//
// EncodeChat renders the chat template with add_generation_prompt=true and
// encodes the result without adding special tokens, because the template
// itself writes bos_token where the model wants one (the HuggingFace and
// vLLM convention for chat requests). Some xLLM service versions encode the
// rendered chat prompt with add_special_tokens=true instead, which for a
// Llama-3 style tokenizer yields two BOS ids; EncodeChatWith with
// ChatOptions.AddSpecialTokens reproduces that where a deployment does it.
//
// # Chat templates
//
// Templates are Jinja2 and are evaluated with github.com/ardanlabs/jinja
// with trim_blocks and lstrip_blocks, as HuggingFace renders them. The
// template source is preprocessed the way Jinja's lexer does it: newlines
// are normalised to "\n" and one trailing newline is dropped. Variables:
// messages (role and content), add_generation_prompt, bos_token, eos_token,
// unk_token, pad_token (those set in tokenizer_config.json), tools and
// documents (none), and any chat_template_kwargs passed in ChatOptions.
// raise_exception, strftime_now, namespace, loop controls, slicing, string
// methods (strip, split, startswith, ...) and the usual filters work.
// Known differences from Python Jinja: `{{ none }}` renders as an empty
// string instead of "None", the % string-formatting operator is not
// supported, dicts print with sorted keys, and attribute access on an
// undefined value yields undefined instead of raising.
//
// # Other limits
//
// Input must be valid UTF-8 (the engine only receives JSON strings, which
// are); invalid input is rejected. Unicode tables are Go's (unicode and
// golang.org/x/text/unicode/norm), which may differ from the Rust crates'
// Unicode version for characters assigned in the newest Unicode releases.
// WordPiece, Unigram and WordLevel models, and pre-tokenizers other than the
// ones listed above (Digits, Punctuation, Whitespace, BertPreTokenizer, the
// DeepSeek-V3 multi-Split sequences, ...) are rejected at Load.
package tokenizer
