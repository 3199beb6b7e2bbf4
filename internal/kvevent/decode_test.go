package kvevent

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"github.com/zeebo/xxh3"
)

// allShapes enumerates the wire shapes the encoder can produce: every
// combination of the seed's options, then the vLLM and SGLang dialects
// over both event shapes and every hash form.
func allShapes() []Shape {
	var out []Shape
	for _, m := range []bool{false, true} {
		for _, a := range []bool{false, true} {
			for _, h := range []HashForm{HashUint64, HashInt64, HashBytes8} {
				for _, u := range []bool{false, true} {
					for _, o := range []bool{false, true} {
						out = append(out, Shape{BatchAsMap: m, EventsAsArrays: a, Hashes: h, UpperMedium: u, OmitDPRank: o})
					}
				}
			}
		}
	}
	for _, a := range []bool{false, true} {
		for _, h := range []HashForm{HashUint64, HashInt64, HashBytes8, HashDigest32} {
			out = append(out,
				Shape{EventsAsArrays: a, Hashes: h, UpperMedium: true, VLLMFields: true},
				Shape{EventsAsArrays: a, Hashes: h, UpperMedium: true, PinnedHost: true, SGLangMeta: true, ZeroRootParent: true},
				Shape{BatchAsMap: true, AttnDPRank: true, EventsAsArrays: a, Hashes: h, UpperMedium: true, PinnedHost: true},
			)
		}
	}
	return out
}

// decodedAs is what a decoder must read from AppendBatch(b, s): b without
// its rank when s omits it, with every hash mapped by the hash form, and
// with a parent that is the integer 0 read as a root in array events,
// which is what 0 means there.
func decodedAs(b *Batch, s Shape) *Batch {
	c := b.Clone()
	if s.OmitDPRank {
		c.HasDPRank, c.DPRank = false, 0
	}
	for i := range c.Events {
		ev := &c.Events[i]
		for j, h := range ev.BlockHashes {
			ev.BlockHashes[j] = s.Hashes.Decoded(h)
		}
		if !ev.HasParent {
			continue
		}
		ev.ParentHash = s.Hashes.Decoded(ev.ParentHash)
		if s.EventsAsArrays && ev.ParentHash == (EngineHash{}) {
			ev.HasParent = false
		}
	}
	return c
}

// ints builds integer engine hashes.
func ints(vs ...uint64) []EngineHash {
	out := make([]EngineHash, len(vs))
	for i, v := range vs {
		out[i] = IntHash(v)
	}
	return out
}

// sampleBatch covers every event kind, both media, root and child
// blocks, hashes at the edges of the 64-bit range and one beyond it (a
// 128-bit hash, as a digest reduces to), a tokenless replica and a
// non-plain (LoRA) event.
func sampleBatch() *Batch {
	b := &Batch{Timestamp: 1712345678.25, HasDPRank: true, DPRank: 1}
	b.AddCleared()
	b.AddStored(ints(math.MaxUint64, 1<<63, 0), EngineHash{}, false,
		[]uint32{0, 1, 127, 128, 255, 256, 65535, 65536, 151935, math.MaxUint32, 7, 8}, 4, Device)
	b.AddStored(ints(0x0123456789abcdef), IntHash(math.MaxUint64), true, []uint32{9, 10, 11, 12}, 4, Device)
	b.AddStored(ints(math.MaxUint64, 1<<63), EngineHash{}, false, nil, 0, Host)
	b.AddStored(ints(42), IntHash(7), true, []uint32{1, 2, 3, 4}, 4, Device)
	b.Events[len(b.Events)-1].PlainText = false
	b.AddRemoved(ints(0x0123456789abcdef, 5), Device)
	b.AddRemoved(ints(1<<63), Host)
	wide := EngineHash{Hi: 0xfedcba9876543210, Lo: 7}
	b.AddStored([]EngineHash{wide}, IntHash(42), true, []uint32{5, 6, 7, 8}, 4, Host)
	b.AddRemoved([]EngineHash{wide}, Device)
	return b
}

func mustDecode(t testing.TB, d *Decoder, payload []byte, b *Batch) {
	t.Helper()
	if err := d.DecodeBatch(payload, b); err != nil {
		t.Fatalf("decode %x: %v", payload, err)
	}
}

// R-WIRE-2, R-WIRE-5: every encoder shape decodes back to the same batch,
// including hashes >= 2^63, negative int64 patterns, 8-byte and 32-byte
// bin hashes, 128-bit hashes, upper-case media, a missing or nil rank
// under either name and the non-plain mark.
func TestRoundTripAllShapes_RWIRE2(t *testing.T) {
	src := sampleBatch()
	noRank := src.Clone()
	noRank.HasDPRank, noRank.DPRank = false, 0
	d := NewDecoder(0)
	var got Batch
	for _, s := range allShapes() {
		for _, in := range []*Batch{src, noRank} {
			payload := AppendBatch(nil, in, s)
			mustDecode(t, d, payload, &got)
			if g, w := viewJSON(&got), viewJSON(decodedAs(in, s)); g != w {
				t.Fatalf("shape %+v:\n got %s\nwant %s", s, g, w)
			}
		}
	}
}

// The decoder reuses the batch: decoding a small batch after a large one
// leaves no trace of the large one.
func TestDecodeReusesBatch(t *testing.T) {
	d := NewDecoder(0)
	var b Batch
	mustDecode(t, d, AppendBatch(nil, sampleBatch(), Shape{}), &b)
	small := &Batch{Timestamp: 2}
	small.AddRemoved(ints(3), Host)
	mustDecode(t, d, AppendBatch(nil, small, Shape{EventsAsArrays: true}), &b)
	if g, w := viewJSON(&b), viewJSON(small); g != w {
		t.Fatalf("got %s, want %s", g, w)
	}
}

// A steady stream decodes without allocating once the batch has grown.
func TestDecodeSteadyStateAllocs(t *testing.T) {
	payload := AppendBatch(nil, benchBatch(0, 16, 2, 128), Shape{})
	d := NewDecoder(0)
	var b Batch
	mustDecode(t, d, payload, &b)
	allocs := testing.AllocsPerRun(50, func() {
		if err := d.DecodeBatch(payload, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per decode, want 0", allocs)
	}
	// Unknown keys and extra trailing fields are skipped without
	// allocating either.
	for _, g := range readGolden(t) {
		if g.expect.Batch == nil {
			continue
		}
		mustDecode(t, d, g.payload, &b)
		if allocs := testing.AllocsPerRun(20, func() { _ = d.DecodeBatch(g.payload, &b) }); allocs != 0 {
			t.Errorf("%s: %.1f allocations per decode, want 0", g.name, allocs)
		}
	}
}

// Bounds: a payload above max_message_bytes is refused before decoding.
func TestDecodeTooLarge(t *testing.T) {
	payload := AppendBatch(nil, sampleBatch(), Shape{})
	var b Batch
	if err := NewDecoder(len(payload)).DecodeBatch(payload, &b); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	err := NewDecoder(len(payload)-1).DecodeBatch(payload, &b)
	if !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if len(b.Events) != 0 {
		t.Fatalf("rejected decode left %d events", len(b.Events))
	}
	if NewDecoder(-1).MaxMessageBytes() != DefaultMaxMessageBytes {
		t.Fatalf("non-positive limit should select the default")
	}
}

// Bounds: claimed lengths far beyond the payload fail without allocating
// anything proportional to the claim.
func TestDecodeHugeClaimsDoNotAllocate(t *testing.T) {
	huge := [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff},             // batch array of 2^32-1
		{0xdf, 0xff, 0xff, 0xff, 0xff},             // batch map of 2^32-1
		{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}, // events
		{0x92, 0x00, 0x91, 0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xdd, 0xff, 0xff, 0xff, 0xff},             // block_hashes
		{0x92, 0x00, 0x91, 0x94, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0xdd, 0xff, 0xff, 0xff, 0xff}, // token_ids
		{0x92, 0x00, 0x91, 0x81, 0xdb, 0xff, 0xff, 0xff, 0xff},                                                                          // str32 key
		{0x92, 0x00, 0x91, 0x81, 0xa1, 'x', 0xc6, 0xff, 0xff, 0xff, 0xff},                                                               // bin32 value to skip
	}
	d := NewDecoder(0)
	for _, p := range huge {
		var b Batch
		err := d.DecodeBatch(p, &b)
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("%x: got %v, want ErrMalformed", p, err)
		}
		// Only the error value itself may be allocated. The counter is
		// process-wide, so average over many decodes to keep background
		// allocations (the race detector, the test runner) out of it.
		const runs = 200
		n := allocatedBytes(func() {
			for range runs {
				_ = d.DecodeBatch(p, &b)
			}
		})
		if per := n / runs; per > 1024 {
			t.Fatalf("%x: %d bytes allocated per decode of a %d-byte message", p, per, len(p))
		}
		if !storageWithinPayload(&b, len(p)) {
			t.Fatalf("%x: storage grew on claims alone: events %d hashes %d tokens %d", p, cap(b.Events), cap(b.hashes), cap(b.tokens))
		}
	}
}

// storageWithinPayload reports whether the batch's storage is linear in
// the payload length: at most one event record per minEventBytes and one
// hash or token per byte, with room for append's doubling and size-class
// rounding.
func storageWithinPayload(b *Batch, n int) bool {
	return cap(b.Events) <= 2*(n/minEventBytes)+4 && cap(b.hashes) <= 2*n+8 && cap(b.tokens) <= 2*n+8
}

func allocatedBytes(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// oneEvent wraps a raw event in a 4-element batch whose skipped fourth
// element pads the message, so the events count passes the minimum-size
// check and the event itself is judged.
func oneEvent(ev ...byte) []byte {
	p := append([]byte{0x94, 0x00, 0x91}, ev...)
	return msgp.AppendString(append(p, 0x00), "padding padding padding")
}

// R-WIRE-5: lora_id, lora_name and extra_keys mark an event non-plain;
// nil, the empty string and per-block nil/empty entries do not.
func TestPlainTextMarks_RWIRE5(t *testing.T) {
	stored := func(extra func([]byte) ([]byte, uint32)) []byte {
		p := msgp.AppendArrayHeader(nil, 2)
		p = msgp.AppendFloat64(p, 1)
		p = msgp.AppendArrayHeader(p, 1)
		tail, n := extra(nil)
		p = msgp.AppendMapHeader(p, 3+n)
		p = msgp.AppendString(p, "type")
		p = msgp.AppendString(p, "BlockStored")
		p = msgp.AppendString(p, "block_hashes")
		p = msgp.AppendArrayHeader(p, 1)
		p = msgp.AppendUint64(p, 1)
		p = msgp.AppendString(p, "token_ids")
		p = msgp.AppendArrayHeader(p, 0)
		return append(p, tail...)
	}
	kv := func(k string, v func([]byte) []byte) func([]byte) ([]byte, uint32) {
		return func(p []byte) ([]byte, uint32) { return v(msgp.AppendString(p, k)), 1 }
	}
	cases := []struct {
		name  string
		extra func([]byte) ([]byte, uint32)
		plain bool
	}{
		{"no context", func(p []byte) ([]byte, uint32) { return p, 0 }, true},
		{"lora_id nil", kv("lora_id", msgp.AppendNil), true},
		{"lora_id 0", kv("lora_id", func(p []byte) []byte { return msgp.AppendInt(p, 0) }), false},
		{"lora_id 3", kv("lora_id", func(p []byte) []byte { return msgp.AppendInt(p, 3) }), false},
		{"lora_name nil", kv("lora_name", msgp.AppendNil), true},
		{"lora_name empty", kv("lora_name", func(p []byte) []byte { return msgp.AppendString(p, "") }), true},
		{"lora_name set", kv("lora_name", func(p []byte) []byte { return msgp.AppendString(p, "sql-adapter") }), false},
		{"extra_keys nil", kv("extra_keys", msgp.AppendNil), true},
		{"extra_keys empty", kv("extra_keys", func(p []byte) []byte { return msgp.AppendArrayHeader(p, 0) }), true},
		{"extra_keys per-block nil", kv("extra_keys", func(p []byte) []byte {
			return msgp.AppendNil(msgp.AppendArrayHeader(p, 1))
		}), true},
		{"extra_keys per-block empty", kv("extra_keys", func(p []byte) []byte {
			return msgp.AppendArrayHeader(msgp.AppendArrayHeader(p, 1), 0)
		}), true},
		{"extra_keys mm hash", kv("extra_keys", func(p []byte) []byte {
			p = msgp.AppendArrayHeader(msgp.AppendArrayHeader(p, 1), 1)
			return msgp.AppendString(p, "mm:3f2a")
		}), false},
		{"extra_keys not a list", kv("extra_keys", func(p []byte) []byte { return msgp.AppendString(p, "salt") }), false},
	}
	d := NewDecoder(0)
	var b Batch
	for _, tc := range cases {
		mustDecode(t, d, stored(tc.extra), &b)
		if got := b.Events[0].PlainText; got != tc.plain {
			t.Errorf("%s: PlainText %v, want %v", tc.name, got, tc.plain)
		}
	}
}

// Malformed inputs fail with ErrMalformed and a message naming the fault.
func TestDecodeErrors(t *testing.T) {
	stored := func(hashes int, tokens []uint32, bs int) []byte {
		b := &Batch{}
		b.AddStored(make([]EngineHash, hashes), EngineHash{}, false, tokens, bs, Device)
		return AppendBatch(nil, b, Shape{})
	}
	cases := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty", nil, "batch: expected array or map, got end of message"},
		{"scalar batch", []byte{0x01}, "batch: expected array or map, got int"},
		{"one-element batch", []byte{0x91, 0x00}, "array has 1 elements"},
		{"ts not a number", []byte{0x92, 0xa1, 'x', 0x90}, "ts: expected number, got str"},
		{"events not an array", []byte{0x92, 0x00, 0xa1, 'x'}, "events: expected array, got str"},
		{"dp rank negative", []byte{0x93, 0x00, 0x90, 0xff}, "data_parallel_rank: -1 out of range"},
		{"dp rank str", []byte{0x93, 0x00, 0x90, 0xa1, '1'}, "data_parallel_rank: expected int, got str"},
		{"map batch without events", []byte{0x81, 0xa2, 't', 's', 0x00}, "missing events"},
		{"map batch int key", []byte{0x81, 0x01, 0x00}, "batch: key: expected str, got int"},
		{"trailing bytes", []byte{0x92, 0x00, 0x90, 0xc0}, "1 trailing bytes"},
		{"event scalar", oneEvent(0x01), "event 0: event: expected map or array, got int"},
		{"event empty array", oneEvent(0x90), "event 0: empty array"},
		{"event without type", oneEvent(0x80), "event 0: missing type"},
		{"unknown type", oneEvent(0x91, 0xa4, 'M', 'o', 'v', 'e'), `unknown event type "Move"`},
		{"len mismatch", stored(2, []uint32{1, 2, 3}, 2), "token_ids: 3 tokens for 2 blocks of 2"},
		{"zero block size with tokens", stored(1, []uint32{1, 2}, 0), "block_size: 0 with 2 tokens"},
	}
	d := NewDecoder(0)
	var b Batch
	for _, tc := range cases {
		err := d.DecodeBatch(tc.payload, &b)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrMalformed containing %q", tc.name, err, tc.want)
		}
	}
}

// BytesHash: 8 bytes are the big-endian integer, so HashBytes8 and
// HashUint64 agree; 16 bytes are kept exactly; other lengths go through
// XXH3-128, so a 32-byte digest is not truncated to 64 bits (item 9).
func TestBytesHash(t *testing.T) {
	raw := []byte{0x80, 1, 2, 3, 4, 5, 6, 7}
	if got := BytesHash(raw); got != IntHash(0x8001020304050607) {
		t.Fatalf("8 bytes: got %v", got)
	}
	sixteen := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if got := BytesHash(sixteen); got != (EngineHash{Hi: 0x0102030405060708, Lo: 0x090a0b0c0d0e0f10}) {
		t.Fatalf("16 bytes: got %v", got)
	}
	for _, b := range [][]byte{nil, {1}, []byte("abc"), make([]byte, 32)} {
		u := xxh3.Hash128(b)
		if got, want := BytesHash(b), (EngineHash{Hi: u.Hi, Lo: u.Lo}); got != want {
			t.Fatalf("%x: got %v want %v", b, got, want)
		}
	}
	// Two sha256 digests that share their last 8 bytes (what a 64-bit
	// reduction keeps) stay apart.
	a, b := make([]byte, 32), make([]byte, 32)
	a[0], b[0] = 1, 2
	if BytesHash(a) == BytesHash(b) || BytesHash(make([]byte, 32)) == BytesHash(make([]byte, 31)) {
		t.Fatalf("distinct strings reduced to one hash")
	}
	if got := IntHash(42).String(); got != "0x000000000000002a" {
		t.Fatalf("String of an integer hash: %s", got)
	}
	if got := (EngineHash{Hi: 1, Lo: 2}).String(); got != "0x00000000000000010000000000000002" {
		t.Fatalf("String of a 128-bit hash: %s", got)
	}
}

func TestCloneIsDeep(t *testing.T) {
	d := NewDecoder(0)
	var b Batch
	mustDecode(t, d, AppendBatch(nil, sampleBatch(), Shape{}), &b)
	c := b.Clone()
	want := viewJSON(&b)
	other := &Batch{}
	other.AddStored(ints(9, 9, 9), EngineHash{}, false, make([]uint32, 3*4), 4, Host)
	mustDecode(t, d, AppendBatch(nil, other, Shape{}), &b)
	if got := viewJSON(c); got != want {
		t.Fatalf("clone changed after the source was reused:\n got %s\nwant %s", got, want)
	}
	// The clone is itself a reusable batch.
	mustDecode(t, d, AppendBatch(nil, other, Shape{}), c)
	if viewJSON(c) != viewJSON(other) {
		t.Fatalf("decode into a clone failed")
	}
}

func TestDecodedBytes(t *testing.T) {
	b := sampleBatch()
	blocks, tokens := 0, 0
	for _, ev := range b.Events {
		blocks += len(ev.BlockHashes)
		tokens += len(ev.TokenIDs)
	}
	want := len(b.Events)*eventSize + blocks*16 + tokens*4
	if got := b.DecodedBytes(); got != want || got <= 0 {
		t.Fatalf("DecodedBytes %d, want %d", got, want)
	}
	var empty Batch
	if empty.DecodedBytes() != 0 {
		t.Fatalf("empty batch reports %d bytes", empty.DecodedBytes())
	}
}

// TestMaxStorageBytesWorstShapes builds the payloads that decode into the
// most memory per wire byte (R-CFG-2 max_message_bytes bounds decoded
// memory too): the shortest events, 1-byte hashes, 1-byte tokens.
func TestMaxStorageBytesWorstShapes(t *testing.T) {
	const n = 1 << 16
	batch := func(events int, event func(p []byte, i int) []byte) []byte {
		p := msgp.AppendArrayHeader(nil, 3)
		p = msgp.AppendInt(p, 0)
		p = msgp.AppendArrayHeader(p, uint32(events))
		for i := range events {
			p = event(p, i)
		}
		return msgp.AppendNil(p)
	}
	shapes := map[string][]byte{
		"shortest events": batch(n, func(p []byte, _ int) []byte {
			p = msgp.AppendArrayHeader(p, 2)
			p = msgp.AppendString(p, "BlockStored")
			return msgp.AppendArrayHeader(p, 0)
		}),
		"1-byte hashes": batch(1, func(p []byte, _ int) []byte {
			p = msgp.AppendArrayHeader(p, 2)
			p = msgp.AppendString(p, "BlockRemoved")
			p = msgp.AppendArrayHeader(p, n)
			for i := range n {
				p = msgp.AppendUint(p, uint(i%128))
			}
			return p
		}),
		"1-byte hashes over many events": batch(n/16, func(p []byte, _ int) []byte {
			p = msgp.AppendArrayHeader(p, 2)
			p = msgp.AppendString(p, "BlockRemoved")
			p = msgp.AppendArrayHeader(p, 16)
			for i := range 16 {
				p = msgp.AppendUint(p, uint(i))
			}
			return p
		}),
		"1-byte tokens": batch(1, func(p []byte, _ int) []byte {
			p = msgp.AppendArrayHeader(p, 5)
			p = msgp.AppendString(p, "BlockStored")
			p = msgp.AppendArrayHeader(p, 1)
			p = msgp.AppendUint(p, 7)
			p = msgp.AppendNil(p)
			p = msgp.AppendArrayHeader(p, n)
			for range n {
				p = msgp.AppendUint(p, 1)
			}
			return msgp.AppendInt(p, n)
		}),
	}
	d := NewDecoder(64 << 20)
	for name, payload := range shapes {
		var b Batch
		if err := d.DecodeBatch(payload, &b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, limit := b.StorageBytes(), MaxStorageBytes(len(payload))
		if got > limit {
			t.Errorf("%s: %d bytes of storage from %d wire bytes, over the bound %d", name, got, len(payload), limit)
		}
		t.Logf("%s: %d wire bytes -> %d bytes of storage (%.1f per wire byte)", name, len(payload), got, float64(got)/float64(len(payload)))
	}
}
