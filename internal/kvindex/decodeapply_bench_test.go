package kvindex

import (
	"fmt"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex/prefillgen"
)

// BenchmarkDecodeApplyFresh measures a stream goroutine's work per live
// message at steady state on blocks it has never seen, on one core:
// decode a message of 64 new 128-token blocks with random ids of a
// 151,936-token vocabulary, plus the removal of the 64 blocks the engine
// evicted, and apply it to an index of index= blocks, filled beforehand
// and kept at that size. The blocks come in one of prefillgen.Shapes:
// one prefill in one event or in events of one block, or a batch of
// decode steps (chains=64); or as vLLM sends them (vllm/...:
// 16-token blocks, 32-byte hashes, a removal event a block), into an
// index of 16-token blocks. blocks/s counts the stored blocks;
// blocks/cpu-s counts them per CPU second of the benchmark's thread.
//
// The events are applied in runs of up to benchRunBlocks blocks
// (ApplyRun), as a directory's stream applies them: a prefill's events of
// one block are then stored together, a batch of decode steps' one by
// one.
//
// With streams=32 the messages go in turn to 32 such indexes, as a
// directory's streams take turns on its cores: each message then finds
// its index as the other streams' messages left the caches, not as its
// own last message did.
func BenchmarkDecodeApplyFresh(b *testing.B) {
	for _, c := range []struct{ size, streams int }{{16384, 1}, {65536, 1}, {262144, 1}, {262144, 32}} {
		for _, sh := range prefillgen.Shapes() {
			name := fmt.Sprintf("index=%d/%s", c.size, sh.Name)
			if c.streams > 1 {
				name = fmt.Sprintf("index=%d/streams=%d/%s", c.size, c.streams, sh.Name)
			}
			b.Run(name, func(b *testing.B) { benchDecodeApplyFresh(b, c.size, c.streams, sh.Options) })
		}
	}
}

// benchRunBlocks is the bound on a run's blocks that kvdir's streams
// give ApplyRun.
const benchRunBlocks = 64

func benchDecodeApplyFresh(b *testing.B, size, streams int, shape prefillgen.Options) {
	window := size / prefillgen.Blocks
	ixs := make([]*Index, streams)
	for s := range ixs {
		ixs[s] = New(Config{BlockSize: shape.BlockSize(), HashSeed: 1024, MaxBlocks: size})
	}
	dec := kvevent.NewDecoder(8 << 20)
	var batch kvevent.Batch
	apply := func(ix *Index, f *prefillgen.Message, i int) {
		f.Rewrite(i, window)
		if err := dec.DecodeBatch(f.Payload, &batch); err != nil {
			b.Fatal(err)
		}
		for e := 0; e < len(batch.Events); {
			n, err := ix.ApplyRun(batch.Events[e:], Delta, benchRunBlocks)
			if e += n; err != nil {
				b.Fatalf("iteration %d event %d: %v", i, e, err)
			}
		}
	}
	fill := prefillgen.NewWith(b, shape.Fill())
	for _, ix := range ixs {
		for i := range window {
			apply(ix, fill, i)
		}
		if dev, _ := ix.Counts(); dev != size {
			b.Fatalf("index holds %d blocks after filling, want %d", dev, size)
		}
	}
	shape.Removals = true
	steady := prefillgen.NewWith(b, shape)
	b.SetBytes(int64(len(steady.Payload)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu := prefillgen.StartCPU()
	for i := range b.N {
		apply(ixs[i%streams], steady, window+i/streams)
	}
	cpu.Report(b, float64(b.N)*prefillgen.Blocks)
	b.ReportMetric(float64(b.N)*prefillgen.Blocks/b.Elapsed().Seconds(), "blocks/s")
	b.StopTimer()
	for _, ix := range ixs {
		// Removed blocks stay as ghosts until new ones need room.
		st := ix.Stats()
		st.GhostEvictions = 0
		if dev, _ := ix.Counts(); dev != size || st != (Stats{}) {
			b.Fatalf("index holds %d blocks, want %d; anomalies %+v", dev, size, ix.Stats())
		}
	}
}
