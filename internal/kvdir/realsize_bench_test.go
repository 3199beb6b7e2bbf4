package kvdir

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/cpunoise"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvindex/prefillgen"
)

// Real-size query benchmarks. Every stream holds conversations of 8k
// tokens (64 blocks of 128 tokens, or 512 of vLLM's default 16) of random
// Qwen-sized token ids: half of its blocks are popular conversations that
// every stream holds (shared system prompts and documents), half its own.
// Prompts rotate through many distinct ones, so a query finds the table
// as a router does, not one prompt's records hot in cache.
const (
	realStreams    = 128
	realTokens     = 8192
	realChain      = realTokens / benchBlockSize
	realVocabulary = 151_643
	realPrompts    = 512
	// shortTokens is a short prompt's length: 12 blocks of 128 tokens, a
	// conversation's first turn after a system prompt.
	shortTokens = 1536
)

// chainTokens returns the tokens of conversation c.
func chainTokens(c uint64, dst []uint32) []uint32 {
	rng := rand.New(rand.NewPCG(c, 0x636861696e))
	dst = dst[:0]
	for range realTokens {
		dst = append(dst, rng.Uint32N(realVocabulary))
	}
	return dst
}

// realDirectory is 128 published streams of perStream blocks of bs
// tokens each.
type realDirectory struct {
	d       *Directory
	bs      int
	chain   int // blocks of a conversation
	shared  int // conversations every stream holds
	private int // conversations of each stream alone
}

func privateChain(stream, i int) uint64 { return uint64(stream+1)<<32 | uint64(i) }

func buildRealDirectory(tb testing.TB, perStream int) *realDirectory {
	return buildRealDirectoryOf(tb, perStream, benchBlockSize)
}

func buildRealDirectoryOf(tb testing.TB, perStream, bs int) *realDirectory {
	tb.Helper()
	r := &realDirectory{bs: bs, chain: realTokens / bs}
	r.shared = perStream / 2 / r.chain
	r.private = perStream/r.chain - r.shared
	r.d = buildStreams(tb, perStream, bs, func(i int, add func(uint64)) {
		for c := range r.shared {
			add(uint64(c))
		}
		for c := range r.private {
			add(privateChain(i, c))
		}
	})
	return r
}

// buildStreams publishes 128 streams of at most maxBlocks blocks of bs
// tokens each in one key group; stream i holds the conversations
// chains(i) adds. Indexes are built on both cores; publication into the
// shared table is serialised by the table anyway.
func buildStreams(tb testing.TB, maxBlocks, bs int, chains func(i int, add func(uint64))) *Directory {
	tab := newKeyTable(bs, 1024)
	streams := make([]*stream, realStreams)
	chain := realTokens / bs
	for i := range streams {
		name := fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
		streams[i] = newStream(StreamSpec{InstanceName: name, Incarnation: "inc-" + name, BlockSize: bs, HashSeed: 1024})
		streams[i].attach(tab)
	}
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, realStreams)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tokens []uint32
			hashes := make([]kvevent.EngineHash, chain)
			for i := range next {
				ix := kvindex.New(kvindex.Config{BlockSize: bs, HashSeed: 1024, MaxBlocks: maxBlocks})
				chains(i, func(id uint64) {
					tokens = chainTokens(id, tokens)
					for j := range hashes {
						hashes[j] = kvevent.IntHash(id<<10 | uint64(j))
					}
					for j := 0; j < chain; j += 16 {
						ev := kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Device, BlockSize: bs, PlainText: true,
							BlockHashes: hashes[j : j+16], TokenIDs: tokens[j*bs : (j+16)*bs]}
						if j > 0 {
							ev.HasParent, ev.ParentHash = true, hashes[j-1]
						}
						if err := ix.Apply(&ev, kvindex.Delta); err != nil {
							errs <- err
							return
						}
					}
				})
				streams[i].publish(ix, 1, true, true)
			}
		}()
	}
	for i := range streams {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		tb.Fatal(err)
	default:
	}
	// Sorted by name, as SetStreams sorts a directory's streams and as
	// a router joining them with a registry snapshot needs them.
	slices.SortFunc(streams, func(a, b *stream) int { return strings.Compare(a.spec.InstanceName, b.spec.InstanceName) })
	// A growth the fills began goes on with the writes after them, a
	// step per write; it is finished here, and the cells left as a
	// growth leaves them, so that the timed writes are a directory's
	// steady state, not the end of its fill nor wherever between two
	// growths the fills stopped (BenchmarkKeyTableGrowth measures
	// growths).
	tab.settle()
	// The fill leaves gigabytes of garbage at 262,144 blocks per stream:
	// the indexes' and the table's outgrown arrays. Left to the runtime,
	// its background scavenger hands them back to the kernel over the
	// next seconds, a little at a time, and each hand-back flushes the
	// timed thread's TLB (madvise): none-hit queries then took 10 µs at
	// p99 in bursts, against 3 µs once that memory was returned at once
	// here (see the performance log, "The none-hit tail was the
	// scavenger"). What is timed is a directory at steady state.
	debug.FreeOSMemory()
	return viewOf(streams)
}

// prompts returns realPrompts distinct 8k-token prompts of one kind:
// "all" a conversation every stream holds whole, "half" the first half
// of one followed by new text, "none" new text, "one" a
// conversation one stream holds (the others miss at its first block);
// "short" is "all" cut to shortTokens, the prompts kvcar-scale sends.
func (r *realDirectory) prompts(kind string) ([][]uint32, int) {
	rng := rand.New(rand.NewPCG(uint64(len(kind)), 99))
	out := make([][]uint32, realPrompts)
	want := 0
	for p := range out {
		switch kind {
		case "all":
			out[p] = chainTokens(uint64(rng.IntN(r.shared)), nil)
			want = r.chain
		case "short":
			out[p] = chainTokens(uint64(rng.IntN(r.shared)), nil)[:shortTokens]
			want = shortTokens / r.bs
		case "half":
			t := chainTokens(uint64(rng.IntN(r.shared)), nil)
			fresh := chainTokens(1<<62|uint64(p), nil)
			copy(t[r.chain/2*r.bs:], fresh)
			out[p] = t
			want = r.chain / 2
		case "none":
			out[p] = chainTokens(1<<61|uint64(p), nil)
		case "one":
			out[p] = chainTokens(privateChain(rng.IntN(realStreams), rng.IntN(r.private)), nil)
			want = -1
		}
	}
	return out, want
}

// BenchmarkQueryRealSize measures Directory.Query of 8k-token prompts (and
// of shortTokens, "short") over 128 streams holding 16,384, 65,536 and
// 262,144 blocks each (R-DIR-4), reporting per-query p50 and p99 and the
// share of queries delayed past the p50 (see reportPercentiles).
// "perstream" is the walk the directory did before the shared key table
// (every stream's own index, under its lock, through a key table per
// index, built here as the indexes no longer keep one) over the same data
// and "all" prompts, for comparison; "all-cold" is "all" with the caches
// evicted (coldBytes written) before each query, as a router's sparse
// decisions find them, and the prompt then copied to the request's buffer,
// as its parser just wrote it. The directory is built once per size and
// shared by the sub-benchmarks.
func BenchmarkQueryRealSize(b *testing.B) {
	benchQueryRealSize(b, benchBlockSize, []int{16384, 65536, 262144})
}

// BenchmarkQuerySmallBlocks is BenchmarkQueryRealSize with blocks of 16
// tokens, vLLM's default --block-size: an 8k-token prompt is 512 blocks
// to hash and look up, not 64. "perstream" and "all-under-writes" are
// left out (the first takes milliseconds a query, the second's writer
// sends 128-token blocks).
func BenchmarkQuerySmallBlocks(b *testing.B) {
	benchQueryRealSize(b, 16, []int{65536, 262144})
}

func benchQueryRealSize(b *testing.B, bs int, sizes []int) {
	kinds := []string{"all", "half", "none", "one", "short", "perstream", "all-cold"}
	if bs != benchBlockSize {
		kinds = []string{"all", "half", "none", "one", "short", "all-cold"}
	}
	for _, perStream := range sizes {
		b.Run(fmt.Sprintf("blocks=%d", perStream), func(b *testing.B) {
			r := buildRealDirectoryOf(b, perStream, bs)
			for _, kind := range kinds {
				b.Run(kind, func(b *testing.B) {
					pk := kind
					if kind == "perstream" || kind == "all-cold" {
						pk = "all"
					}
					// all-cold evicts the caches before each query, untimed:
					// a router's decisions are sparse next to its event
					// writes and heartbeats, so the streams' views and the
					// table's records are rarely in cache when one starts.
					var evict []byte
					if kind == "all-cold" {
						evict = make([]byte, coldBytes)
					}
					prompts, want := r.prompts(pk)
					dst := make([]Match, 0, realStreams)
					var keys []kvindex.Key
					var lookups []kvindex.KeyLookup
					if kind == "perstream" {
						streams := r.d.set.Load().streams
						lookups = make([]kvindex.KeyLookup, len(streams))
						for i, s := range streams {
							lookups[i].Build(s.idx)
						}
					}
					query := func(p []uint32) {
						if kind != "perstream" {
							dst = r.d.Query(p, dst[:0])
							return
						}
						keys = kvindex.KeysFor(p, r.bs, 1024, keys[:0])
						dst = dst[:0]
						for i, s := range r.d.set.Load().streams {
							s.mu.RLock()
							m := lookups[i].Match(keys)
							s.mu.RUnlock()
							dst = append(dst, Match{DeviceHitTokens: m.DeviceBlocks * r.bs})
						}
					}
					for i, p := range prompts[:8] {
						query(p)
						hits := 0
						for _, m := range dst {
							if m.DeviceHitTokens > 0 {
								hits++
							}
						}
						switch {
						case want >= 0 && dst[0].DeviceHitTokens != want*r.bs:
							b.Fatalf("prompt %d: %d tokens hit, want %d", i, dst[0].DeviceHitTokens, want*r.bs)
						case want < 0 && hits != 1:
							b.Fatalf("prompt %d: %d streams hit, want 1", i, hits)
						}
					}
					lat := make([]time.Duration, 0, b.N)
					b.ReportAllocs()
					b.ResetTimer()
					// The prompt is copied to one buffer, untimed, after any
					// eviction: a request's ids were just written by its
					// parser, so they are in cache, while the table's records
					// are not.
					hot := make([]uint32, realTokens)
					for i := range b.N {
						for j := 0; j < len(evict); j += 64 {
							evict[j]++
						}
						p := hot[:copy(hot, prompts[i%len(prompts)])]
						t0 := time.Now()
						query(p)
						lat = append(lat, time.Since(t0))
					}
					b.StopTimer()
					reportLatency(b, lat)
				})
			}
			if bs == benchBlockSize {
				b.Run("all-under-writes", func(b *testing.B) { queryUnderWrites(b, r, perStream) })
			}
			r = nil
			runtime.GC()
		})
	}
}

// coldBytes is what all-cold writes over before each query: more than
// any last-level cache of the machines this runs on.
const coldBytes = 64 << 20

// reportLatency reports the p50 and p99 of lat and, for a run long
// enough to have a p99, the machine's bound on that p99: a busy thread
// records what interrupts it for boundTrace right after the run, and
// bound-p99-µs is the p99 of how long CPU work as long as the run's p50
// takes when only those interruptions delay it (internal/cpunoise). On a
// virtual machine the interruptions come and go with the hour: a p99 is
// the code's only where it stands well above its bound.
func reportLatency(b *testing.B, lat []time.Duration) {
	b.Helper()
	p50 := reportPercentiles(b, lat)
	if len(lat) < boundMinSamples {
		return
	}
	trace, err := cpunoise.Record(boundTrace, cpunoise.Threshold)
	if err != nil {
		b.Fatal(err)
	}
	q, err := trace.Elapsed(p50, cpunoise.Starts, 0.99)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(q[0].Nanoseconds())/1e3, "bound-p99-µs")
}

// reportPercentiles sorts lat, reports its p50 and p99 and the share of
// delayed samples, and returns the p50. A sample is delayed when it took
// delayedBy more than the p50: on a virtual machine a p99 goal falls with
// that share, which grows with the work's length (performance log, "Where
// the all-hit p99 comes from"), so delayed-% tells a p99 that sits past
// the share's edge from one the code itself reached.
func reportPercentiles(b *testing.B, lat []time.Duration) time.Duration {
	slices.Sort(lat)
	p50 := lat[len(lat)/2]
	b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	on := sort.Search(len(lat), func(i int) bool { return lat[i] > p50+delayedBy })
	b.ReportMetric(100*float64(len(lat)-on)/float64(len(lat)), "delayed-%")
	return p50
}

// delayedBy is what makes a sample delayed in reportPercentiles: more than
// the spread of undisturbed runs of the walks measured here, less than
// what an interruption of this machine's vCPU costs (20–30 µs).
const delayedBy = 10 * time.Microsecond

// The bound's trace: recorded for boundTrace after runs of
// boundMinSamples or more (the benchmark framework's first probing runs,
// of 1 and of about 100, record none).
const (
	boundMinSamples = 200
	boundTrace      = time.Second
)

// steadyWriter applies fresh prefills to stream s, whose view it first
// replaces with one of perStream generated blocks, as a stream goroutine
// under a constant flood of new blocks does.
type steadyWriter struct {
	s      *stream
	ix     *kvindex.Index
	window int
	dec    *kvevent.Decoder
	batch  kvevent.Batch
	msg    *prefillgen.Message
	next   int
}

func newSteadyWriter(tb testing.TB, s *stream, perStream int, shape prefillgen.Options) (w *steadyWriter, replace time.Duration) {
	w = &steadyWriter{s: s, window: perStream / prefillgen.Blocks, dec: kvevent.NewDecoder(8 << 20),
		ix: kvindex.New(kvindex.Config{BlockSize: shape.BlockSize(), HashSeed: 1024, MaxBlocks: perStream})}
	fill := prefillgen.NewWith(tb, prefillgen.Options{BlocksPerEvent: prefillgen.Blocks, VLLM: shape.VLLM})
	for i := range w.window {
		w.decode(tb, fill, i)
		for e := range w.batch.Events {
			if err := w.ix.Apply(&w.batch.Events[e], kvindex.Snapshot); err != nil {
				tb.Fatal(err)
			}
		}
	}
	t0 := time.Now()
	s.publish(w.ix, 2, true, true)
	replace = time.Since(t0)
	shape.Removals = true
	w.msg, w.next = prefillgen.NewWith(tb, shape), w.window
	return w, replace
}

func (w *steadyWriter) decode(tb testing.TB, f *prefillgen.Message, i int) {
	f.Rewrite(i, w.window)
	if err := w.dec.DecodeBatch(f.Payload, &w.batch); err != nil {
		tb.Fatal(err)
	}
}

// step decodes and applies one message of prefillgen.Blocks new blocks.
func (w *steadyWriter) step(tb testing.TB) {
	w.decode(tb, w.msg, w.next)
	w.next++
	for e := 0; e < len(w.batch.Events); {
		n, err := w.s.applyPublished(w.ix, w.batch.Events[e:], kvindex.Delta)
		if e += n; err != nil {
			tb.Fatalf("message %d event %d: %v", w.next, e, err)
		}
	}
	w.s.flushKeys()
}

// queryUnderWrites times "all" queries while one stream applies fresh
// prefills as fast as its core allows: the writer holds the table's lock
// for one chunk of key changes at a time, which a query may wait for.
// writer-blocks/s is the writer's rate meanwhile.
func queryUnderWrites(b *testing.B, r *realDirectory, perStream int) {
	w, _ := newSteadyWriter(b, r.d.set.Load().streams[0], perStream, prefillgen.Options{BlocksPerEvent: prefillgen.Blocks})
	prompts, _ := r.prompts("all")
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			w.step(b)
			n++
		}
	}()
	dst := make([]Match, 0, realStreams)
	hot := make([]uint32, realTokens)
	lat := make([]time.Duration, 0, b.N)
	locked0 := r.d.lockedWalks.Load()
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	for i := range b.N {
		copy(hot, prompts[i%len(prompts)])
		q0 := time.Now()
		dst = r.d.Query(hot, dst[:0])
		lat = append(lat, time.Since(q0))
		if dst[1].DeviceHitTokens != realTokens {
			b.Fatalf("stream 1 hit %d tokens", dst[1].DeviceHitTokens)
		}
	}
	close(stop)
	msgs := <-done
	elapsed := time.Since(t0)
	b.StopTimer()
	// No bound: its trace would be recorded after the writer stopped.
	reportPercentiles(b, lat)
	b.ReportMetric(float64(msgs*prefillgen.Blocks)/elapsed.Seconds(), "writer-blocks/s")
	b.ReportMetric(float64(r.d.lockedWalks.Load()-locked0)/float64(b.N), "locked-walks/op")
}

// BenchmarkDecodeApplyShared measures a stream goroutine's work per live
// message at steady state with the shared key table in the path: decode
// 64 new blocks plus the removal of 64 evicted ones, apply them to the
// stream's published index and write its key changes into the table
// that 127 other streams of the same size fill (one core). The blocks
// come in one of prefillgen.Shapes: one prefill in one event or in 64 of
// one block each (SGLang's shape, stored as one run), or a batch of
// decode steps, 64 chains each a block longer (chains=64, an event at a
// time); or as vLLM sends them (vllm/...: 16-token blocks,
// 32-byte hashes, a removal event a block), into a directory of
// 16-token streams. The stream's view is first replaced by one the
// generator filled, through the calibration swap; replace-ms reports that swap,
// and load the share of the shared table's cells in use after the run.
// blocks/cpu-s counts blocks per CPU second of the benchmark's thread,
// which other work on shared cores does not inflate as it does the wall
// clock.
func BenchmarkDecodeApplyShared(b *testing.B) {
	for _, perStream := range []int{16384, 262144} {
		var r *realDirectory
		for _, sh := range prefillgen.Shapes() {
			b.Run(fmt.Sprintf("index=%d/%s", perStream, sh.Name), func(b *testing.B) {
				if r == nil || r.bs != sh.Options.BlockSize() {
					r = nil // the last directory's memory goes before the next is built
					r = buildRealDirectoryOf(b, perStream, sh.Options.BlockSize())
				}
				w, replace := newSteadyWriter(b, r.d.set.Load().streams[0], perStream, sh.Options)
				b.SetBytes(int64(len(w.msg.Payload)))
				b.ReportAllocs()
				b.ResetTimer()
				cpu := prefillgen.StartCPU()
				for range b.N {
					w.step(b)
				}
				cpu.Report(b, float64(b.N)*prefillgen.Blocks)
				b.ReportMetric(float64(b.N)*prefillgen.Blocks/b.Elapsed().Seconds(), "blocks/s")
				b.ReportMetric(float64(replace.Microseconds())/1e3, "replace-ms")
				b.ReportMetric(r.d.set.Load().tables[0].load(), "load")
				b.StopTimer()
				if dev, _ := w.ix.Counts(); dev != perStream {
					b.Fatalf("index holds %d blocks, want %d", dev, perStream)
				}
				m := r.d.Query(chainTokens(0, nil), nil)
				if m[0].DeviceHitTokens != 0 || m[1].DeviceHitTokens != realTokens {
					b.Fatalf("after the swap: stream 0 hits %d tokens, stream 1 %d", m[0].DeviceHitTokens, m[1].DeviceHitTokens)
				}
			})
		}
	}
}

// BenchmarkMemoryPerReplica reports the memory per resident block-replica
// of 128 streams in one key group: every stream's index plus the shared
// key table, at fill levels that are not powers of two and with each
// conversation held by rf streams (replication factor); limit, when not
// the fill, is max_blocks_per_stream of indexes that are not full, whose
// storage has grown only as far as their fill needed. accounted-B is
// what the structures hold by capacity (Index.StorageBytes and the
// table's pages, cells and free list); heap-B is the live Go heap the
// directory added, measured after a collection; table-B is the shared
// table's part of accounted-B.
func BenchmarkMemoryPerReplica(b *testing.B) {
	for _, fill := range []struct{ perStream, limit int }{{12032, 12032}, {50048, 50048}, {150016, 150016}, {50048, 262144}} {
		perStream := fill.perStream
		name := fmt.Sprintf("blocks=%d", perStream)
		if fill.limit != perStream {
			name += fmt.Sprintf("/limit=%d", fill.limit)
		}
		for _, rf := range []int{1, 2, 8} {
			b.Run(fmt.Sprintf("%s/rf=%d", name, rf), func(b *testing.B) {
				for range b.N {
					var before, after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&before)
					d := buildStreams(b, fill.limit, benchBlockSize, func(i int, add func(uint64)) {
						for c := range perStream / realChain {
							add(privateChain(i/rf, c))
						}
					})
					runtime.GC()
					runtime.ReadMemStats(&after)
					set := d.set.Load()
					var index int64
					replicas := 0
					for _, s := range set.streams {
						index += s.idx.StorageBytes()
						dev, _ := s.idx.Counts()
						replicas += dev
					}
					table := set.tables[0].storageBytes()
					if want := realStreams * perStream / rf; set.tables[0].records() != want {
						b.Fatalf("table holds %d keys, want %d", set.tables[0].records(), want)
					}
					n := float64(replicas)
					b.ReportMetric(float64(index+table)/n, "accounted-B/replica")
					b.ReportMetric(float64(table)/n, "table-B/replica")
					b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/replica")
					runtime.KeepAlive(d)
				}
			})
		}
	}
}
