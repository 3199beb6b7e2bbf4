package kvindex

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
)

const benchBlockSize = 128

// benchStream produces chained BlockStored events of blocksPerEvent blocks
// with distinct content and consecutive engine hashes, reusing one event.
type benchStream struct {
	ev   kvevent.Event
	next uint64
}

func newBenchStream(blocksPerEvent int) *benchStream {
	rng := rand.New(rand.NewPCG(1, 2))
	s := &benchStream{ev: kvevent.Event{
		Kind:        kvevent.BlockStored,
		Medium:      kvevent.Device,
		BlockHashes: make([]kvevent.EngineHash, blocksPerEvent),
		TokenIDs:    make([]uint32, blocksPerEvent*benchBlockSize),
		BlockSize:   benchBlockSize,
		PlainText:   true,
	}}
	for i := range s.ev.TokenIDs {
		s.ev.TokenIDs[i] = rng.Uint32N(150000)
	}
	return s
}

// advance makes the event a new root prefix: a distinct first token gives
// every block of the chain a new key.
func (s *benchStream) advance() *kvevent.Event {
	s.ev.TokenIDs[0] = uint32(s.next)
	for i := range s.ev.BlockHashes {
		s.ev.BlockHashes[i] = kvevent.IntHash(s.next*uint64(len(s.ev.BlockHashes)) + uint64(i))
	}
	s.next++
	return &s.ev
}

// BenchmarkApplyStored measures storing 128-token blocks (hashing
// included) into a growing index, in events of 16 blocks as engines batch
// them; the index is cleared when it fills, as an AllBlocksCleared would.
func BenchmarkApplyStored(b *testing.B) {
	const perEvent = 16
	ix := New(Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: DefaultMaxBlocks})
	s := newBenchStream(perEvent)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += perEvent {
		if ix.Len()+perEvent > DefaultMaxBlocks {
			ix.Clear()
		}
		if err := ix.Apply(s.advance(), Delta); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkApplySteadyState measures a full index under churn: every event
// stores 16 new Device blocks and removes the 16 stored 2048 events
// earlier, so ghosts pile up and each store beyond capacity evicts one.
func BenchmarkApplySteadyState(b *testing.B) {
	const (
		perEvent = 16
		lag      = 2048
		maxBlock = 65536
	)
	ix := New(Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: maxBlock})
	s := newBenchStream(perEvent)
	rm := &kvevent.Event{Kind: kvevent.BlockRemoved, Medium: kvevent.Device, BlockHashes: make([]kvevent.EngineHash, perEvent)}
	step := func() {
		ev := s.advance()
		if err := ix.Apply(ev, Delta); err != nil {
			b.Fatal(err)
		}
		if s.next > lag {
			old := s.next - 1 - lag
			for j := range rm.BlockHashes {
				rm.BlockHashes[j] = kvevent.IntHash(uint64(old*perEvent + uint64(j)))
			}
			if err := ix.Apply(rm, Delta); err != nil {
				b.Fatal(err)
			}
		}
	}
	for ix.Stats().GhostEvictions == 0 {
		step()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += perEvent {
		step()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkMatch queries an 8k-token prompt (64 blocks) that is fully on
// Device through a KeyLookup of an index that also holds 64k unrelated
// blocks.
func BenchmarkMatch(b *testing.B) {
	ix := New(Config{BlockSize: benchBlockSize, HashSeed: 1024})
	s := newBenchStream(64)
	for range 1024 {
		if err := ix.Apply(s.advance(), Delta); err != nil {
			b.Fatal(err)
		}
	}
	ev := s.advance()
	if err := ix.Apply(ev, Delta); err != nil {
		b.Fatal(err)
	}
	keys := KeysFor(ev.TokenIDs, benchBlockSize, 1024, nil)
	var l KeyLookup
	l.Build(ix)
	if m := l.Match(keys); m.DeviceBlocks != 64 {
		b.Fatalf("Match = %+v, want 64 device blocks", m)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if l.Match(keys).DeviceBlocks != 64 {
			b.Fatal("miss")
		}
	}
}

// BenchmarkKeysFor hashes an 8192-token prompt into 64 block keys.
func BenchmarkKeysFor(b *testing.B) {
	tokens := newBenchStream(64).ev.TokenIDs
	dst := make([]Key, 0, 64)
	b.SetBytes(int64(4 * len(tokens)))
	b.ReportAllocs()
	for range b.N {
		dst = KeysFor(tokens, benchBlockSize, 1024, dst)
	}
	if len(dst) != 64 {
		b.Fatalf("%d keys", len(dst))
	}
}

// BenchmarkIndexMemory reports the live heap per resident block of an
// index holding 262,144 single-tier blocks (target: at most 64 bytes).
func BenchmarkIndexMemory(b *testing.B) {
	const blocks = DefaultMaxBlocks
	s := newBenchStream(64)
	var perBlock float64
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ix := New(Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: blocks})
		for ix.Len() < blocks {
			if err := ix.Apply(s.advance(), Snapshot); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if d, _ := ix.Counts(); d != blocks {
			b.Fatalf("%d device blocks", d)
		}
		perBlock = float64(after.HeapAlloc-before.HeapAlloc) / blocks
		runtime.KeepAlive(ix)
	}
	b.ReportMetric(perBlock, "B/block")
}
