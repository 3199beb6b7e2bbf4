package kvindex

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// freshPrefill is one encoded live message of an engine at steady state:
// the BlockRemoved of the blocks it evicted, then the BlockStored of a
// new prompt's blocks. Every iteration rewrites it in place so that it
// carries blocks nobody has seen: new engine hashes (removals name those
// stored window iterations earlier) and a new chain, whose first two
// tokens hold the iteration number. The rewrite is a few hundred byte
// stores, well under 1 % of decoding and applying the message.
type freshPrefill struct {
	payload []byte
	stored  [][]int // offsets of the uint64 encodings of stored hash j
	removed [][]int // same for removed hash j; nil without removals
	first   [2]int  // offsets of the uint32 encodings of tokens 0 and 1
}

const (
	freshBlocks     = 64
	freshVocabulary = 151_936 // Qwen-sized: most ids encode in 5 bytes
	storedMark      = 0xa5a5_0000_0000_0000
	removedMark     = 0x5a5a_0000_0000_0000
	tokenMark       = 0x00fe_dc00 // above every vocabulary id
)

// newFreshPrefill encodes the message with marker values, finds them and
// keeps their offsets.
func newFreshPrefill(tb testing.TB, blocksPerEvent int, withRemovals bool) *freshPrefill {
	tb.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	tokens := make([]uint32, freshBlocks*benchBlockSize)
	for i := range tokens {
		tokens[i] = rng.Uint32N(freshVocabulary)
	}
	tokens[0], tokens[1] = tokenMark, tokenMark+1
	hashes := make([]kvevent.EngineHash, freshBlocks)
	gone := make([]kvevent.EngineHash, freshBlocks)
	for j := range hashes {
		hashes[j] = kvevent.IntHash(storedMark + uint64(j))
		gone[j] = kvevent.IntHash(removedMark + uint64(j))
	}
	b := &kvevent.Batch{Timestamp: 1.7e9, HasDPRank: true}
	if withRemovals {
		b.AddRemoved(gone, kvevent.Device)
	}
	for i := 0; i < freshBlocks; i += blocksPerEvent {
		var parent kvevent.EngineHash
		if i > 0 {
			parent = hashes[i-1]
		}
		b.AddStored(hashes[i:i+blocksPerEvent], parent, i > 0, tokens[i*benchBlockSize:(i+blocksPerEvent)*benchBlockSize], benchBlockSize, kvevent.Device)
	}
	f := &freshPrefill{payload: kvevent.AppendBatch(nil, b, kvevent.Shape{})}
	find := func(enc []byte, want int) []int {
		var offs []int
		for at := 0; ; {
			i := bytes.Index(f.payload[at:], enc)
			if i < 0 {
				break
			}
			offs = append(offs, at+i+1) // past the type byte
			at += i + len(enc)
		}
		if len(offs) != want {
			tb.Fatalf("marker %x found %d times, want %d", enc, len(offs), want)
		}
		return offs
	}
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64([]byte{0xcf}, v) }
	for j := range freshBlocks {
		// A stored hash is also the parent of the next event.
		want := 1
		if j%blocksPerEvent == blocksPerEvent-1 && j < freshBlocks-1 {
			want = 2
		}
		f.stored = append(f.stored, find(u64(hashes[j].Lo), want))
		if withRemovals {
			f.removed = append(f.removed, find(u64(gone[j].Lo), 1))
		}
	}
	for k := range f.first {
		f.first[k] = find(binary.BigEndian.AppendUint32([]byte{0xce}, tokenMark+uint32(k)), 1)[0]
	}
	return f
}

// freshHash is engine hash j of iteration i: spread over 64 bits like a
// real one, distinct, and at least 2^32 so its encoding keeps its width.
func freshHash(i, j int) uint64 {
	x := uint64(i)*freshBlocks + uint64(j) + 1
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	if x < 1<<32 {
		x |= 1 << 63
	}
	return x
}

// rewrite makes the message iteration i's; removals name the blocks of
// iteration i-window.
func (f *freshPrefill) rewrite(i, window int) {
	for j, offs := range f.stored {
		for _, o := range offs {
			binary.BigEndian.PutUint64(f.payload[o:], freshHash(i, j))
		}
	}
	for j, offs := range f.removed {
		binary.BigEndian.PutUint64(f.payload[offs[0]:], freshHash(i-window, j))
	}
	// Ids in [65536, 131072): the same 5-byte encoding, 2^32 chains.
	binary.BigEndian.PutUint32(f.payload[f.first[0]:], 1<<16+uint32(i)&0xffff)
	binary.BigEndian.PutUint32(f.payload[f.first[1]:], 1<<16+uint32(i>>16)&0xffff)
}

// BenchmarkDecodeApplyFresh measures a stream goroutine's work per live
// message at steady state on blocks it has never seen, on one core:
// decode a prefill's message (64 new 128-token blocks with random ids of
// a 151,936-token vocabulary, plus the removal of the 64 blocks the
// engine evicted) and apply it to an index of index= blocks, filled
// beforehand and kept at that size. blocks/s counts the stored blocks.
func BenchmarkDecodeApplyFresh(b *testing.B) {
	for _, size := range []int{16384, 65536, 262144} {
		for _, per := range []int{1, 64} {
			b.Run(fmt.Sprintf("index=%d/blocks_per_event=%d", size, per), func(b *testing.B) {
				window := size / freshBlocks
				ix := New(Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: size})
				dec := kvevent.NewDecoder(8 << 20)
				var batch kvevent.Batch
				apply := func(f *freshPrefill, i int) {
					f.rewrite(i, window)
					if err := dec.DecodeBatch(f.payload, &batch); err != nil {
						b.Fatal(err)
					}
					for e := range batch.Events {
						if err := ix.Apply(&batch.Events[e], Delta); err != nil {
							b.Fatalf("iteration %d event %d: %v", i, e, err)
						}
					}
				}
				fill := newFreshPrefill(b, per, false)
				for i := range window {
					apply(fill, i)
				}
				if dev, _ := ix.Counts(); dev != size {
					b.Fatalf("index holds %d blocks after filling, want %d", dev, size)
				}
				steady := newFreshPrefill(b, per, true)
				b.SetBytes(int64(len(steady.payload)))
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					apply(steady, window+i)
				}
				b.ReportMetric(float64(b.N)*freshBlocks/b.Elapsed().Seconds(), "blocks/s")
				b.StopTimer()
				// Removed blocks stay as ghosts until new ones need room.
				st := ix.Stats()
				st.GhostEvictions = 0
				if dev, _ := ix.Counts(); dev != size || st != (Stats{}) {
					b.Fatalf("index holds %d blocks, want %d; anomalies %+v", dev, size, ix.Stats())
				}
			})
		}
	}
}
