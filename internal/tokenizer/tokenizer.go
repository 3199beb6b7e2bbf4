package tokenizer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// ErrInvalidUTF8 is returned for input text that is not valid UTF-8. The
// engine only ever sees JSON strings, which are valid UTF-8, so such input
// has no engine-side token ids to reproduce.
var ErrInvalidUTF8 = errors.New("text is not valid UTF-8")

// Tokenizer encodes text and chat conversations into token ids. It is
// immutable after Load and safe for concurrent use.
type Tokenizer struct {
	dir   string
	p     *pipeline
	cache *wordCache

	// special is what AddSpecialTokens puts around the text.
	special postSpecial
	tokens  map[string]string // bos_token, eos_token, ... for templates

	tmpl *jinja.Template
}

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// and the chat template files (see the package documentation). It performs
// no network access.
func Load(dir string) (*Tokenizer, error) {
	p, err := loadTokenizerJSON(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{dir: dir, p: p, cache: newWordCache()}
	cfg, err := loadConfig(dir)
	if err != nil {
		return nil, err
	}
	t.tokens = cfg.tokens
	t.special = p.post
	if cfg.addBOS || cfg.addEOS {
		// transformers' Llama and Gemma tokenizers replace the
		// post_processor with "[bos] $A [eos]" when the config asks for
		// either; a configured token without an id is skipped.
		t.special = postSpecial{}
		if id, ok := p.tokenID(cfg.tokens["bos_token"]); cfg.addBOS && ok {
			t.special.prefix = []uint32{id}
		}
		if id, ok := p.tokenID(cfg.tokens["eos_token"]); cfg.addEOS && ok {
			t.special.suffix = []uint32{id}
		}
	}
	if cfg.template != "" {
		tmpl, err := compileTemplate(cfg.template)
		if err != nil {
			return nil, fmt.Errorf("%s: chat template: %w", cfg.templateFile, err)
		}
		t.tmpl = tmpl
	}
	return t, nil
}

// Dir is the directory the tokenizer was loaded from.
func (t *Tokenizer) Dir() string { return t.dir }

// VocabSize is one more than the highest token id, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.p.idToToken) }

// TokenID returns the id of a token given in its vocabulary spelling (for
// byte-level models "Ġhello", not " hello"), added tokens first.
func (t *Tokenizer) TokenID(token string) (uint32, bool) { return t.p.tokenID(token) }

// HasChatTemplate reports whether a chat template was found.
func (t *Tokenizer) HasChatTemplate() bool { return t.tmpl != nil }

// EncodeOptions selects how Encode treats special tokens.
type EncodeOptions struct {
	// AddSpecialTokens applies the tokenizer.json post_processor and the
	// add_bos_token / add_eos_token settings, like the engine's
	// encode(text, add_special_tokens=true).
	AddSpecialTokens bool
}

// Encode appends the token ids of text to dst and returns the extended
// slice. It adds special tokens as the engine does for a completion prompt:
// see EncodeOptions.AddSpecialTokens and the package documentation. Added
// tokens written in text (such as "<|im_start|>") map to their ids.
func (t *Tokenizer) Encode(text string, dst []uint32) ([]uint32, error) {
	return t.EncodeWith(text, EncodeOptions{AddSpecialTokens: true}, dst)
}

// EncodeWith is Encode with explicit options.
func (t *Tokenizer) EncodeWith(text string, opts EncodeOptions, dst []uint32) ([]uint32, error) {
	return t.encode(context.Background(), text, opts, dst)
}

// EncodeContext is Encode that gives up once ctx ends, returning dst
// unextended and ctx's error: a caller whose client has gone stops paying
// for a long text. The context is looked at between words and, inside a
// long word, every cancelCheckEvery merges, so its cost is not measurable.
func (t *Tokenizer) EncodeContext(ctx context.Context, text string, dst []uint32) ([]uint32, error) {
	return t.encode(ctx, text, EncodeOptions{AddSpecialTokens: true}, dst)
}

func (t *Tokenizer) encode(ctx context.Context, text string, opts EncodeOptions, dst []uint32) ([]uint32, error) {
	if !utf8.ValidString(text) {
		return dst, ErrInvalidUTF8
	}
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	start := len(dst)
	if opts.AddSpecialTokens {
		dst = append(dst, t.special.prefix...)
	}
	e := encoder{t: t, dst: dst}
	if done := ctx.Done(); done != nil {
		e.cancel = &canceller{done: done}
	}
	e.run(text)
	if e.cancel.stopped() {
		return e.dst[:start], ctx.Err()
	}
	dst = e.dst
	if opts.AddSpecialTokens {
		dst = append(dst, t.special.suffix...)
	}
	return dst, nil
}

// cancelCheckEvery is how many words, or merges of one long word, pass
// between two looks at the context.
const cancelCheckEvery = 1024

// encoder carries one Encode call through the pipeline.
type encoder struct {
	t   *Tokenizer
	dst []uint32
	// words, when set, collects the pre-tokenized words instead of
	// encoding them (tests compare them with the reference library's).
	words *[]string
	// cutters holds one cutter per pre-tokenizer step (a step is never
	// active twice at once), in the array when there are few steps.
	cutters []cutter
	array   [6]cutter
	// cancel watches the caller's context; nil when it cannot end.
	cancel *canceller
}

// canceller watches the context of one Encode call. Once it has seen the
// context end, every step of the call returns at once.
type canceller struct {
	done <-chan struct{}
	work int
	seen bool
}

// stop reports whether the context has ended, looking at it once per
// cancelCheckEvery calls. A nil canceller never stops.
func (c *canceller) stop() bool {
	if c == nil {
		return false
	}
	if c.seen {
		return true
	}
	if c.work++; c.work%cancelCheckEvery != 0 {
		return false
	}
	select {
	case <-c.done:
		c.seen = true
	default:
	}
	return c.seen
}

// stopped reports whether stop has seen the context end.
func (c *canceller) stopped() bool { return c != nil && c.seen }

func (e *encoder) run(text string) {
	p := e.t.p
	p.rawAdded.split(text,
		func(seg string, off int) { e.segment(seg, off == 0) },
		func(id uint32) { e.dst = append(e.dst, id) })
}

// segment handles a stretch of text between added tokens: normalize, find
// normalized added tokens, pre-tokenize, BPE.
func (e *encoder) segment(seg string, atStart bool) {
	p := e.t.p
	seg = applyNorms(p.norms, seg)
	p.normAdded.split(seg,
		func(sub string, off int) { e.pre(0, sub, atStart && off == 0) },
		func(id uint32) { e.dst = append(e.dst, id) })
}

// pre runs pre-tokenizer step i over s and hands the resulting words to the
// next step, the last step handing them to the model. atStart tells whether
// s begins at the start of the input, which Metaspace's "first" needs.
func (e *encoder) pre(i int, s string, atStart bool) {
	if s == "" {
		return
	}
	steps := e.t.p.pre
	if i == len(steps) {
		e.word(s)
		return
	}
	st := &steps[i]
	switch st.kind {
	case preSplit:
		e.split(i, s, atStart, st)
	case preByteLevel:
		// Applied to every piece it is given, as in the tokenizers library.
		if st.addPrefixSpace && !strings.HasPrefix(s, " ") {
			s = " " + s
		}
		if st.useRegex {
			e.split(i, s, atStart, st)
		} else {
			e.pre(i+1, s, atStart)
		}
	case preMetaspace:
		s = strings.ReplaceAll(s, " ", st.replacement)
		if !strings.HasPrefix(s, st.replacement) &&
			(st.prepend == prependAlways || (st.prepend == prependFirst && atStart)) {
			s = st.replacement + s
		}
		if !st.splitOnRep {
			e.pre(i+1, s, atStart)
			return
		}
		e.split(i, s, atStart, st)
	case preFixedLength:
		from, n := 0, 0
		for k := range s {
			if n == st.length {
				e.pre(i+1, s[from:k], atStart && from == 0)
				from, n = k, 0
			}
			n++
		}
		e.pre(i+1, s[from:], atStart && from == 0)
	}
}

// split cuts s with step i's pattern and behaviour and hands the pieces to
// the next step.
func (e *encoder) split(i int, s string, atStart bool, st *preStep) {
	if e.cancel.stopped() {
		return
	}
	if e.cutters == nil {
		if n := len(e.t.p.pre); n <= len(e.array) {
			e.cutters = e.array[:n]
		} else {
			e.cutters = make([]cutter, n)
		}
	}
	c := &e.cutters[i]
	c.reset(e, i, st, s, atStart)
	st.pat.each(s, c)
	c.finish()
}

// word runs the BPE model on one word, through the cache.
func (e *encoder) word(w string) {
	if e.cancel.stop() {
		return
	}
	if e.words != nil {
		*e.words = append(*e.words, w)
		return
	}
	m := e.t.p.model
	if len(w) > maxCachedWord {
		e.dst = m.encodeWord(w, e.dst, e.cancel)
		return
	}
	c := e.t.cache
	if ids, ok := c.get(w); ok {
		e.dst = append(e.dst, ids...)
		return
	}
	start := len(e.dst)
	e.dst = m.encodeWord(w, e.dst, e.cancel)
	if !e.cancel.stopped() {
		c.put(w, e.dst[start:])
	}
}

// Decode turns ids back into text with the tokenizer.json decoder, special
// tokens included. For byte-level models, ids that cut a multi-byte
// character yield U+FFFD, as in the tokenizers library.
func (t *Tokenizer) Decode(ids []uint32) (string, error) {
	if t.p.decoderErr != nil {
		return "", t.p.decoderErr
	}
	toks := make([]string, len(ids))
	for i, id := range ids {
		if int(id) >= len(t.p.idToToken) || t.p.idToToken[id] == "" {
			return "", fmt.Errorf("decode: unknown token id %d", id)
		}
		toks[i] = t.p.idToToken[id]
	}
	for i := range t.p.decoders {
		toks = t.p.decoders[i].apply(toks, t.p.alpha)
	}
	return strings.Join(toks, ""), nil
}

// maxCachedWord bounds the words kept in the cache: long words are rare,
// would crowd out the common ones, and would pin large strings.
const maxCachedWord = 64

// wordCacheShardCap bounds each shard; a full shard is emptied rather than
// evicted entry by entry, which keeps the hot path a plain map access.
const wordCacheShardCap = 4096

// wordCache memoises the ids of recently seen words, as the tokenizers
// library does, guarded per shard so concurrent encoders rarely contend.
type wordCache struct {
	seed   maphash.Seed
	shards [16]struct {
		mu sync.Mutex
		m  map[string][]uint32
	}
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func (c *wordCache) shard(w string) int {
	return int(maphash.String(c.seed, w) & uint64(len(c.shards)-1))
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := &c.shards[c.shard(w)]
	s.mu.Lock()
	ids, ok := s.m[w]
	s.mu.Unlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	// Clone both: w points into the caller's prompt and ids into its
	// output buffer.
	k := strings.Clone(w)
	v := append([]uint32(nil), ids...)
	s := &c.shards[c.shard(w)]
	s.mu.Lock()
	if len(s.m) >= wordCacheShardCap {
		clear(s.m)
	}
	s.m[k] = v
	s.mu.Unlock()
}

// fileExists reports whether path names a regular file.
func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
