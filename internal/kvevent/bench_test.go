package kvevent

import (
	"testing"
)

// benchBatch builds events*blocksPerEvent blocks of blockSize tokens with
// token ids spread over a 150k vocabulary, as a real tokenizer produces.
func benchBatch(events, blocksPerEvent, blockSize int) *Batch {
	b := &Batch{Timestamp: 1.7e9, HasDPRank: true}
	hashes := make([]EngineHash, blocksPerEvent)
	tokens := make([]uint32, blocksPerEvent*blockSize)
	next := uint64(0x9e3779b97f4a7c15)
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

func benchmarkDecode(b *testing.B, events, blocksPerEvent int, s Shape) {
	src := benchBatch(events, blocksPerEvent, 128)
	payload := AppendBatch(nil, src, s)
	d := NewDecoder(0)
	var dst Batch
	if err := d.DecodeBatch(payload, &dst); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := d.DecodeBatch(payload, &dst); err != nil {
			b.Fatal(err)
		}
	}
	blocks := float64(events * blocksPerEvent)
	b.ReportMetric(blocks*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(blocks*float64(b.N)), "ns/block")
}

// BenchmarkDecodeBatch measures the decode hot path (R-WIRE-2) for the
// shapes engines send: 64 single-block events, and one 64-block event.
func BenchmarkDecodeBatch(b *testing.B) {
	b.Run("64x1block/map", func(b *testing.B) { benchmarkDecode(b, 64, 1, Shape{}) })
	b.Run("64x1block/array", func(b *testing.B) { benchmarkDecode(b, 64, 1, Shape{EventsAsArrays: true}) })
	b.Run("1x64blocks/map", func(b *testing.B) { benchmarkDecode(b, 1, 64, Shape{}) })
}

// BenchmarkAppendBatch measures the encoder the engine emulator uses.
func BenchmarkAppendBatch(b *testing.B) {
	src := benchBatch(64, 1, 128)
	buf := AppendBatch(nil, src, Shape{})
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBatch(buf[:0], src, Shape{})
	}
	b.ReportMetric(64*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}
