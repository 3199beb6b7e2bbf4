package kvevent

import (
	"bytes"
	"encoding/binary"

	"github.com/tinylib/msgp/msgp"
)

// Events of one block repeat their neighbours' bytes. Every BlockStored of
// SGLang's radix cache, or of a batch of decode steps, names the same keys
// in the same order with the same medium and block size, and differs from
// the one before only in its hash, its parent and its token ids; every
// BlockRemoved of vLLM's and SGLang's evictions differs only in its hash.
// Decoded field by field such an event costs 55–100 ns, as much as a
// hundred of its token ids. A template is the last event of its kind that
// the general decoder made: the next event is checked against its bytes,
// and only the values that may differ are read, by the same functions the
// general decoder reads them with. An event whose fixed bytes differ
// anywhere goes to the general decoder and becomes the template.
//
// Equal fixed bytes decode to equal fields: the decoder is a function of
// the bytes, and the values read in the slots (a hash, a parent, a token
// array) consume exactly their own bytes, so every later field starts
// where the template's did. The counts in the fixed bytes (hashes, token
// ids) are the template's, which passed finishEvent's checks. A template
// is only made of a plain-text event, with at most one field each of
// hashes, parent and token ids, so that the slots' values alone make the
// event.
//
// The cost stays bounded by the message: each event is compared with at
// most the two templates, only the BlockStored one reads token ids, an
// event both fail on is decoded once more field by field, and making it a
// template passes over its bytes again but for its token ids. A token id
// is thus read at most twice, any other byte at most four times.

// maxTemplateHashes bounds the hashes of an event a template is made of:
// an event of more blocks spreads its fields' cost over its blocks.
const maxTemplateHashes = 4

type slotKind uint8

const (
	slotHash slotKind = iota
	slotParent
	slotTokens
)

// slot is a value of the template that later events may change: bytes
// [off, off+hdr) of the template are fixed (the value's type, and its
// length or count), bytes [off+hdr, end) may differ, and for token ids
// may have another length.
type slot struct {
	off, hdr, end int
	kind          slotKind
}

// template is an event the general decoder made, in the message being
// decoded.
type template struct {
	ok      bool
	inArray bool
	n       int
	src     []byte // the event's encoding
	ev      Event  // its kind, medium, block size and parent
	slots   [maxTemplateHashes + 2]slot
	// fixed holds, for each run of fixed bytes (before each slot's
	// value, then after the last), its first 16 bytes as words.
	fixed [maxTemplateHashes + 3]fixedWords
}

// fixedWords is up to 16 fixed bytes as two little-endian words and the
// masks of the bytes they hold. Comparing them as two words costs a
// fraction of a call to compare bytes, which an event makes two to four
// of. Tagged arrays have runs that short but for vLLM's last; tagged
// maps, whose runs hold keys, some (a removal's medium, a token array's
// key and header).
type fixedWords struct {
	lo, hi, mlo, mhi uint64
	short            bool // the run is at most 16 bytes
}

// set makes w the words of run b.
func (w *fixedWords) set(b []byte) {
	*w = fixedWords{short: len(b) <= 16}
	if !w.short {
		return
	}
	var buf [16]byte
	copy(buf[:], b)
	w.lo, w.hi = binary.LittleEndian.Uint64(buf[:]), binary.LittleEndian.Uint64(buf[8:])
	for i := range len(b) {
		if i < 8 {
			w.mlo |= 0xff << (8 * i)
		} else {
			w.mhi |= 0xff << (8 * (i - 8))
		}
	}
}

// startsWith reports whether p starts with run, whose words w are.
func (w *fixedWords) startsWith(p, run []byte) bool {
	if w.short && len(p) >= 16 {
		a, b := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
		return (a^w.lo)&w.mlo|(b^w.hi)&w.mhi == 0
	}
	return bytes.HasPrefix(p, run)
}

// templates holds a message's last BlockStored and BlockRemoved templates.
type templates struct {
	t      [2]template
	last   int // the template that served or was made last
	served int // events decoded with a template, for tests
}

// reset drops the templates, and with them the message they point into:
// a batch kept between messages must not keep a large one alive.
func (ts *templates) reset() {
	for i := range ts.t {
		ts.t[i].ok, ts.t[i].src = false, nil
	}
}

// decode decodes the event at p with a template, trying first the one
// that served last. It reports false, with b as it was, when neither
// template's fixed bytes match or a slot's value does not read; the
// general decoder then decodes the event and reports any error.
func (ts *templates) decode(p []byte, b *Batch, ev *Event) ([]byte, bool) {
	k := ts.last
	if t := &ts.t[k]; t.ok {
		if rest, ok := t.decode(p, b, ev); ok {
			ts.served++
			return rest, true
		}
	}
	if t := &ts.t[1-k]; t.ok {
		if rest, ok := t.decode(p, b, ev); ok {
			ts.last = 1 - k
			ts.served++
			return rest, true
		}
	}
	return p, false
}

// learn makes src, which the general decoder has just made ev of, the
// template of ev's kind, or leaves that kind without one when src cannot
// serve as one. tokensTail is how many bytes of src follow its token
// array, if it has one: the decoder has just walked it, and skipping it
// again would cost as much as the template saves.
func (ts *templates) learn(src []byte, ev *Event, tokensTail int) {
	k := 0
	switch ev.Kind {
	case BlockStored:
	case BlockRemoved:
		k = 1
	default:
		return
	}
	t := &ts.t[k]
	t.ok = ev.PlainText && len(ev.BlockHashes) <= maxTemplateHashes && t.learn(src, ev, tokensTail)
	if t.ok {
		ts.last = k
	}
}

func (t *template) learn(src []byte, ev *Event, tokensTail int) bool {
	t.src, t.n = src, 0
	t.ev = Event{Kind: ev.Kind, Medium: ev.Medium, HasParent: ev.HasParent, ParentHash: ev.ParentHash,
		BlockSize: ev.BlockSize, PlainText: true}
	var (
		p    = src
		n    int
		seen [fieldUnknown + 1]bool
		err  error
	)
	switch msgp.NextType(p) {
	case msgp.MapType:
		t.inArray = false
		if n, p, err = readMapHeader(p, "event"); err != nil {
			return false
		}
		for range n {
			var key []byte
			if key, p, err = readStr(p, "event: key"); err != nil {
				return false
			}
			f := fieldUnknown
			if string(key) != keyType {
				f = fieldOfKey(key)
			}
			if p = t.add(src, p, f, tokensTail, &seen); p == nil {
				return false
			}
		}
	case msgp.ArrayType:
		t.inArray = true
		if n, p, err = readArrayHeader(p, "event", 1); err != nil || n == 0 {
			return false
		}
		if _, p, err = readStr(p, keyType); err != nil {
			return false
		}
		for i := 1; i < n; i++ {
			if p = t.add(src, p, arrayField(t.ev.Kind, i-1), tokensTail, &seen); p == nil {
				return false
			}
		}
	default:
		return false
	}
	if len(p) != 0 {
		return false
	}
	at := 0
	for i := range t.n {
		t.fixed[i].set(src[at : t.slots[i].off+t.slots[i].hdr])
		at = t.slots[i].end
	}
	t.fixed[t.n].set(src[at:])
	return true
}

// add passes over the value of field f at p, adding the slots it holds,
// and returns what follows it; nil when the value does not read or f
// repeats a field that has slots.
func (t *template) add(src, p []byte, f field, tokensTail int, seen *[fieldUnknown + 1]bool) []byte {
	stored := t.ev.Kind == BlockStored
	switch {
	case f == fieldHashes, stored && (f == fieldParent || f == fieldTokens):
		if seen[f] {
			return nil
		}
		seen[f] = true
	}
	var err error
	switch {
	case f == fieldHashes:
		var n int
		// The count is checked here, not only the event's: a map may
		// give its hashes twice, and the event holds the last array.
		if n, p, err = readArrayHeader(p, keyBlockHashes, 1); err != nil || n > maxTemplateHashes {
			return nil
		}
		for range n {
			off := len(src) - len(p)
			if _, p, err = readHash(p); err != nil {
				return nil
			}
			if !t.push(slot{off: off, hdr: hashHeader(src[off]), end: len(src) - len(p), kind: slotHash}) {
				return nil
			}
		}
		return p
	case stored && f == fieldParent && !msgp.IsNil(p):
		off := len(src) - len(p)
		if _, p, err = readHash(p); err != nil {
			return nil
		}
		if !t.push(slot{off: off, hdr: hashHeader(src[off]), end: len(src) - len(p), kind: slotParent}) {
			return nil
		}
		return p
	case stored && f == fieldTokens:
		off := len(src) - len(p)
		_, q, err := readArrayHeader(p, keyTokenIDs, 1)
		if err != nil || tokensTail < 0 || tokensTail > len(q) {
			return nil
		}
		if !t.push(slot{off: off, hdr: len(src) - off - len(q), end: len(src) - tokensTail, kind: slotTokens}) {
			return nil
		}
		return src[len(src)-tokensTail:]
	}
	if p, err = msgp.Skip(p); err != nil {
		return nil
	}
	return p
}

// push adds s, reporting false when the template has no room left for
// it: the event cannot serve as one.
func (t *template) push(s slot) bool {
	if t.n == len(t.slots) {
		return false
	}
	t.slots[t.n] = s
	t.n++
	return true
}

// hashHeader is how many bytes of a hash encoded from byte c on say its
// type and length: the value of an integer follows its type byte (a
// fixint is all header), that of a bin or str its length.
func hashHeader(c byte) int {
	switch c {
	case 0xc4, 0xd9: // bin 8, str 8
		return 2
	case 0xc5, 0xda:
		return 3
	case 0xc6, 0xdb:
		return 5
	}
	return 1
}

// decode decodes the event at p into ev if its fixed bytes are the
// template's and its slots' values read. On false b is as it was.
func (t *template) decode(p []byte, b *Batch, ev *Event) ([]byte, bool) {
	p0, nh, nt := p, len(b.hashes), len(b.tokens)
	var (
		tokens    []uint32
		ctx       bool
		err       error
		at        int
		hasParent = t.ev.HasParent
		parent    = t.ev.ParentHash
	)
	for i := range t.n {
		s := &t.slots[i]
		fixed := t.src[at : s.off+s.hdr]
		if !t.fixed[i].startsWith(p, fixed) {
			goto miss
		}
		p = p[len(fixed)-s.hdr:]
		if s.kind == slotTokens {
			if tokens, ctx, p, err = readTokens(p, b); err != nil {
				goto miss
			}
		} else {
			var h EngineHash
			var rest []byte
			if h, rest, err = readHash(p); err != nil || len(p)-len(rest) != s.end-s.off {
				goto miss
			}
			p = rest
			switch {
			case s.kind == slotHash:
				b.hashes = append(b.hashes, h)
			case t.inArray && h == (EngineHash{}):
				hasParent, parent = false, EngineHash{}
			default:
				hasParent, parent = true, h
			}
		}
		at = s.end
	}
	if !t.fixed[t.n].startsWith(p, t.src[at:]) {
		goto miss
	}
	// Every field of Event, one by one: a copy of a whole Event built in
	// parts would load it in wide words its narrow stores have not
	// finished, a stall of several nanoseconds an event.
	ev.Kind, ev.Medium, ev.BlockSize = t.ev.Kind, t.ev.Medium, t.ev.BlockSize
	ev.BlockHashes = b.hashes[nh:len(b.hashes):len(b.hashes)]
	ev.HasParent, ev.ParentHash = hasParent, parent
	ev.TokenIDs, ev.PlainText = tokens, !ctx
	return p[len(t.src)-at:], true
miss:
	b.hashes, b.tokens = b.hashes[:nh], b.tokens[:nt]
	return p0, false
}
