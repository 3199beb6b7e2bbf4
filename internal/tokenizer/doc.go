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
// The subset is what real models' files use, checked against Hugging
// Face's own library by the conformance test (conformance_test.go) on the
// files of Qwen3, Llama-3, DeepSeek-V3, Gemma-3, Llama-2, GPT-4o and
// GPT-OSS.
//
// Model: "BPE" with vocab and merges (either "a b" strings or ["a","b"]
// pairs), ignore_merges, byte_fallback, unk_token and fuse_unk; dropout must
// be null, and continuing_subword_prefix / end_of_word_suffix must be empty.
// The model is byte-level (GPT-2, Llama-3, Qwen, DeepSeek style) when the
// pre-tokenizer ends with ByteLevel, else SentencePiece style (Llama-2,
// Gemma): one symbol per character, "▁" for spaces from the normalizer or
// Metaspace, byte_fallback to <0xXX> tokens.
//
// Normalizers: NFC, NFD, NFKC, NFKD, Lowercase (Rust's char::to_lowercase),
// Strip, StripAccents (every mark), Prepend, Replace with a String or Regex
// pattern, and Sequence of these.
//
// Pre-tokenizers: Split with a String or Regex pattern, every behaviour
// (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous) and
// invert; ByteLevel (add_prefix_space, use_regex; it must be the last
// step); Metaspace (replacement, prepend_scheme "always", "first" or
// "never", split); Whitespace, WhitespaceSplit, BertPreTokenizer,
// Punctuation, Digits, CharDelimiterSplit, FixedLength; Sequence of these.
//
// Regex patterns are written for Oniguruma, which the library uses. Each
// pattern is served by the fastest of three kinds that gives the same
// matches (leftmost first, non-overlapping, no empty match right after the
// previous one):
//
//   - hand-written matchers for the patterns of GPT-2 (also ByteLevel's
//     use_regex), Llama-3, Qwen2/2.5/3 (with and without combining marks) and
//     DeepSeek-V3's three splits, recognised by their exact text (split.go);
//   - Go's regexp for patterns without look-around or back-references: its
//     leftmost-first matching chooses what a backtracking engine chooses, in
//     linear time. A trailing `|\s+(?!\S)|\s+`, which Go's syntax cannot
//     express, is taken out and emulated. GPT-4o's and GPT-OSS's pattern run
//     here;
//   - github.com/dlclark/regexp2, a backtracking engine with look-around,
//     for the rest.
//
// Patterns are rewritten first so that \s, \d and \w mean what they mean
// in Oniguruma (White_Space; Nd; letters, marks, numbers and connector
// punctuation), ^ and $ match at line boundaries, and literals under (?i)
// match their whole case-folding orbit ("'ſ" matches (?i)'s). Constructs
// that no published tokenizer uses and whose meaning differs between the
// engines (back-references, possessive quantifiers, \b, nested classes,
// character classes under (?i) for regexp2, inline options other than i)
// fail Load with "unsupported" and the pattern named.
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
// add_special_tokens=true) does with transformers: the tokenizer.json
// post_processor (TemplateProcessing of Llama-2 and Gemma prepends BOS;
// ByteLevel of Qwen adds nothing), except that when tokenizer_config.json
// sets add_bos_token or add_eos_token to true the template becomes
// "[bos_token] $A [eos_token]", as transformers' Llama and Gemma tokenizers
// rebuild it (DeepSeek-V3's files get their BOS this way). A text that
// already starts with BOS gets a second one, as there.
//
// EncodeChat renders the chat template with add_generation_prompt=true and
// encodes the result without adding special tokens, because the template
// itself writes bos_token where the model wants one (the HuggingFace and
// vLLM convention for chat requests). Some engines encode the rendered chat
// prompt with add_special_tokens=true instead, which for a Llama-2 or
// DeepSeek-V3 style tokenizer yields two BOS ids; EncodeChatWith with
// ChatOptions.AddSpecialTokens reproduces that (kvcar's
// --tokenizer_add_special_tokens).
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
// WordPiece, Unigram and WordLevel models, the BertNormalizer, Nmt,
// Precompiled and ByteLevel normalizers, and the UnicodeScripts
// pre-tokenizer are rejected at Load.
package tokenizer
