package kvevent

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// sameBatch compares two batches field by field; timestamps compare by
// bit pattern so a NaN that survived a round trip still counts as equal.
func sameBatch(a, b *Batch) bool {
	if math.Float64bits(a.Timestamp) != math.Float64bits(b.Timestamp) ||
		a.HasDPRank != b.HasDPRank || a.DPRank != b.DPRank || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := &a.Events[i], &b.Events[i]
		if x.Kind != y.Kind || x.Medium != y.Medium || x.HasParent != y.HasParent ||
			x.ParentHash != y.ParentHash || x.BlockSize != y.BlockSize || x.PlainText != y.PlainText ||
			!equalSlices(x.BlockHashes, y.BlockHashes) || !equalSlices(x.TokenIDs, y.TokenIDs) {
			return false
		}
	}
	return true
}

func equalSlices[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDecodeBatch: no input panics or allocates beyond what its length
// allows, every accepted batch satisfies the R-WIRE invariants, and
// re-encoding it in any shape decodes to the same batch.
func FuzzDecodeBatch(f *testing.F) {
	for _, g := range readGolden(f) {
		f.Add(g.payload)
	}
	// Every encoder shape, the vLLM and SGLang dialects included.
	shapes := allShapes()
	for _, s := range shapes {
		f.Add(AppendBatch(nil, sampleBatch(), s))
	}
	d := NewDecoder(1 << 20)
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b Batch
		if err := d.DecodeBatch(payload, &b); err != nil {
			if errors.Is(err, ErrDecoderFault) {
				t.Fatal(err)
			}
			if len(b.Events) != 0 {
				t.Fatalf("failed decode left %d events", len(b.Events))
			}
			return
		}
		if got, limit := b.StorageBytes(), MaxStorageBytes(len(payload)); got > limit {
			t.Fatalf("decoded storage %d bytes for a %d-byte payload, over the bound %d", got, len(payload), limit)
		}
		if !storageWithinPayload(&b, len(payload)) {
			t.Fatalf("storage beyond the payload's means: events %d hashes %d tokens %d for %d bytes",
				cap(b.Events), cap(b.hashes), cap(b.tokens), len(payload))
		}
		for i, ev := range b.Events {
			switch ev.Kind {
			case BlockStored:
				if n := len(ev.TokenIDs); n > 0 && (ev.BlockSize <= 0 || n != len(ev.BlockHashes)*ev.BlockSize) {
					t.Fatalf("event %d: %d tokens for %d blocks of %d", i, n, len(ev.BlockHashes), ev.BlockSize)
				}
			case BlockRemoved, AllBlocksCleared:
				if len(ev.TokenIDs) != 0 || ev.HasParent || !ev.PlainText {
					t.Fatalf("event %d: %v carries stored-only fields", i, ev.Kind)
				}
			default:
				t.Fatalf("event %d: kind %d", i, ev.Kind)
			}
		}
		s := shapes[len(payload)%len(shapes)]
		var again Batch
		if err := d.DecodeBatch(AppendBatch(nil, &b, s), &again); err != nil {
			t.Fatalf("re-encoded in %+v: %v", s, err)
		}
		if want := decodedAs(&b, s); !sameBatch(&again, want) {
			t.Fatalf("round trip in %+v changed the batch", s)
		}
	})
}

// FuzzParseLive: no panic, and an accepted message rebuilds to itself.
func FuzzParseLive(f *testing.F) {
	for i, g := range readGolden(f) {
		fr := LiveFrames("xllm-kv", uint64(i), g.payload)
		f.Add(fr[0], fr[1], fr[2], false)
	}
	f.Add([]byte{}, []byte{1, 2, 3}, []byte{}, true)
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte, extra bool) {
		frames := [][]byte{topic, seq, payload}
		if extra {
			frames = append(frames, payload)
		}
		gotTopic, gotSeq, gotPayload, err := ParseLive(frames)
		if err != nil {
			return
		}
		if extra || len(seq) != 8 {
			t.Fatalf("accepted %d frames with a %d-byte seq", len(frames), len(seq))
		}
		rt, rs, rp, err := ParseLive(LiveFrames(string(gotTopic), gotSeq, gotPayload))
		if err != nil || !bytes.Equal(rt, topic) || rs != gotSeq || !bytes.Equal(rp, payload) {
			t.Fatalf("rebuild: %q %d %x, %v", rt, rs, rp, err)
		}
	})
}

// FuzzParseReplay: no panic; an accepted reply rebuilds to the same seq
// and payload, and only the exact end marker reports end.
func FuzzParseReplay(f *testing.F) {
	for i, g := range readGolden(f) {
		fr := ReplayFrames(uint64(i), g.payload)
		f.Add(fr[0], []byte(nil), fr[1], fr[2], false)
		f.Add(fr[0], []byte("xllm-kv"), fr[1], fr[2], true)
	}
	end := ReplayEnd()
	f.Add(end[0], []byte(nil), end[1], end[2], false)
	endTopic := ReplayEndTopic()
	f.Add(endTopic[0], endTopic[1], endTopic[2], endTopic[3], true)
	f.Fuzz(func(t *testing.T, delim, topic, seq, payload []byte, withTopic bool) {
		frames := [][]byte{delim, seq, payload}
		if withTopic {
			frames = [][]byte{delim, topic, seq, payload}
		}
		gotSeq, gotPayload, end, err := ParseReplay(frames)
		if err != nil {
			return
		}
		if len(delim) != 0 || len(seq) != 8 {
			t.Fatalf("accepted delimiter %x seq %x", delim, seq)
		}
		if end {
			if gotSeq != ReplayEndSeq || len(payload) != 0 {
				t.Fatalf("end reported for seq %d payload %x", gotSeq, payload)
			}
			return
		}
		rebuilt := ReplayFrames(gotSeq, gotPayload)
		if withTopic {
			rebuilt = ReplayFramesTopic(string(topic), gotSeq, gotPayload)
			if rt, ok := ReplayTopic(rebuilt); !ok || !bytes.Equal(rt, topic) {
				t.Fatalf("topic %q rebuilt as %q", topic, rt)
			}
		}
		rs, rp, rend, err := ParseReplay(rebuilt)
		if err != nil || rend || rs != gotSeq || !bytes.Equal(rp, payload) {
			t.Fatalf("rebuild: %d %x %v, %v", rs, rp, rend, err)
		}
	})
}
