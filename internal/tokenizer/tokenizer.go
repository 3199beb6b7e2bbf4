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

	bos, eos       specialRef
	addBOS, addEOS bool
	tokens         map[string]string // bos_token, eos_token, ... for templates

	tmpl *jinja.Template
}

// specialRef is a special token named in tokenizer_config.json.
type specialRef struct {
	text string
	id   uint32
	ok   bool // text is set and has an id
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
	t.addBOS, t.addEOS = cfg.addBOS, cfg.addEOS
	for _, ref := range []struct {
		dst  *specialRef
		name string
	}{{&t.bos, "bos_token"}, {&t.eos, "eos_token"}} {
		text, set := cfg.tokens[ref.name]
		if !set {
			continue
		}
		ref.dst.text = text
		// The engine skips a configured BOS/EOS whose id it cannot find,
		// so an unknown token is not an error here either.
		ref.dst.id, ref.dst.ok = p.tokenID(text)
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
		dst = append(dst, t.p.post.prefix...)
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
	if !opts.AddSpecialTokens {
		return dst, nil
	}
	dst = append(dst, t.p.post.suffix...)
	// The engine adds the configured BOS/EOS after the post_processor,
	// unless the post_processor already put that token there.
	if t.addBOS && t.bos.ok && (len(dst) == start || dst[start] != t.bos.id) {
		dst = append(dst, 0)
		copy(dst[start+1:], dst[start:len(dst)-1])
		dst[start] = t.bos.id
	}
	if t.addEOS && t.eos.ok && (len(dst) == start || dst[len(dst)-1] != t.eos.id) {
		dst = append(dst, t.eos.id)
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
		e.split(i, s, atStart, st.match)
	case preByteLevel:
		// Applied to every piece it is given, as in the tokenizers library.
		if st.addPrefixSpace && !strings.HasPrefix(s, " ") {
			s = " " + s
		}
		if st.useRegex {
			e.split(i, s, atStart, matchGPT2)
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
		// MergedWithNext: every replacement starts a new word.
		from := 0
		for {
			// from < len(s) here; searching from from+1 skips the
			// replacement that starts the current word.
			k := strings.Index(s[from+1:], st.replacement)
			if k < 0 {
				break
			}
			e.pre(i+1, s[from:from+1+k], atStart && from == 0)
			from += 1 + k
		}
		e.pre(i+1, s[from:], atStart && from == 0)
	}
}

// split cuts s with a pattern matcher, Isolated behaviour: matches and the
// gaps between them both become words.
func (e *encoder) split(i int, s string, atStart bool, match matcher) {
	gap := 0
	for pos := 0; pos < len(s); {
		if e.cancel.stopped() {
			return
		}
		end := match(s, pos)
		if end < 0 {
			_, n := utf8.DecodeRuneInString(s[pos:])
			pos += n
			continue
		}
		if gap < pos {
			e.pre(i+1, s[gap:pos], atStart && gap == 0)
		}
		e.pre(i+1, s[pos:end], atStart && pos == 0)
		pos, gap = end, end
	}
	if gap < len(s) {
		e.pre(i+1, s[gap:], atStart && gap == 0)
	}
}

// word runs the BPE model on one word, through the cache.
func (e *encoder) word(w string) {
	if e.cancel.stop() {
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
