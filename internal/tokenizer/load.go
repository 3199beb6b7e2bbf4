package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// ErrUnsupported is wrapped by every error that reports a tokenizer.json
// feature outside the supported subset, so callers can tell "this model
// cannot be tokenized here" from a broken file and fall back to routing
// without prefix lookups.
var ErrUnsupported = errors.New("unsupported")

// spec locates a part of a JSON file in error messages.
type spec struct{ file string }

func (s spec) unsupported(path, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w %s", s.file, path, ErrUnsupported, fmt.Sprintf(format, args...))
}

func (s spec) invalid(path, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", s.file, path, fmt.Sprintf(format, args...))
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

type tokenizerJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
}

type addedTokenJSON struct {
	ID         *uint32 `json:"id"`
	Content    string  `json:"content"`
	SingleWord bool    `json:"single_word"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	Normalized *bool   `json:"normalized"`
	Special    bool    `json:"special"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Prepend     *string           `json:"prepend"`
	Pattern     *patternJSON      `json:"pattern"`
	Content     *string           `json:"content"`
	StripLeft   *bool             `json:"strip_left"`
	StripRight  *bool             `json:"strip_right"`
}

type preTokenizerJSON struct {
	Type           string            `json:"type"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        *patternJSON      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Replacement    *string           `json:"replacement"`
	PrependScheme  *string           `json:"prepend_scheme"`
	Split          *bool             `json:"split"`
	// Digits, CharDelimiterSplit, FixedLength.
	IndividualDigits bool    `json:"individual_digits"`
	Delimiter        *string `json:"delimiter"`
	Length           *int    `json:"length"`
}

type templateItemJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type postProcessorJSON struct {
	Type          string             `json:"type"`
	Processors    []json.RawMessage  `json:"processors"`
	Single        []templateItemJSON `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

type decoderJSON struct {
	Type           string            `json:"type"`
	Decoders       []json.RawMessage `json:"decoders"`
	Pattern        *patternJSON      `json:"pattern"`
	Content        *string           `json:"content"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
	Replacement    *string           `json:"replacement"`
	PrependScheme  *string           `json:"prepend_scheme"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// pipeline is everything tokenizer.json defines, ready to run.
type pipeline struct {
	added      []addedToken
	rawAdded   *addedMatcher // normalized=false: matched on the raw text
	normAdded  *addedMatcher // normalized=true: matched after normalizing
	norms      []normStep
	pre        []preStep
	model      *bpeModel
	post       postSpecial
	decoders   []decodeStep
	decoderErr error // set when the decoder is unsupported; Decode reports it
	alpha      *byteLevelAlphabet
	idToToken  []string // vocabulary spelling of every id, "" for holes
	tokenToID  map[string]uint32
}

func loadTokenizerJSON(path string) (*pipeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokenizer: %w", err)
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(data, &tj); err != nil {
		return nil, fmt.Errorf("%s: parse: %w", path, err)
	}
	sp := spec{file: path}
	if !isNull(tj.Truncation) {
		return nil, sp.unsupported("truncation", "truncation settings (they would cut prompts the engine keeps whole)")
	}
	if !isNull(tj.Padding) {
		return nil, sp.unsupported("padding", "padding settings")
	}
	p := &pipeline{alpha: newByteLevelAlphabet()}

	if p.pre, err = parsePreTokenizer(sp, "pre_tokenizer", tj.PreTokenizer); err != nil {
		return nil, err
	}
	byteLevel := false
	for i, st := range p.pre {
		if st.kind != preByteLevel {
			continue
		}
		byteLevel = true
		// Steps after ByteLevel would see text spelled in the byte
		// alphabet, which this pipeline does not produce.
		if i != len(p.pre)-1 {
			return nil, sp.unsupported("pre_tokenizer", "a pre-tokenizer after ByteLevel")
		}
	}
	if p.norms, err = parseNormalizer(sp, "normalizer", tj.Normalizer); err != nil {
		return nil, err
	}
	if err := p.parseModel(sp, tj.Model, byteLevel); err != nil {
		return nil, err
	}
	if err := p.parseAdded(sp, tj.AddedTokens); err != nil {
		return nil, err
	}
	if p.post, err = p.parsePostProcessor(sp, "post_processor", tj.PostProcessor); err != nil {
		return nil, err
	}
	if p.decoders, err = parseDecoder(sp, "decoder", tj.Decoder); err != nil {
		if !errors.Is(err, ErrUnsupported) {
			return nil, err
		}
		// Decoding is diagnostic only; keep the tokenizer usable for
		// encoding and report the problem from Decode.
		p.decoderErr = err
	}
	return p, nil
}

func parseNormalizer(sp spec, path string, raw json.RawMessage) ([]normStep, error) {
	if isNull(raw) {
		return nil, nil
	}
	var nj normalizerJSON
	if err := json.Unmarshal(raw, &nj); err != nil {
		return nil, sp.invalid(path, "%v", err)
	}
	switch nj.Type {
	case "Sequence":
		var out []normStep
		for i, sub := range nj.Normalizers {
			steps, err := parseNormalizer(sp, fmt.Sprintf("%s.normalizers[%d]", path, i), sub)
			if err != nil {
				return nil, err
			}
			out = append(out, steps...)
		}
		return out, nil
	case "NFC":
		return []normStep{{kind: normUnicode, form: norm.NFC}}, nil
	case "NFD":
		return []normStep{{kind: normUnicode, form: norm.NFD}}, nil
	case "NFKC":
		return []normStep{{kind: normUnicode, form: norm.NFKC}}, nil
	case "NFKD":
		return []normStep{{kind: normUnicode, form: norm.NFKD}}, nil
	case "Prepend":
		if nj.Prepend == nil {
			return nil, sp.invalid(path, "Prepend without prepend")
		}
		return []normStep{{kind: normPrepend, prepend: *nj.Prepend}}, nil
	case "Replace":
		if nj.Content == nil {
			return nil, sp.invalid(path+".content", "Replace without content")
		}
		pat, err := parsePattern(sp, path+".pattern", nj.Pattern)
		if err != nil {
			return nil, err
		}
		return []normStep{{kind: normReplace, pat: pat, to: *nj.Content}}, nil
	case "Lowercase":
		return []normStep{{kind: normLowercase}}, nil
	case "Strip":
		st := normStep{kind: normStrip, left: true, right: true}
		if nj.StripLeft != nil {
			st.left = *nj.StripLeft
		}
		if nj.StripRight != nil {
			st.right = *nj.StripRight
		}
		return []normStep{st}, nil
	case "StripAccents":
		return []normStep{{kind: normStripAccents}}, nil
	}
	return nil, sp.unsupported(path+".type", "normalizer %q (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace, Sequence)", nj.Type)
}

// parsePattern reads the pattern of a Split pre-tokenizer or a Replace
// normalizer: {"String": text} (matched literally) or {"Regex": pattern}
// (Oniguruma syntax, as the tokenizers library compiles it).
func parsePattern(sp spec, path string, pj *patternJSON) (*pattern, error) {
	switch {
	case pj == nil || (pj.String == nil) == (pj.Regex == nil):
		return nil, sp.invalid(path, "want exactly one of String and Regex")
	case pj.String != nil:
		if *pj.String == "" {
			return nil, sp.invalid(path+".String", "empty pattern")
		}
		return &pattern{kind: patternLiteral, lit: *pj.String}, nil
	}
	if *pj.Regex == "" {
		return nil, sp.invalid(path+".Regex", "empty pattern")
	}
	p, err := compileRegex(*pj.Regex)
	if err != nil {
		return nil, sp.unsupported(path+".Regex", "%v", err)
	}
	return p, nil
}

func parsePrependScheme(sp spec, path string, scheme *string, addPrefixSpace *bool) (prependScheme, error) {
	if scheme == nil {
		// Files written before prepend_scheme existed used add_prefix_space.
		if addPrefixSpace != nil && !*addPrefixSpace {
			return prependNever, nil
		}
		return prependAlways, nil
	}
	switch *scheme {
	case "always":
		return prependAlways, nil
	case "first":
		return prependFirst, nil
	case "never":
		return prependNever, nil
	}
	return 0, sp.unsupported(path+".prepend_scheme", "prepend_scheme %q", *scheme)
}

func parsePreTokenizer(sp spec, path string, raw json.RawMessage) ([]preStep, error) {
	if isNull(raw) {
		return nil, nil
	}
	var pj preTokenizerJSON
	if err := json.Unmarshal(raw, &pj); err != nil {
		return nil, sp.invalid(path, "%v", err)
	}
	switch pj.Type {
	case "Sequence":
		var out []preStep
		for i, sub := range pj.Pretokenizers {
			steps, err := parsePreTokenizer(sp, fmt.Sprintf("%s.pretokenizers[%d]", path, i), sub)
			if err != nil {
				return nil, err
			}
			out = append(out, steps...)
		}
		return out, nil
	case "Split":
		pat, err := parsePattern(sp, path+".pattern", pj.Pattern)
		if err != nil {
			return nil, err
		}
		behavior, ok := behaviorNames[pj.Behavior]
		if !ok {
			return nil, sp.invalid(path+".behavior", "unknown Split behavior %q", pj.Behavior)
		}
		return []preStep{{kind: preSplit, pat: pat, behavior: behavior, invert: pj.Invert}}, nil
	case "Whitespace":
		// The tokenizers library's `\w+|[^\w\s]+` (Rust regex classes), kept.
		return []preStep{{kind: preSplit, pat: &pattern{kind: patternHand, hand: matchWhitespaceWords}, behavior: behaviorRemoved, invert: true}}, nil
	case "WhitespaceSplit":
		return []preStep{runeSplit(isSpace, behaviorRemoved)}, nil
	case "BertPreTokenizer":
		return []preStep{runeSplit(isSpace, behaviorRemoved), runeSplit(isPunctuation, behaviorIsolated)}, nil
	case "Punctuation":
		behavior := behaviorIsolated
		if pj.Behavior != "" {
			var ok bool
			if behavior, ok = behaviorNames[pj.Behavior]; !ok {
				return nil, sp.invalid(path+".behavior", "unknown Punctuation behavior %q", pj.Behavior)
			}
		}
		return []preStep{runeSplit(isPunctuation, behavior)}, nil
	case "Digits":
		behavior := behaviorContiguous
		if pj.IndividualDigits {
			behavior = behaviorIsolated
		}
		return []preStep{runeSplit(isNumber, behavior)}, nil
	case "CharDelimiterSplit":
		if pj.Delimiter == nil || utf8.RuneCountInString(*pj.Delimiter) != 1 {
			return nil, sp.invalid(path+".delimiter", "want one character")
		}
		d, _ := utf8.DecodeRuneInString(*pj.Delimiter)
		return []preStep{runeSplit(func(r rune) bool { return r == d }, behaviorRemoved)}, nil
	case "FixedLength":
		st := preStep{kind: preFixedLength, length: 5}
		if pj.Length != nil {
			st.length = *pj.Length
		}
		if st.length < 1 {
			return nil, sp.invalid(path+".length", "length %d: must be at least 1", st.length)
		}
		return []preStep{st}, nil
	case "ByteLevel":
		st := preStep{kind: preByteLevel, useRegex: true}
		if pj.AddPrefixSpace != nil {
			st.addPrefixSpace = *pj.AddPrefixSpace
		}
		if pj.UseRegex != nil {
			st.useRegex = *pj.UseRegex
		}
		st.pat = &pattern{kind: patternHand, hand: matchGPT2}
		st.behavior = behaviorIsolated
		return []preStep{st}, nil
	case "Metaspace":
		st := preStep{kind: preMetaspace, replacement: "\u2581", splitOnRep: true}
		if pj.Replacement != nil {
			st.replacement = *pj.Replacement
		}
		if st.replacement == "" {
			return nil, sp.invalid(path+".replacement", "empty Metaspace replacement")
		}
		if pj.Split != nil {
			st.splitOnRep = *pj.Split
		}
		// Every replacement starts a new word.
		st.pat = &pattern{kind: patternLiteral, lit: st.replacement}
		st.behavior = behaviorMergedWithNext
		var err error
		if st.prepend, err = parsePrependScheme(sp, path, pj.PrependScheme, pj.AddPrefixSpace); err != nil {
			return nil, err
		}
		return []preStep{st}, nil
	}
	return nil, sp.unsupported(path+".type", "pre_tokenizer %q (supported: Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, BertPreTokenizer, Punctuation, Digits, CharDelimiterSplit, FixedLength, Sequence)", pj.Type)
}

func parseDecoder(sp spec, path string, raw json.RawMessage) ([]decodeStep, error) {
	if isNull(raw) {
		return nil, nil
	}
	var dj decoderJSON
	if err := json.Unmarshal(raw, &dj); err != nil {
		return nil, sp.invalid(path, "%v", err)
	}
	switch dj.Type {
	case "Sequence":
		var out []decodeStep
		for i, sub := range dj.Decoders {
			steps, err := parseDecoder(sp, fmt.Sprintf("%s.decoders[%d]", path, i), sub)
			if err != nil {
				return nil, err
			}
			out = append(out, steps...)
		}
		return out, nil
	case "ByteLevel":
		return []decodeStep{{kind: decodeByteLevel}}, nil
	case "ByteFallback":
		return []decodeStep{{kind: decodeByteFallback}}, nil
	case "Fuse":
		return []decodeStep{{kind: decodeFuse}}, nil
	case "Replace":
		if dj.Pattern == nil || dj.Pattern.String == nil || dj.Content == nil || *dj.Pattern.String == "" {
			return nil, sp.unsupported(path+".pattern", "decoder Replace without a String pattern")
		}
		return []decodeStep{{kind: decodeReplace, from: *dj.Pattern.String, to: *dj.Content}}, nil
	case "Strip":
		if dj.Content == nil || *dj.Content == "" {
			return nil, sp.invalid(path+".content", "Strip decoder without content")
		}
		return []decodeStep{{kind: decodeStrip, content: *dj.Content, start: dj.Start, stop: dj.Stop}}, nil
	case "Metaspace":
		st := decodeStep{kind: decodeMetaspace, replacement: "\u2581"}
		if dj.Replacement != nil {
			st.replacement = *dj.Replacement
		}
		var err error
		if st.prepend, err = parsePrependScheme(sp, path, dj.PrependScheme, dj.AddPrefixSpace); err != nil {
			return nil, err
		}
		return []decodeStep{st}, nil
	}
	return nil, sp.unsupported(path+".type", "decoder %q", dj.Type)
}

// parseMerges accepts both spellings of model.merges: "a b" strings (files
// written before tokenizers 0.20) and ["a", "b"] pairs (later files, which
// allow spaces inside tokens).
func parseMerges(sp spec, raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err == nil {
		out := make([][2]string, len(lines))
		for i, l := range lines {
			a, b, ok := strings.Cut(l, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, sp.invalid(fmt.Sprintf("model.merges[%d]", i), "merge %q is not two tokens separated by one space", l)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, sp.invalid("model.merges", "neither strings nor pairs: %v", err)
	}
	out := make([][2]string, len(pairs))
	for i, pr := range pairs {
		if len(pr) != 2 {
			return nil, sp.invalid(fmt.Sprintf("model.merges[%d]", i), "merge has %d parts, want 2", len(pr))
		}
		out[i] = [2]string{pr[0], pr[1]}
	}
	return out, nil
}

func (p *pipeline) parseModel(sp spec, raw json.RawMessage, byteLevel bool) error {
	if isNull(raw) {
		return sp.invalid("model", "missing")
	}
	var mj modelJSON
	if err := json.Unmarshal(raw, &mj); err != nil {
		return sp.invalid("model", "%v", err)
	}
	if mj.Type != "BPE" && !(mj.Type == "" && mj.Vocab != nil && mj.Merges != nil) {
		return sp.unsupported("model.type", "model %q (only BPE)", mj.Type)
	}
	if mj.Dropout != nil && *mj.Dropout != 0 {
		return sp.unsupported("model.dropout", "BPE dropout %v (random merges cannot match the engine)", *mj.Dropout)
	}
	if mj.ContinuingSubwordPrefix != nil && *mj.ContinuingSubwordPrefix != "" {
		return sp.unsupported("model.continuing_subword_prefix", "continuing_subword_prefix %q", *mj.ContinuingSubwordPrefix)
	}
	if mj.EndOfWordSuffix != nil && *mj.EndOfWordSuffix != "" {
		return sp.unsupported("model.end_of_word_suffix", "end_of_word_suffix %q", *mj.EndOfWordSuffix)
	}
	if len(mj.Vocab) == 0 {
		return sp.invalid("model.vocab", "empty vocabulary")
	}
	merges, err := parseMerges(sp, mj.Merges)
	if err != nil {
		return err
	}

	m := &bpeModel{
		byteLevel:    byteLevel,
		words:        make(map[string]uint32, len(mj.Vocab)),
		merges:       make(map[uint64]mergeRule, len(merges)),
		ignoreMerges: mj.IgnoreMerges,
		byteFallback: mj.ByteFallback,
		fuseUnk:      mj.FuseUnk,
		unk:          -1,
	}
	p.tokenToID = mj.Vocab
	maxID := uint32(0)
	for tok, id := range mj.Vocab {
		maxID = max(maxID, id)
		key := tok
		if byteLevel {
			raw, ok := p.alpha.decode(tok)
			if !ok {
				// Not spelled in the byte alphabet: byte-level input can
				// never produce it, only an added token can.
				continue
			}
			key = raw
		}
		m.words[key] = id
	}
	p.idToToken = make([]string, maxID+1)
	for tok, id := range mj.Vocab {
		p.idToToken[id] = tok
	}
	for i := range m.unit {
		m.unit[i] = -1
		m.fallback[i] = -1
	}
	if byteLevel {
		for b := range 256 {
			if id, ok := m.words[string([]byte{byte(b)})]; ok {
				m.unit[b] = int64(id)
			}
		}
	}
	if mj.ByteFallback {
		for b := range 256 {
			if id, ok := mj.Vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
				m.fallback[b] = int64(id)
			}
		}
	}
	if mj.UnkToken != nil {
		id, ok := mj.Vocab[*mj.UnkToken]
		if !ok {
			return sp.invalid("model.unk_token", "unk_token %q is not in the vocabulary", *mj.UnkToken)
		}
		m.unk = int64(id)
	}
	for rank, pr := range merges {
		a, okA := mj.Vocab[pr[0]]
		b, okB := mj.Vocab[pr[1]]
		c, okC := mj.Vocab[pr[0]+pr[1]]
		if !okA || !okB || !okC {
			return sp.invalid(fmt.Sprintf("model.merges[%d]", rank), "merge %q + %q uses or makes a token missing from the vocabulary", pr[0], pr[1])
		}
		// A later duplicate overrides an earlier one, as when the
		// tokenizers library collects merges into its map.
		m.merges[pairKey(a, b)] = mergeRule{rank: uint32(rank), id: c}
	}
	p.model = m
	return nil
}

func (p *pipeline) parseAdded(sp spec, list []addedTokenJSON) error {
	var raw, normed []addedToken
	for i, a := range list {
		if a.ID == nil {
			return sp.invalid(fmt.Sprintf("added_tokens[%d]", i), "missing id")
		}
		if a.Content == "" {
			return sp.invalid(fmt.Sprintf("added_tokens[%d]", i), "empty content")
		}
		t := addedToken{
			id: *a.ID, content: a.Content, special: a.Special,
			singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip,
			// The tokenizers library defaults normalized to !special.
			normalized: !a.Special,
		}
		if a.Normalized != nil {
			t.normalized = *a.Normalized
		}
		p.added = append(p.added, t)
		if int(t.id) >= len(p.idToToken) {
			grown := make([]string, t.id+1)
			copy(grown, p.idToToken)
			p.idToToken = grown
		}
		p.idToToken[t.id] = t.content
		if t.normalized {
			// The library matches normalized tokens in normalized text,
			// so it normalizes their content too.
			nt := t
			nt.content = applyNorms(p.norms, t.content)
			if nt.content != "" {
				normed = append(normed, nt)
			}
		} else {
			raw = append(raw, t)
		}
	}
	p.rawAdded = newAddedMatcher(raw)
	p.normAdded = newAddedMatcher(normed)
	return nil
}

// tokenID resolves a token string as the tokenizers library's token_to_id:
// added tokens first, then the vocabulary.
func (p *pipeline) tokenID(tok string) (uint32, bool) {
	for _, a := range p.added {
		if a.content == tok {
			return a.id, true
		}
	}
	id, ok := p.tokenToID[tok]
	return id, ok
}

// jsonTokenRef decodes the ["token", id] pairs of RobertaProcessing and
// BertProcessing.
func jsonTokenRef(sp spec, path string, parts []json.RawMessage) (uint32, error) {
	if len(parts) != 2 {
		return 0, sp.invalid(path, "want [token, id]")
	}
	var id uint32
	if err := json.Unmarshal(parts[1], &id); err != nil {
		return 0, sp.invalid(path, "id: %v", err)
	}
	return id, nil
}

func (p *pipeline) parsePostProcessor(sp spec, path string, raw json.RawMessage) (postSpecial, error) {
	var out postSpecial
	if isNull(raw) {
		return out, nil
	}
	var pj postProcessorJSON
	if err := json.Unmarshal(raw, &pj); err != nil {
		return out, sp.invalid(path, "%v", err)
	}
	switch pj.Type {
	case "ByteLevel":
		// Only trims offsets; adds no ids.
		return out, nil
	case "Sequence":
		for i, sub := range pj.Processors {
			inner, err := p.parsePostProcessor(sp, fmt.Sprintf("%s.processors[%d]", path, i), sub)
			if err != nil {
				return out, err
			}
			// Each processor wraps what the previous one produced.
			out.prefix = append(append([]uint32(nil), inner.prefix...), out.prefix...)
			out.suffix = append(out.suffix, inner.suffix...)
		}
		return out, nil
	case "TemplateProcessing":
		seen := false
		for i, item := range pj.Single {
			ip := fmt.Sprintf("%s.single[%d]", path, i)
			switch {
			case item.Sequence != nil:
				if item.Sequence.ID != "A" || seen {
					return out, sp.unsupported(ip, "single template sequence %q (only one $A)", item.Sequence.ID)
				}
				seen = true
			case item.SpecialToken != nil:
				st, ok := pj.SpecialTokens[item.SpecialToken.ID]
				if !ok {
					return out, sp.invalid(ip, "special token %q missing from special_tokens", item.SpecialToken.ID)
				}
				if seen {
					out.suffix = append(out.suffix, st.IDs...)
				} else {
					out.prefix = append(out.prefix, st.IDs...)
				}
			default:
				return out, sp.invalid(ip, "template item is neither SpecialToken nor Sequence")
			}
		}
		if !seen {
			return out, sp.invalid(path+".single", "template without $A")
		}
		return out, nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := jsonTokenRef(sp, path+".cls", pj.Cls)
		if err != nil {
			return out, err
		}
		sep, err := jsonTokenRef(sp, path+".sep", pj.Sep)
		if err != nil {
			return out, err
		}
		out.prefix = []uint32{cls}
		out.suffix = []uint32{sep}
		return out, nil
	}
	return out, sp.unsupported(path+".type", "post_processor %q (supported: ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing, Sequence)", pj.Type)
}
