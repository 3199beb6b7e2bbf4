package kvdir

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvindex/prefillgen"
)

const benchBlockSize = 128

// promptTokens returns n token ids of prompt p with real text's widths
// (see prefillgen.Text), distinct across prompts; the first n of a longer
// prompt p are the same.
func promptTokens(p, n int) []uint32 {
	return prefillgen.Real.IDs(rand.New(rand.NewPCG(uint64(p), 0x5eed)), n)
}

// storedBatch builds one batch of BlockStored events for the full blocks
// of tokens, chained from the root, eventsPerBatch blocks per event.
func storedBatch(tokens []uint32, hashBase uint64, blocksPerEvent int) *kvevent.Batch {
	b := &kvevent.Batch{}
	n := len(tokens) / benchBlockSize
	hashes := make([]kvevent.EngineHash, n)
	for i := range hashes {
		hashes[i] = kvevent.IntHash(hashBase + uint64(i))
	}
	for i := 0; i < n; i += blocksPerEvent {
		j := min(i+blocksPerEvent, n)
		var parent kvevent.EngineHash
		if i > 0 {
			parent = hashes[i-1]
		}
		b.AddStored(hashes[i:j], parent, i > 0, tokens[i*benchBlockSize:j*benchBlockSize], benchBlockSize, kvevent.Device)
	}
	return b
}

// syncedStreams builds n published stream views, each holding the first
// shared blocks of prompt 0 and then its own continuation, as engines
// behind one shared system prompt do.
func syncedStreams(tb testing.TB, n, shared, total int) []*stream {
	tb.Helper()
	streams := make([]*stream, n)
	t := newKeyTable(benchBlockSize, 1024)
	for i := range streams {
		tokens := slices.Concat(promptTokens(0, shared*benchBlockSize), promptTokens(i+1, (total-shared)*benchBlockSize))
		ix := kvindex.New(kvindex.Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: 262144})
		b := storedBatch(tokens, uint64(i)<<32, 16)
		for e := range b.Events {
			if err := ix.Apply(&b.Events[e], kvindex.Delta); err != nil {
				tb.Fatal(err)
			}
		}
		s := newStream(StreamSpec{InstanceName: fmt.Sprintf("10.0.0.%d:8000", i), BlockSize: benchBlockSize, HashSeed: 1024})
		s.attach(t)
		s.publish(ix, 1, true, true)
		streams[i] = s
	}
	return streams
}

func viewOf(streams []*stream) *Directory {
	d := &Directory{}
	set := &streamSet{streams: streams, groups: []keyGroup{{benchBlockSize, 1024}}, groupOf: make([]int, len(streams)),
		tables: []*keyTable{streams[0].keys}}
	// As SetStreams does for the tables it makes: the directory counts
	// their walks under the lock.
	streams[0].keys.lockedWalks = &d.lockedWalks
	d.set.Store(set.index())
	d.scratch.New = func() any { return &queryScratch{} }
	return d
}

// BenchmarkDecodeApply measures the stream goroutine's steady work on one
// core: decode a live payload of 128-token BlockStored blocks and apply it
// to the index, a run of events at a time.
func BenchmarkDecodeApply(b *testing.B) {
	const blocks = 64
	tokens := promptTokens(1, blocks*benchBlockSize)
	for _, per := range []int{1, 16} {
		b.Run(fmt.Sprintf("blocks_per_event=%d", per), func(b *testing.B) {
			payload := kvevent.AppendBatch(nil, storedBatch(tokens, 1, per), kvevent.Shape{})
			dec := kvevent.NewDecoder(8 << 20)
			var batch kvevent.Batch
			ix := kvindex.New(kvindex.Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: 262144})
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := dec.DecodeBatch(payload, &batch); err != nil {
					b.Fatal(err)
				}
				if _, err := applyEvents(ix, batch.Events, kvindex.Delta); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*blocks/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// snapshotPayloads encodes blocks resident blocks as replay batches of
// perBatch blocks each, parent first, in chains of 4096 blocks.
func snapshotPayloads(blocks, perBatch int) [][]byte {
	const chain = 4096
	var out [][]byte
	b := &kvevent.Batch{}
	for c := 0; c < blocks/chain; c++ {
		tokens := promptTokens(c+1, chain*benchBlockSize)
		full := storedBatch(tokens, uint64(c)<<40, perBatch)
		for e := range full.Events {
			b.Reset()
			ev := &full.Events[e]
			b.AddStored(ev.BlockHashes, ev.ParentHash, ev.HasParent, ev.TokenIDs, ev.BlockSize, ev.Medium)
			out = append(out, kvevent.AppendBatch(nil, b, kvevent.Shape{}))
		}
	}
	return out
}

// BenchmarkSnapshotApply262144 measures kvcar's side of a full snapshot
// at the default max_blocks_per_stream: decode 262,144 blocks of 128
// tokens in replay batches of 512 blocks, build the new index in
// snapshot mode and publish it (R-REC-2), writing its keys into the
// shared key table, without the network. view=replaced is a recovery or
// calibration of a stream whose last view held as many blocks, which its
// new index reserves; view=first is a stream's first snapshot, into a
// key table of its own, with nothing to size the index by.
func BenchmarkSnapshotApply262144(b *testing.B) {
	payloads := snapshotPayloads(262144, 512)
	wire := 0
	for _, p := range payloads {
		wire += len(p)
	}
	for _, first := range []bool{false, true} {
		name := "view=replaced"
		if first {
			name = "view=first"
		}
		b.Run(name, func(b *testing.B) {
			newStreamOfItsOwn := func() *stream {
				s := newStream(StreamSpec{InstanceName: "a", BlockSize: benchBlockSize, HashSeed: 1024})
				s.attach(newKeyTable(benchBlockSize, 1024))
				return s
			}
			s := newStreamOfItsOwn()
			dec := kvevent.NewDecoder(8 << 20)
			var batch kvevent.Batch
			snapshot := func() {
				ix := kvindex.New(kvindex.Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: 262144})
				ix.Reserve(s.viewSize()) // as syncer.newIndex
				for _, p := range payloads {
					if err := dec.DecodeBatch(p, &batch); err != nil {
						b.Fatal(err)
					}
					for e := range batch.Events {
						if err := ix.Apply(&batch.Events[e], kvindex.Snapshot); err != nil {
							b.Fatal(err)
						}
					}
				}
				s.publish(ix, 1, true, true)
			}
			if !first {
				snapshot() // the view the timed ones replace
			}
			b.SetBytes(int64(wire))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if first {
					s = newStreamOfItsOwn()
					runtime.GC() // the last stream's index and table are garbage now, not during the snapshot
				} else {
					// A recovery publishes into a withdrawn slot: the
					// view's keys are written into the shared key table
					// as part of publishing.
					s.invalidate("recovering")
				}
				b.StartTimer()
				snapshot()
			}
			b.StopTimer()
			if d, _ := s.idx.Counts(); d != 262144 {
				b.Fatalf("published %d blocks", d)
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/snapshot")
		})
	}
}

// BenchmarkSnapshotOverTCP262144 measures a whole recovery over real TCP:
// the engine emulator holds 262,144 blocks of 128 tokens; each iteration
// subscribes a fresh directory and waits until the stream is published.
// snapshot-ms is the request-to-publish time the stream records (it
// includes the emulator encoding its reply); receive+apply-ms is kvcar's
// own part, from the first reply batch to publish.
func BenchmarkSnapshotOverTCP262144(b *testing.B) {
	e, err := enginesim.New(enginesim.Config{Name: "127.0.0.1:8000", DeviceBlocks: 262144, BlockSize: benchBlockSize, Topic: "xllm-kv"})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(); err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for c := range 64 {
		if _, err := e.StoreChain(0, promptTokens(c+1, 4096*benchBlockSize), kvevent.Device); err != nil {
			b.Fatal(err)
		}
	}
	lim := Limits{MaxBlocksPerStream: 262144, MaxMessageBytes: 8 << 20, MaxBufferedBytes: 16 << 20, ReplayTimeout: 30 * time.Second}
	spec := StreamSpec{InstanceName: e.Name(), Endpoint: e.EventEndpoint(0), ReplayEndpoint: e.ReplayEndpoint(0),
		Topic: "xllm-kv", BlockSize: benchBlockSize, HashSeed: 1024}
	var snapNanos, recvNanos int64
	b.ResetTimer()
	for range b.N {
		d, err := New(lim, Options{Logger: testLogger()})
		if err != nil {
			b.Fatal(err)
		}
		if err := d.SetStreams([]StreamSpec{spec}); err != nil {
			b.Fatal(err)
		}
		s := d.streamOf(spec.Key())
		for {
			if synced, _, _ := s.status(); synced {
				break
			}
			time.Sleep(time.Millisecond)
		}
		snapNanos += s.counters.lastSnapshot.Load()
		recvNanos += s.counters.lastSnapshotReceive.Load()
		b.StopTimer()
		if m := d.Query(nil, nil); m[0].DeviceBlocks != 262144 {
			b.Fatalf("published %d blocks", m[0].DeviceBlocks)
		}
		d.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(snapNanos)/float64(b.N)/1e6, "snapshot-ms")
	b.ReportMetric(float64(recvNanos)/float64(b.N)/1e6, "receive+apply-ms")
}

// BenchmarkCalibration measures one stream's periodic calibration (R-REC-4)
// end to end over real TCP: the engine emulator holds blocks of 128
// tokens and publishes nothing, the directory calibrates every few
// milliseconds, and each iteration is one calibration that succeeded:
// connect a replay DEALER, request, receive, decode and apply the whole
// state into a new index, compare it with the served one and publish it.
// waits/op counts the stream goroutine's waits per calibration and
// cpu-us/op the process's CPU, the engine's encoding of its reply
// included.
func BenchmarkCalibration(b *testing.B) {
	for _, blocks := range []int{256, 4096} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			e, err := enginesim.New(enginesim.Config{Name: "127.0.0.1:8000", DeviceBlocks: blocks, BlockSize: benchBlockSize, Topic: "xllm-kv"})
			if err != nil {
				b.Fatal(err)
			}
			if err := e.Start(); err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			for c := range blocks / 256 {
				if _, err := e.StoreChain(0, promptTokens(c+1, 256*benchBlockSize), kvevent.Device); err != nil {
					b.Fatal(err)
				}
			}
			lim := Limits{MaxBlocksPerStream: 262144, MaxMessageBytes: 8 << 20, MaxBufferedBytes: 16 << 20,
				ReplayTimeout: 10 * time.Second, ResyncInterval: 4 * time.Millisecond}
			spec := StreamSpec{InstanceName: e.Name(), Endpoint: e.EventEndpoint(0), ReplayEndpoint: e.ReplayEndpoint(0),
				Topic: "xllm-kv", BlockSize: benchBlockSize, HashSeed: 1024}
			d, err := New(lim, Options{Logger: testLogger()})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			if err := d.SetStreams([]StreamSpec{spec}); err != nil {
				b.Fatal(err)
			}
			s := d.streamOf(spec.Key())
			for s.counters.snapshotsOK.Load() < 2 {
				time.Sleep(time.Millisecond)
			}
			ok0, waits0, cpu0 := s.counters.snapshotsOK.Load(), s.counters.waits.Load(), processCPU(b)
			b.ResetTimer()
			for s.counters.snapshotsOK.Load() < ok0+uint64(b.N) {
				time.Sleep(100 * time.Microsecond)
			}
			b.StopTimer()
			n := float64(s.counters.snapshotsOK.Load() - ok0)
			b.ReportMetric(float64(s.counters.waits.Load()-waits0)/n, "waits/op")
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/n, "cpu-us/op")
			if m := d.Query(nil, nil); m[0].DeviceBlocks != blocks {
				b.Fatalf("published %d blocks, want %d", m[0].DeviceBlocks, blocks)
			}
		})
	}
}

// processCPU is the CPU time, user and system, this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
