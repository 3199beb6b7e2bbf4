package kvevent

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// decodeBothWays decodes payload with templates and field by field, and
// fails unless both give the same batch or the same error. It returns
// how many events templates decoded.
func decodeBothWays(t testing.TB, d *Decoder, payload []byte, with, without *Batch) int {
	t.Helper()
	without.generalOnly = true
	served := 0
	if with.tmpl != nil {
		served = with.tmpl.served
	}
	errWith := d.DecodeBatch(payload, with)
	errWithout := d.DecodeBatch(payload, without)
	switch {
	case (errWith == nil) != (errWithout == nil),
		errors.Is(errWith, ErrDecoderFault), errors.Is(errWithout, ErrDecoderFault):
		t.Fatalf("with templates: %v; field by field: %v", errWith, errWithout)
	case errWith != nil && errWith.Error() != errWithout.Error():
		t.Fatalf("errors differ:\n with templates: %v\n field by field: %v", errWith, errWithout)
	case !sameBatch(with, without):
		t.Fatalf("batches differ:\n with templates: %+v\n field by field: %+v", with.Events, without.Events)
	}
	if errWith == nil {
		if got, limit := with.StorageBytes(), MaxStorageBytes(len(payload)); got > limit {
			t.Fatalf("storage %d bytes over the bound %d", got, limit)
		}
	}
	if with.tmpl == nil {
		return 0
	}
	return with.tmpl.served - served
}

// templateBatch is a message of the kind templates serve: runs of
// events alike, one-block stores chained or not and removals of one
// block, between runs of others, with the changes that must send an
// event back to the general decoder: a root, a multi-block or empty
// event, another medium, block size or hash width, a replica without
// tokens, an event that is not plain text, a clear.
func templateBatch(rng *rand.Rand) *Batch {
	b := &Batch{Timestamp: 1.7e9, HasDPRank: true, DPRank: 1}
	id := func() uint32 {
		switch rng.IntN(4) {
		case 0:
			return uint32(rng.IntN(128))
		case 1:
			return uint32(rng.IntN(256))
		case 2:
			return uint32(rng.IntN(65536))
		}
		return uint32(rng.IntN(151936))
	}
	// A run's hashes keep one width: a fixint (all header), 16 bits or 64.
	hash := func(width int) EngineHash {
		switch width {
		case 0:
			return IntHash(uint64(rng.IntN(128)))
		case 1:
			return IntHash(uint64(rng.IntN(1<<16-256) + 256))
		}
		return IntHash(rng.Uint64() | 1<<63)
	}
	pick := func(rare int) bool { return rng.IntN(rare) == 0 }
	var last EngineHash
	for len(b.Events) < 40 {
		m := Device
		if pick(6) {
			m = Host
		}
		width := 2
		if pick(6) {
			width = rng.IntN(2)
		}
		blocks := 1
		if pick(5) {
			blocks = rng.IntN(7) // 0 blocks, or more than a template takes
		}
		run := 1 + rng.IntN(8)
		switch r := rng.IntN(20); {
		case r < 11:
			bs := 4
			if pick(5) {
				bs = 2
			}
			plain, replica, root := !pick(8), pick(8), pick(4)
			for k := range run {
				hs := make([]EngineHash, blocks)
				for i := range hs {
					hs[i] = hash(width)
				}
				toks := make([]uint32, blocks*bs)
				for i := range toks {
					toks[i] = id()
				}
				hasParent, parent := !(root && k == 0), last
				if pick(8) {
					parent = hash(width)
				}
				size := bs
				if replica {
					toks, size, hasParent = nil, 0, false
				}
				b.AddStored(hs, parent, hasParent, toks, size, m)
				b.Events[len(b.Events)-1].PlainText = plain
				if len(hs) > 0 {
					last = hs[len(hs)-1]
				}
			}
		case r < 19:
			for range run {
				hs := make([]EngineHash, blocks)
				for i := range hs {
					hs[i] = hash(width)
				}
				b.AddRemoved(hs, m)
			}
		default:
			b.AddCleared()
		}
	}
	return b
}

// TestTemplatesMatchGeneralDecode (R-WIRE-2, R-WIRE-5): in every shape
// the encoder writes, the vLLM and SGLang dialects included, a message of
// events that repeat each other decodes with templates to exactly what
// the general decoder makes of it, and templates serve most of its
// events.
func TestTemplatesMatchGeneralDecode(t *testing.T) {
	d := NewDecoder(1 << 20)
	var with, without Batch
	for si, s := range allShapes() {
		served, events := 0, 0
		for seed := range uint64(8) {
			b := templateBatch(rand.New(rand.NewPCG(seed, uint64(si))))
			payload := AppendBatch(nil, b, s)
			served += decodeBothWays(t, d, payload, &with, &without)
			events += len(b.Events)
			if want := decodedAs(b, s); !sameBatch(&with, want) {
				t.Fatalf("shape %+v seed %d: decoded batch differs from the one encoded", s, seed)
			}
		}
		if served < events/2 {
			t.Errorf("shape %+v: templates decoded %d of %d events", s, served, events)
		}
	}
}

// TestTemplatesMatchGeneralDecodeMutated: every message that differs from
// a template-friendly one in one byte, or ends early, decodes with
// templates to the same batch or the same error as field by field. The
// changed byte lands in fixed bytes, slots, counts and lengths alike.
func TestTemplatesMatchGeneralDecodeMutated(t *testing.T) {
	d := NewDecoder(1 << 20)
	var with, without Batch
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := allShapes()
	served := 0
	for _, si := range []int{0, 9, len(shapes) - 8, len(shapes) - 7, len(shapes) - 4, len(shapes) - 2} {
		s := shapes[si]
		b := templateBatch(rand.New(rand.NewPCG(uint64(si), 1)))
		b.Events = b.Events[:12]
		payload := AppendBatch(nil, b, s)
		buf := make([]byte, len(payload))
		for at := range payload {
			for _, v := range []byte{payload[at] ^ 1, payload[at] + 1, payload[at] - 1, 0xc0, 0x91, 0xcf, byte(rng.Uint32())} {
				copy(buf, payload)
				buf[at] = v
				served += decodeBothWays(t, d, buf, &with, &without)
			}
			decodeBothWays(t, d, payload[:at], &with, &without)
		}
	}
	if served == 0 {
		t.Fatal("templates decoded no event of the mutated messages")
	}
}

// TestTemplatesHandBuiltEvents: events no encoder of this package writes,
// next to ones that repeat them: a key given twice, a token pair
// (SGLang's speculative decoding), unknown keys, a LoRA id appearing
// later, bin and str hashes of several lengths, a negative fixint parent;
// and, for contrast, events that differ only in their slots.
func TestTemplatesHandBuiltEvents(t *testing.T) {
	d := NewDecoder(1 << 20)
	var with, without Batch
	stored := func(hashes [][]byte, parent []byte, tokens [][]byte, extra ...[]byte) []byte {
		n := uint32(5 + len(extra)/2)
		e := msgp.AppendMapHeader(nil, n)
		e = msgp.AppendString(e, keyType)
		e = msgp.AppendString(e, "BlockStored")
		e = msgp.AppendString(e, keyBlockHashes)
		e = msgp.AppendArrayHeader(e, uint32(len(hashes)))
		for _, h := range hashes {
			e = append(e, h...)
		}
		e = msgp.AppendString(e, keyParent)
		e = append(e, parent...)
		e = msgp.AppendString(e, keyTokenIDs)
		e = msgp.AppendArrayHeader(e, uint32(len(tokens)))
		for _, tk := range tokens {
			e = append(e, tk...)
		}
		e = msgp.AppendString(e, keyBlockSize)
		e = msgp.AppendInt(e, len(tokens)/max(len(hashes), 1))
		for _, x := range extra {
			e = append(e, x...)
		}
		return e
	}
	u64 := func(v uint64) []byte { return msgp.AppendUint64(nil, v|1<<62) } // 9 bytes, as engines' hashes
	str := func(s string) []byte { return msgp.AppendString(nil, s) }
	bin := func(n int, v byte) []byte {
		x := make([]byte, n)
		x[n-1] = v
		return msgp.AppendBytes(nil, x)
	}
	toks := func(ids ...uint32) [][]byte {
		var out [][]byte
		for _, id := range ids {
			out = append(out, msgp.AppendUint32(nil, id))
		}
		return out
	}
	pair := msgp.AppendArrayHeader(nil, 2)
	pair = msgp.AppendInt(msgp.AppendInt(pair, 5), 6)
	// removed gives its hashes once for each array, as a map may.
	removed := func(arrays ...[][]byte) []byte {
		e := msgp.AppendMapHeader(nil, uint32(1+len(arrays)))
		e = msgp.AppendString(e, keyType)
		e = msgp.AppendString(e, "BlockRemoved")
		for _, hashes := range arrays {
			e = msgp.AppendString(e, keyBlockHashes)
			e = msgp.AppendArrayHeader(e, uint32(len(hashes)))
			for _, h := range hashes {
				e = append(e, h...)
			}
		}
		return e
	}
	seven := make([][]byte, 7)
	for i := range seven {
		seven[i] = u64(uint64(i) << 40)
	}
	// served is how many events templates decode: the first event is
	// decoded field by field, and a template serves an event whose fixed
	// bytes are those of the event of its kind before.
	cases := []struct {
		name   string
		evs    [][]byte
		served int
	}{
		{"events that differ only in their slots", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2)),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(1, 2)),
			stored([][]byte{u64(3 << 40)}, u64(9), toks(1, 2)),
		}, 2},
		{"token pair after plain events", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2)),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(3, 4)),
			stored([][]byte{u64(3 << 40)}, u64(9), [][]byte{pair, msgp.AppendUint32(nil, 4)}),
			stored([][]byte{u64(4 << 40)}, u64(10), toks(3, 4)),
		}, 3},
		{"hashes twice", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2)),
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2), str(keyBlockHashes), msgp.AppendUint64(msgp.AppendArrayHeader(nil, 1), 99)),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(1, 2), str(keyBlockHashes), msgp.AppendUint64(msgp.AppendArrayHeader(nil, 1), 98)),
		}, 0},
		// The event holds the last array, of one hash; the first has
		// more than a template has slots for (FuzzTemplates found the
		// template made of it writing past them).
		{"hashes twice, the first more than a template holds", [][]byte{
			removed(seven, [][]byte{u64(9 << 40)}),
			removed([][]byte{u64(10 << 40)}),
			removed([][]byte{u64(11 << 40)}),
		}, 1},
		{"parent twice", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2), str(keyParent), []byte{0xc0}),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(1, 2), str(keyParent), []byte{0xc0}),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(1, 2), str(keyParent), u64(5)),
		}, 0},
		{"lora id later", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2), str(keyLoraID), []byte{0xc0}),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(1, 2), str(keyLoraID), []byte{0xc0}),
			stored([][]byte{u64(3 << 40)}, u64(9), toks(1, 2), str(keyLoraID), []byte{0x01}),
		}, 1},
		{"unknown keys", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 2), str("session_id"), str("a")),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(1, 2), str("session_id"), str("a")),
			stored([][]byte{u64(3 << 40)}, u64(9), toks(1, 2), str("session_id"), str("b")),
		}, 1},
		{"bin and str hashes", [][]byte{
			stored([][]byte{bin(32, 1)}, bin(32, 9), toks(1, 2)),
			stored([][]byte{bin(32, 2)}, bin(32, 1), toks(1, 2)),
			stored([][]byte{bin(16, 3)}, bin(32, 2), toks(1, 2)),
			stored([][]byte{bin(8, 4)}, bin(16, 3), toks(1, 2)),
			stored([][]byte{str("abcdefgh")}, bin(8, 4), toks(1, 2)),
			stored([][]byte{str("abcdefgi")}, str("abcdefgh"), toks(1, 2)),
			stored([][]byte{bin(300, 5)}, str("abcdefgi"), toks(1, 2)),
			stored([][]byte{bin(300, 6)}, bin(300, 5), toks(1, 2)),
		}, 1},
		{"fixint hashes and parents", [][]byte{
			stored([][]byte{{0x05}}, []byte{0xff}, toks(1, 2)),
			stored([][]byte{{0x06}}, []byte{0x05}, toks(1, 2)),
			stored([][]byte{{0x06}}, []byte{0x05}, toks(1, 2)),
			stored([][]byte{{0x07}}, []byte{0xe0}, toks(1, 2)),
		}, 1},
		{"ids of every width", [][]byte{
			stored([][]byte{u64(1 << 40)}, u64(7), toks(1, 200)),
			stored([][]byte{u64(2 << 40)}, u64(8), toks(300, 70000)),
			stored([][]byte{u64(3 << 40)}, u64(9), [][]byte{msgp.AppendUint64(nil, 5), msgp.AppendInt64(nil, 6)}),
			stored([][]byte{u64(4 << 40)}, u64(10), [][]byte{msgp.AppendUint64(nil, 5), msgp.AppendInt64(nil, -6)}),
			stored([][]byte{u64(5 << 40)}, u64(11), [][]byte{msgp.AppendUint64(nil, 5), msgp.AppendUint64(nil, 1<<33)}),
		}, 2},
	}
	for _, c := range cases {
		for _, rank := range []bool{false, true} {
			fields := uint32(2)
			if rank {
				fields++
			}
			p := msgp.AppendArrayHeader(nil, fields)
			p = msgp.AppendFloat64(p, 1.5)
			p = msgp.AppendArrayHeader(p, uint32(len(c.evs)))
			for _, e := range c.evs {
				p = append(p, e...)
			}
			if rank {
				p = msgp.AppendInt(p, 0)
			}
			if served := decodeBothWays(t, d, p, &with, &without); served != c.served {
				t.Errorf("%s: templates decoded %d of %d events, want %d", c.name, served, len(c.evs), c.served)
			}
		}
	}
}

// FuzzTemplates: whatever the bytes, decoding with templates gives what
// decoding field by field gives. The seeds are messages templates serve.
func FuzzTemplates(f *testing.F) {
	for si, s := range allShapes() {
		b := templateBatch(rand.New(rand.NewPCG(uint64(si), 2)))
		b.Events = b.Events[:10]
		f.Add(AppendBatch(nil, b, s))
	}
	d := NewDecoder(1 << 20)
	f.Fuzz(func(t *testing.T, payload []byte) {
		var with, without Batch
		decodeBothWays(t, d, payload, &with, &without)
	})
}

// TestTemplateBatchShapes keeps the generator honest: its messages
// hold the events the tests above mean them to.
func TestTemplateBatchShapes(t *testing.T) {
	kinds := map[string]int{}
	for seed := range uint64(8) {
		for _, ev := range templateBatch(rand.New(rand.NewPCG(seed, 0))).Events {
			kinds[fmt.Sprintf("%v/%d/plain=%v/parent=%v/tokens=%v", ev.Kind, len(ev.BlockHashes), ev.PlainText, ev.HasParent, len(ev.TokenIDs) > 0)]++
		}
	}
	for _, want := range []string{
		"BlockStored/1/plain=true/parent=true/tokens=true",
		"BlockStored/1/plain=true/parent=false/tokens=true",
		"BlockStored/1/plain=false/parent=true/tokens=true",
		"BlockStored/1/plain=true/parent=false/tokens=false",
		"BlockRemoved/1/plain=true/parent=false/tokens=false",
		"BlockRemoved/0/plain=true/parent=false/tokens=false",
		"BlockRemoved/2/plain=true/parent=false/tokens=false",
		"AllBlocksCleared/0/plain=true/parent=false/tokens=false",
	} {
		if kinds[want] == 0 {
			t.Errorf("no event %s in the generator's messages: %v", want, kinds)
		}
	}
}

// TestTemplateDecodeAllocs: once a batch has decoded a message, decoding
// messages of its size with templates allocates nothing.
func TestTemplateDecodeAllocs(t *testing.T) {
	d := NewDecoder(1 << 20)
	var b Batch
	payload := AppendBatch(nil, templateBatch(rand.New(rand.NewPCG(5, 6))), Shape{})
	mustDecode(t, d, payload, &b)
	if b.tmpl == nil || b.tmpl.served == 0 {
		t.Fatal("templates decoded no event")
	}
	if allocs := testing.AllocsPerRun(50, func() { _ = d.DecodeBatch(payload, &b) }); allocs != 0 {
		t.Fatalf("%.1f allocations per message", allocs)
	}
}

// TestTemplatesKeepNoPayload: a batch kept between messages holds no
// reference into the last one, whether it decoded or failed.
func TestTemplatesKeepNoPayload(t *testing.T) {
	d := NewDecoder(1 << 20)
	var b Batch
	payload := AppendBatch(nil, templateBatch(rand.New(rand.NewPCG(7, 8))), Shape{})
	for _, p := range [][]byte{payload, payload[:len(payload)-3]} {
		_ = d.DecodeBatch(p, &b)
		if b.tmpl == nil {
			t.Fatal("no templates were made")
		}
		for i, tp := range b.tmpl.t {
			if tp.src != nil || tp.ok {
				t.Fatalf("template %d still points into the message after DecodeBatch returned", i)
			}
		}
	}
}

// TestDecoderFaultIsMalformed: a fault inside the decoder costs its
// message, not the process every stream lives in (a malformed message
// invalidates only its own stream). Templates that no message leaves
// behind (a slot past the template's own bytes) make the decoder fail
// inside; the error wraps ErrMalformed and names the fault, the batch is
// left empty, and the same message then decodes as field by field.
func TestDecoderFaultIsMalformed(t *testing.T) {
	payload := AppendBatch(nil, templateBatch(rand.New(rand.NewPCG(3, 4))), Shape{})
	d := NewDecoder(1 << 20)
	var b, want Batch
	want.generalOnly = true
	if err := d.DecodeBatch(payload, &want); err != nil {
		t.Fatal(err)
	}
	b.tmpl = new(templates)
	for i := range b.tmpl.t {
		tp := &b.tmpl.t[i]
		tp.ok, tp.n, tp.src = true, 1, []byte{0x81}
		tp.slots[0] = slot{off: 4, hdr: 1, end: 9, kind: slotHash}
	}
	err := d.DecodeBatch(payload, &b)
	if !errors.Is(err, ErrMalformed) || !errors.Is(err, ErrDecoderFault) || !strings.Contains(err.Error(), "slice bounds out of range") {
		t.Fatalf("got %v, want a decoder fault as ErrMalformed", err)
	}
	if len(b.Events) != 0 || len(b.hashes) != 0 || len(b.tokens) != 0 || b.payload != nil {
		t.Fatalf("the failed decode left %d events, %d hashes, %d ids", len(b.Events), len(b.hashes), len(b.tokens))
	}
	if err := d.DecodeBatch(payload, &b); err != nil {
		t.Fatalf("the next decode: %v", err)
	}
	if !reflect.DeepEqual(b.Events, want.Events) {
		t.Fatal("the next decode differs from the field-by-field one")
	}
}

// TestFixedWordsMatchHasPrefix: the words a template compares its short
// runs of fixed bytes with say what bytes.HasPrefix says, for runs of 0
// to 20 bytes against inputs as long, shorter and longer, equal or
// differing in any one byte.
func TestFixedWordsMatchHasPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 20000 {
		run := make([]byte, rng.IntN(21))
		for i := range run {
			run[i] = byte(rng.IntN(256))
		}
		var w fixedWords
		w.set(run)
		p := append([]byte(nil), run...)
		for range rng.IntN(21) {
			p = append(p, byte(rng.IntN(256)))
		}
		switch rng.IntN(3) {
		case 0:
			if len(p) > 0 {
				p[rng.IntN(len(p))] ^= byte(1 + rng.IntN(255))
			}
		case 1:
			p = p[:rng.IntN(len(p)+1)]
		}
		if got, want := w.startsWith(p, run), bytes.HasPrefix(p, run); got != want {
			t.Fatalf("trial %d: run %x, input %x: %v, bytes.HasPrefix %v", trial, run, p, got, want)
		}
	}
}
