package kvevent

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// benchBatch builds events*blocksPerEvent blocks of blockSize tokens with
// token ids drawn uniformly from a 150k vocabulary, from seed.
func benchBatch(seed uint64, events, blocksPerEvent, blockSize int) *Batch {
	b := &Batch{Timestamp: 1.7e9, HasDPRank: true}
	hashes := make([]EngineHash, blocksPerEvent)
	tokens := make([]uint32, blocksPerEvent*blockSize)
	next := 0x9e3779b97f4a7c15 ^ seed
	parent := EngineHash{}
	for e := range events {
		for i := range hashes {
			next = next*6364136223846793005 + 1442695040888963407
			hashes[i] = IntHash(next)
		}
		for i := range tokens {
			next = next*6364136223846793005 + 1442695040888963407
			tokens[i] = uint32(next>>33) % 151_936
		}
		b.AddStored(hashes, parent, e > 0, tokens, blockSize, Device)
		parent = hashes[len(hashes)-1]
	}
	return b
}

// benchIDs is how many token ids the distinct messages a decode
// benchmark cycles through hold together, at least: one message decoded
// again and again lets the branch predictor learn its token widths,
// which live traffic never allows. 64 messages of 1,024 ids were not
// enough: the widths of the last ids of each, read one at a time, were
// learnt.
const benchIDs = 1 << 19

// decodeCase is a message shape BenchmarkDecodeBatch decodes.
type decodeCase struct {
	events, blocksPerEvent, blockSize int
	shape                             Shape
	// removals sends a BlockRemoved of one block per event instead of
	// the stores, as vLLM and SGLang send their evictions.
	removals bool
	// fieldByField decodes without templates (template.go).
	fieldByField bool
}

// benchRemovals builds n BlockRemoved events of one block each, from seed.
func benchRemovals(seed uint64, n int) *Batch {
	b := &Batch{Timestamp: 1.7e9, HasDPRank: true}
	next := 0x9e3779b97f4a7c15 ^ seed
	for range n {
		next = next*6364136223846793005 + 1442695040888963407
		b.AddRemoved([]EngineHash{IntHash(next)}, Device)
	}
	return b
}

func benchmarkDecode(b *testing.B, c decodeCase) {
	var payloads [][]byte
	for v := range max(64, benchIDs/(c.events*c.blocksPerEvent*c.blockSize)) {
		src := benchBatch(uint64(v), c.events, c.blocksPerEvent, c.blockSize)
		if c.removals {
			src = benchRemovals(uint64(v), c.events)
		}
		payloads = append(payloads, AppendBatch(nil, src, c.shape))
	}
	d := NewDecoder(0)
	dst := Batch{generalOnly: c.fieldByField}
	for _, p := range payloads {
		if err := d.DecodeBatch(p, &dst); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(payloads[0])))
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if err := d.DecodeBatch(payloads[i%len(payloads)], &dst); err != nil {
			b.Fatal(err)
		}
		i++
	}
	blocks := float64(c.events * c.blocksPerEvent)
	b.ReportMetric(blocks*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(blocks*float64(b.N)), "ns/block")
}

// BenchmarkDecodeBatch measures the decode hot path (R-WIRE-2) for the
// shapes engines send: 64 single-block events, and one 64-block event,
// each message with token ids of its own (uniform over the vocabulary;
// BenchmarkDecodeTokens measures ids of real text); vLLM's decode steps
// (16-token blocks, 32-byte hashes, every field vLLM sends); 64
// removals of a block each. The field_by_field cases decode the same
// messages without templates.
func BenchmarkDecodeBatch(b *testing.B) {
	vllm := Shape{Hashes: HashDigest32, UpperMedium: true, VLLMFields: true}
	for _, c := range []struct {
		name string
		decodeCase
	}{
		{"64x1block/map", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 128}},
		{"64x1block/map/field_by_field", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 128, fieldByField: true}},
		{"64x1block/array", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 128, shape: Shape{EventsAsArrays: true}}},
		{"1x64blocks/map", decodeCase{events: 1, blocksPerEvent: 64, blockSize: 128}},
		// vLLM's default block of 16 tokens, one a decode step fills.
		{"64x1block/tokens=16/array", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 16, shape: Shape{EventsAsArrays: true}}},
		{"64x1block/tokens=16/vllm", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 16, shape: vllm}},
		{"64x1block/tokens=16/vllm/field_by_field", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 16, shape: vllm, fieldByField: true}},
		{"64removals/map", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 1, removals: true}},
		{"64removals/map/field_by_field", decodeCase{events: 64, blocksPerEvent: 1, blockSize: 1, removals: true, fieldByField: true}},
	} {
		b.Run(c.name, func(b *testing.B) { benchmarkDecode(b, c.decodeCase) })
	}
}

// BenchmarkAppendBatch measures the encoder the engine emulator uses.
func BenchmarkAppendBatch(b *testing.B) {
	src := benchBatch(0, 64, 1, 128)
	buf := AppendBatch(nil, src, Shape{})
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBatch(buf[:0], src, Shape{})
	}
	b.ReportMetric(64*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkReadTokensAtEnd reads one block's token array at the end of a
// message, where fewer bytes than a window follow its first id (walkTail
// walks a copy of them), against the same array with a window's bytes
// after it. The ids are drawn uniformly from a 151,936-token vocabulary,
// 4,096 arrays in turn, so that the predictor cannot learn their widths.
func BenchmarkReadTokensAtEnd(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{16, 128} {
		for _, place := range []string{"end", "middle"} {
			const variants = 4096
			var msgs [][]byte
			for range variants {
				p := make([]byte, 24) // the message's bytes before the array
				p = msgp.AppendArrayHeader(p, uint32(n))
				for range n {
					p = msgp.AppendUint32(p, uint32(rng.IntN(151_936)))
				}
				if place == "middle" {
					p = append(p, make([]byte, idChunk+16)...)
				}
				msgs = append(msgs, p)
			}
			b.Run(fmt.Sprintf("ids=%d/place=%s", n, place), func(b *testing.B) {
				var bt Batch
				i := 0
				for b.Loop() {
					bt.payload, bt.tokens = msgs[i%variants], bt.tokens[:0]
					if _, _, _, err := readTokens(bt.payload[24:], &bt); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}
