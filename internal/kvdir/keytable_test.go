package kvdir

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/fuzzsrc"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

const modelBlock = 2

// modelStream is one stream of the randomized model test with the
// engine hashes it has stored, to draw parents and removals from.
//
// A stream with freshHashes names every stored block by a new engine
// hash, so that its index often holds one content key under several
// hashes. The others name a block by its parent's hash and its tokens,
// as engines do, so that the same content always has the same hash and
// no key is held twice (see kvindex.Index on shared keys).
type modelStream struct {
	s           *stream
	hashes      []kvevent.EngineHash
	next        uint64
	freshHashes bool
}

// blockHash names a block stored under parent with tokens: a new hash for
// a stream with freshHashes, else one made of the parent's and the tokens.
func (m *modelStream) blockHash(parent kvevent.EngineHash, tokens []uint32) kvevent.EngineHash {
	if m.freshHashes {
		m.next++
		return kvevent.IntHash(m.next)
	}
	h := (parent.Lo ^ parent.Hi*0x9E3779B97F4A7C15) + 0xA0761D6478BD642F
	for _, t := range tokens {
		h = (h ^ uint64(t) + 1) * 0xE7037ED1A0B428DB
		h ^= h >> 29
	}
	return kvevent.IntHash(h | 1) // never 0, the root's parent
}

// event draws a random event: chained stores over a two-token alphabet
// (so streams share content keys often), tokenless Host copies, removals
// on either tier, now and then a clear.
func (m *modelStream) event(rng *rand.Rand) *kvevent.Event {
	known := func() kvevent.EngineHash { return m.hashes[rng.IntN(len(m.hashes))] }
	medium := kvevent.Medium(rng.IntN(2))
	switch p := rng.IntN(100); {
	case p < 2:
		return &kvevent.Event{Kind: kvevent.AllBlocksCleared}
	case p < 30 && len(m.hashes) > 0:
		hs := make([]kvevent.EngineHash, 1+rng.IntN(3))
		for i := range hs {
			hs[i] = known()
		}
		return &kvevent.Event{Kind: kvevent.BlockRemoved, Medium: medium, BlockHashes: hs}
	case p < 40 && len(m.hashes) > 0:
		return &kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Host, BlockHashes: []kvevent.EngineHash{known()}, PlainText: true}
	}
	var parent kvevent.EngineHash
	hasParent := len(m.hashes) > 0 && rng.IntN(4) != 0
	if hasParent {
		parent = known()
	}
	return m.stored(rng, 1+rng.IntN(4), medium, parent, hasParent)
}

// continuing returns a stored event of one block that continues prev's
// chain on its tier, as SGLang sends a prefill an event a page, or nil if
// prev is no stored event with tokens.
func (m *modelStream) continuing(rng *rand.Rand, prev *kvevent.Event) *kvevent.Event {
	if prev.Kind != kvevent.BlockStored || len(prev.TokenIDs) == 0 {
		return nil
	}
	return m.stored(rng, 1, prev.Medium, prev.BlockHashes[len(prev.BlockHashes)-1], true)
}

// stored returns a stored event of n blocks of random tokens.
func (m *modelStream) stored(rng *rand.Rand, n int, medium kvevent.Medium, parent kvevent.EngineHash, hasParent bool) *kvevent.Event {
	ev := &kvevent.Event{Kind: kvevent.BlockStored, Medium: medium, BlockSize: modelBlock, PlainText: true,
		BlockHashes: make([]kvevent.EngineHash, n), TokenIDs: make([]uint32, n*modelBlock)}
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = uint32(rng.IntN(2))
	}
	ev.HasParent, ev.ParentHash = hasParent, parent
	for i := range ev.BlockHashes {
		parent = m.blockHash(parent, ev.TokenIDs[i*modelBlock:(i+1)*modelBlock])
		ev.BlockHashes[i] = parent
		m.hashes = append(m.hashes, parent)
	}
	return ev
}

// snapshotIndex builds a fresh index from random events, as a snapshot
// or a history replay does before it is published.
func (m *modelStream) snapshotIndex(rng *rand.Rand) *kvindex.Index {
	ix := kvindex.New(kvindex.Config{BlockSize: modelBlock, HashSeed: 1024, MaxBlocks: 64})
	m.hashes = m.hashes[:0]
	for range rng.IntN(12) {
		ev := m.event(rng)
		_ = ix.Apply(ev, kvindex.Snapshot) // capacity errors leave a usable index
	}
	return ix
}

func modelDirectory(t *testing.T, n int) (*Directory, []*modelStream) {
	t.Helper()
	tab := newKeyTable(modelBlock, 1024)
	ms := make([]*modelStream, n)
	streams := make([]*stream, n)
	for i := range ms {
		s := newStream(StreamSpec{InstanceName: fmt.Sprintf("10.0.0.%d:8000", i), BlockSize: modelBlock, HashSeed: 1024})
		s.attach(tab)
		ms[i] = &modelStream{s: s, next: uint64(i) << 32, freshHashes: i%2 == 1}
		streams[i] = s
	}
	return viewOf(streams), ms
}

// referenceMatch is the answer the per-stream walk gave before the
// shared table: the stream's own index matched under its lock, through a
// KeyLookup built for it, zero for an unsynchronised stream (R-REC-1).
func referenceMatch(s *stream, keys []kvindex.Key) (dev, hostOnly int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.synced || s.idx == nil {
		return 0, 0
	}
	var l kvindex.KeyLookup
	l.Build(s.idx)
	m := l.Match(keys)
	return m.DeviceBlocks, m.HostOnlyBlocks
}

// TestSharedTableAgainstPerStreamMatch drives many streams (more than 64,
// so the slot bitsets span words) through random live events, faults,
// invalidations, snapshot publications (fresh and calibration), clears
// and slot reuse, and checks after every step that Directory.Query gives
// every stream exactly what its own index matches, and nothing for an
// unsynchronised stream (R-IDX-3, R-REC-1, R-REC-2, R-DIR-4). A stream
// whose index holds a content key under several engine hashes
// (freshHashes) may get less, never more (R-DIR-1).
func TestSharedTableAgainstPerStreamMatch(t *testing.T) {
	hitSlots := map[int]bool{}
	for seed := uint64(1); seed <= 4; seed++ {
		seen := map[string]int{}
		tab := sharedTableSteps(t, rand.New(rand.NewPCG(seed, 0x73686172)), 70, 6000, fmt.Sprintf("seed %d", seed), seen, hitSlots)
		for _, c := range []string{"invalidate", "calibration", "fresh publish", "slot reuse", "fault", "hit", "host-only hit", "additions pending", "run of events",
			"chain in one run", "under-report of a shared key",
			kvevent.BlockStored.String(), kvevent.BlockRemoved.String(), kvevent.AllBlocksCleared.String()} {
			if seen[c] == 0 {
				t.Errorf("seed %d: random steps never produced %q", seed, c)
			}
		}
		if tab.pool.used == 0 {
			t.Errorf("seed %d: no key was ever held by more than two streams (no dense entry)", seed)
		}
	}
	if len(hitSlots) != 70 {
		t.Errorf("only %d of 70 slots ever had a hit", len(hitSlots))
	}
}

// FuzzSharedTableAgainstPerStreamMatch is TestSharedTableAgainstPerStreamMatch
// with the steps' random choices read from the fuzzer's bytes (fuzzsrc.Source),
// over 1 to 70 streams.
func FuzzSharedTableAgainstPerStreamMatch(f *testing.F) {
	f.Add(uint8(69), []byte{})
	f.Add(uint8(2), []byte("publish, store, remove, calibrate, retire"))
	f.Fuzz(func(t *testing.T, streams uint8, choices []byte) {
		sharedTableSteps(t, rand.New(fuzzsrc.New(choices)), 1+int(streams)%70, fuzzsrc.Steps(choices, 20, 8, 200), "fuzzed", map[string]int{}, map[int]bool{})
	})
}

// sharedTableSteps runs steps random steps of
// TestSharedTableAgainstPerStreamMatch on a directory of as many model
// streams as streams says, checking every query against each stream's own
// index, then withdraws every view and checks that the table holds
// nothing. What the steps reached is added to seen, the slots that had a
// hit to hitSlots. It returns the table.
func sharedTableSteps(t *testing.T, rng *rand.Rand, streams, steps int, name string, seen map[string]int, hitSlots map[int]bool) *keyTable {
	t.Helper()
	d, ms := modelDirectory(t, streams)
	tab := ms[0].s.keys
	var dst []Match
	var hits []Hit
	var layout *Layout
	for step := range steps {
		m := ms[rng.IntN(len(ms))]
		s := m.s
		switch p := rng.IntN(100); {
		case p < 3:
			s.invalidate("fault")
			seen["invalidate"]++
		case p < 8:
			ix := m.snapshotIndex(rng)
			if s.idx != nil {
				seen["calibration"]++
			} else {
				seen["fresh publish"]++
			}
			s.publish(ix, uint64(step), true, true)
		case p < 9:
			// The stream is retired and a new one takes its slot.
			s.invalidate("stream removed")
			tab.freeSlot(s.slot)
			ns := newStream(s.spec)
			ns.attach(tab)
			if ns.slot != s.slot {
				t.Fatalf("freed slot %d not reused (got %d)", s.slot, ns.slot)
			}
			d.set.Load().streams[streamIndex(ms, m)] = ns
			m.s, m.hashes = ns, nil
			seen["slot reuse"]++
		default:
			// A batch of one to three events, as the syncer applies
			// it: additions may reach the table only at its end, but
			// no query in between may find more than the stream's
			// own index holds (R-DIR-1). Half the batches go in one
			// run under one lock hold, the others an event a run,
			// with a query after each.
			// A third of the events continue the chain of the one
			// before, which the index stores as one run.
			evs := make([]kvevent.Event, 1+rng.IntN(3))
			for e := range evs {
				if e > 0 && rng.IntN(3) == 0 {
					if ev := m.continuing(rng, &evs[e-1]); ev != nil {
						evs[e] = *ev
						seen["chained event"]++
						continue
					}
				}
				evs[e] = *m.event(rng)
			}
			run := len(evs)
			if rng.IntN(2) == 0 {
				run = 1
			}
			for e := 0; e < len(evs) && s.idx != nil; e += run {
				part := evs[e:min(e+run, len(evs))]
				n, err := s.applyPublished(s.idx, part, kvindex.Delta)
				for _, ev := range part[:n] {
					seen[ev.Kind.String()]++
				}
				if err != nil {
					if n >= len(part) {
						t.Fatalf("%s step %d: %d of %d events applied with error %v", name, step, n, len(part), err)
					}
					// The syncer withdraws a view an event could not
					// be applied to (R-REC-3).
					s.flushKeys()
					s.invalidate(err.Error())
					seen["fault"]++
					break
				}
				if n != len(part) {
					t.Fatalf("%s step %d: %d of %d events applied", name, step, n, len(part))
				}
				if len(part) > 1 {
					seen["run of events"]++
				}
				for i := 1; i < len(part); i++ {
					if prev := &part[i-1]; part[i].Kind == kvevent.BlockStored && prev.Kind == kvevent.BlockStored && len(prev.TokenIDs) > 0 &&
						part[i].HasParent && part[i].ParentHash == prev.BlockHashes[len(prev.BlockHashes)-1] {
						seen["chain in one run"]++
					}
				}
				if e+run < len(evs) {
					if len(s.pending) > 0 {
						seen["additions pending"]++
					}
					tokens := randomPrompt(rng, ms)
					keys := kvindex.KeysFor(tokens, modelBlock, 1024, nil)
					dst = d.Query(tokens, dst[:0])
					for i, mm := range ms {
						wd, wh := referenceMatch(mm.s, keys)
						if got := dst[i]; got.DeviceHitTokens > wd*modelBlock || got.DeviceHitTokens+got.HostOnlyHitTokens > (wd+wh)*modelBlock {
							t.Fatalf("%s step %d stream %d, inside a batch: query %d/%d tokens, own index %d/%d blocks",
								name, step, i, got.DeviceHitTokens, got.HostOnlyHitTokens, wd, wh)
						}
					}
				}
			}
			s.flushKeys()
		}
		for q := 0; q < 2; q++ {
			tokens := randomPrompt(rng, ms)
			keys := kvindex.KeysFor(tokens, modelBlock, 1024, nil)
			dst = d.Query(tokens, dst[:0])
			layout, hits = d.Hits(tokens, hits[:0])
			if len(hits) != len(ms) || len(layout.Streams) != len(ms) {
				t.Fatalf("%s step %d: %d hits over %d streams, want %d", name, step, len(hits), len(layout.Streams), len(ms))
			}
			for i, mm := range ms {
				wd, wh := referenceMatch(mm.s, keys)
				got := dst[i]
				// The router's answer is the query's, read from the
				// walk alone: the same hits, and only for a stream
				// with a view.
				h := hits[i]
				if si := layout.Streams[i]; si.InstanceName != got.InstanceName || si.DPRank != got.DPRank {
					t.Fatalf("%s step %d: layout stream %d is %s/%d, query %s/%d", name, step, i, si.InstanceName, si.DPRank, got.InstanceName, got.DPRank)
				}
				if h.OK != (len(tokens) >= modelBlock && got.Synchronized) || h.DeviceTokens != got.DeviceHitTokens || h.HostOnlyTokens != got.HostOnlyHitTokens {
					t.Fatalf("%s step %d stream %d: hits %+v, query %+v", name, step, i, h, got)
				}
				exact := got.DeviceHitTokens == wd*modelBlock && got.HostOnlyHitTokens == wh*modelBlock
				if !exact && (!mm.freshHashes || got.DeviceHitTokens > wd*modelBlock || got.DeviceHitTokens+got.HostOnlyHitTokens > (wd+wh)*modelBlock) {
					t.Fatalf("%s step %d stream %d (slot %d, synced %v, fresh hashes %v): query %d/%d tokens, own index %d/%d blocks",
						name, step, i, mm.s.slot, got.Synchronized, mm.freshHashes, got.DeviceHitTokens, got.HostOnlyHitTokens, wd, wh)
				}
				if !exact {
					seen["under-report of a shared key"]++
				}
				if want := wantStatus(mm.s); got.Synchronized != want.Synchronized || got.Sequence != want.Sequence ||
					got.Error != want.Error || got.DeviceBlocks != want.DeviceBlocks || got.HostBlocks != want.HostBlocks {
					t.Fatalf("%s step %d stream %d: query status %+v, under the lock %+v", name, step, i, got, want)
				}
				if wd+wh > 0 {
					seen["hit"]++
					hitSlots[mm.s.slot] = true
				}
				if wh > 0 {
					seen["host-only hit"]++
				}
			}
		}
	}
	// Every view withdrawn, the table holds nothing: no stream left
	// bits behind.
	for _, m := range ms {
		m.s.invalidate("end")
	}
	if n := tab.records(); n != 0 {
		t.Errorf("%s: %d records left after every view was withdrawn", name, n)
	}
	return tab
}

// wantStatus is the stream's status read under its lock, which the query
// reads from the lock-free copy (queryView).
func wantStatus(s *stream) Match {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m := Match{Synchronized: s.synced, Sequence: s.seq, Error: s.reason}
	if s.synced && s.idx != nil {
		m.DeviceBlocks, m.HostBlocks = s.idx.Counts()
	}
	return m
}

func streamIndex(ms []*modelStream, m *modelStream) int {
	for i := range ms {
		if ms[i] == m {
			return i
		}
	}
	panic("stream not found")
}

// randomPrompt is random tokens over the model's alphabet: with two
// tokens and two-token blocks, prompts often run along stored chains.
func randomPrompt(rng *rand.Rand, _ []*modelStream) []uint32 {
	tokens := make([]uint32, rng.IntN(8*modelBlock+2))
	for i := range tokens {
		tokens[i] = uint32(rng.IntN(2))
	}
	return tokens
}

// chainIndex returns an index holding the given blocks of prompt, each
// chained to the one before it (a block may be absent: its children are
// still stored, under a parent hash the index knows as a ghost).
func chainIndex(t testing.TB, prompt []uint32, hold []bool) *kvindex.Index {
	n := len(prompt) / modelBlock
	ix := kvindex.New(kvindex.Config{BlockSize: modelBlock, HashSeed: 1024, MaxBlocks: max(64, n)})
	for i := range n {
		ev := &kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Device, BlockSize: modelBlock, PlainText: true,
			BlockHashes: []kvevent.EngineHash{kvevent.IntHash(uint64(i + 1))}, TokenIDs: prompt[i*modelBlock : (i+1)*modelBlock]}
		if i > 0 {
			ev.HasParent, ev.ParentHash = true, kvevent.IntHash(uint64(i))
		}
		if err := ix.Apply(ev, kvindex.Delta); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if !hold[i] {
			ev := &kvevent.Event{Kind: kvevent.BlockRemoved, Medium: kvevent.Device, BlockHashes: []kvevent.EngineHash{kvevent.IntHash(uint64(i + 1))}}
			if err := ix.Apply(ev, kvindex.Delta); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ix
}

// TestSharedTableNoMixedViews runs queries while writers publish views
// over and over (calibrations that replace a served view, invalidations
// followed by fresh publications): view A holds blocks 1-2 of an 8-block
// prompt, view B blocks 1 and 3-8. Each matches at most 2 blocks, but a
// query seeing A's block 2 with B's blocks 3-8 would report 8, so any
// answer above 2 is a mix of views (R-REC-2). An unsynchronised answer
// must report nothing (R-REC-1). Run it under -race.
func TestSharedTableNoMixedViews(t *testing.T) {
	const streams = 8
	prompt := make([]uint32, 8*modelBlock)
	for i := range prompt {
		prompt[i] = uint32(i*7 + 3)
	}
	holdA := []bool{true, true, false, false, false, false, false, false}
	holdB := []bool{true, false, true, true, true, true, true, true}
	d, ms := modelDirectory(t, streams)
	publications, stopChurn := churnViews(t, ms, prompt, holdA, holdB, 5)
	var dst []Match
	deadline := time.Now().Add(time.Second)
	queries, hits := 0, 0
	for time.Now().Before(deadline) || publications.Load() < 200 {
		dst = d.Query(prompt, dst[:0])
		queries++
		for i, m := range dst {
			if m.ReusablePrefixTokens > 2*modelBlock {
				t.Fatalf("stream %d reported %d tokens: a mix of two views", i, m.ReusablePrefixTokens)
			}
			if !m.Synchronized && m.ReusablePrefixTokens != 0 {
				t.Fatalf("unsynchronised stream %d reported %d tokens", i, m.ReusablePrefixTokens)
			}
			if m.ReusablePrefixTokens > 0 {
				hits++
			}
		}
	}
	stopChurn()
	if hits == 0 {
		t.Fatalf("%d queries over %d publications never saw a hit", queries, publications.Load())
	}
	t.Logf("%d queries, %d publications, %d stream hits", queries, publications.Load(), hits)
}

// TestKeyTableBound fills a shared table to the most records its streams
// can make it hold (every slot with bits on twice max_blocks_per_stream
// distinct keys, as during a calibration swap), slots added one by one
// so that the bitsets widen on the way, and checks that what it holds
// stays within KeyTableBound, which MemoryBound.Process adds (R-CFG-2).
func TestKeyTableBound(t *testing.T) {
	for _, tc := range []struct {
		streams, maxBlocks int
		shared             bool // every stream holds the same keys: dense entries
	}{{1, 5000, false}, {3, 4099, false}, {70, 300, false}, {70, 300, true}, {130, 100, true}} {
		tab := newKeyTable(modelBlock, 1024)
		peak := int64(0)
		for i := range tc.streams {
			rng := rand.New(rand.NewPCG(uint64(tc.streams), uint64(i)))
			if tc.shared {
				rng = rand.New(rand.NewPCG(1, 1))
			}
			slot := tab.allocSlot()
			for range 2 * tc.maxBlocks {
				tab.set(slot, kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}, true, rng.IntN(2) == 0)
			}
			peak = max(peak, tab.storageBytes())
		}
		want := 2 * tc.streams * tc.maxBlocks
		if tc.shared {
			want = 2 * tc.maxBlocks
		}
		if tab.records() != want {
			t.Fatalf("%+v: %d records, want %d", tc, tab.records(), want)
		}
		if bound := KeyTableBound(tc.streams, tc.maxBlocks); peak > bound {
			t.Errorf("%+v: table holds %d bytes, bound %d", tc, peak, bound)
		} else {
			t.Logf("%+v: %d bytes of a bound of %d", tc, peak, bound)
		}
	}
	lim := Limits{MaxBlocksPerStream: 1000, MaxMessageBytes: 1 << 20, MaxBufferedBytes: 4 << 20}
	b := lim.MemoryBound()
	if got, want := b.Process(128)-128*(2*b.Heap()+b.Queued), 2*KeyTableBound(128, 1000)+2*(kvtransport.PoolBytes+batchPoolBytes); got != want {
		t.Errorf("Process(128) adds %d bytes for the key tables and the pools, want %d", got, want)
	}
}

// steadyStream returns a directory of streams streams in one key table,
// the first of which has published the 8-block prompt it returns.
func steadyStream(t *testing.T, streams int) (*Directory, *keyTable, []uint32) {
	t.Helper()
	prompt := make([]uint32, 8*modelBlock)
	for i := range prompt {
		prompt[i] = uint32(i + 1000)
	}
	all := []bool{true, true, true, true, true, true, true, true}
	d, ms := modelDirectory(t, streams)
	ms[0].s.publish(chainIndex(t, prompt, all), 1, true, true)
	return d, ms[0].s.keys, prompt
}

// randomStream attaches a new stream to tab and publishes a view of
// blocks random blocks on either tier.
func randomStream(tab *keyTable, rng *rand.Rand, name string, blocks int) (*stream, error) {
	s := newStream(StreamSpec{InstanceName: name, BlockSize: modelBlock, HashSeed: 1024})
	s.attach(tab)
	ix := kvindex.New(kvindex.Config{BlockSize: modelBlock, HashSeed: 1024, MaxBlocks: 4096})
	for c := range blocks {
		ev := &kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Medium(c % 2), BlockSize: modelBlock, PlainText: true,
			BlockHashes: []kvevent.EngineHash{kvevent.IntHash(uint64(c))}, TokenIDs: []uint32{rng.Uint32(), rng.Uint32()}}
		if err := ix.Apply(ev, kvindex.Delta); err != nil {
			return nil, err
		}
	}
	s.publish(ix, 1, true, true)
	return s, nil
}

// TestSharedTableGrowsUnderQueries queries a stream whose view never
// changes while other streams publish views of thousands of new keys and
// new streams join, so that the table's cells are rebuilt and its
// bitsets widen (past 64 slots) under the queries. The unchanged stream
// must keep its exact answer throughout (R-DIR-4: growth is invisible to
// queries), whether the cells are rebuilt at once or, as large ones are,
// a step per write (migration). Run it under -race.
func TestSharedTableGrowsUnderQueries(t *testing.T) {
	for _, from := range []int{migrateFrom, minCells} {
		t.Run(fmt.Sprintf("migrate_from=%d", from), func(t *testing.T) { growUnderQueries(t, from) })
	}
}

func growUnderQueries(t *testing.T, from int) {
	d, tab, prompt := steadyStream(t, 4)
	tab.migrateFrom = from
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	migrating := 0 // fills after which a migration was under way
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(3, 4))
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := randomStream(tab, rng, fmt.Sprintf("extra-%d", n), 200); err != nil {
				t.Error(err)
				return
			}
			tab.wmu.Lock()
			if tab.mig != nil {
				migrating++
			}
			tab.wmu.Unlock()
			if n >= 150 {
				return // 150 streams of 200 keys: past 64 and 128 slots, cells rebuilt several times
			}
		}
	}()
	var dst []Match
	queries := 0
	for done := false; !done; queries++ {
		dst = d.Query(prompt, dst[:0])
		if got := dst[0].DeviceHitTokens; got != 8*modelBlock {
			close(stop)
			wg.Wait()
			t.Fatalf("query %d: the unchanged stream hit %d tokens, want %d", queries, got, 8*modelBlock)
		}
		if tab.slots() > 150 {
			done = true
		}
	}
	close(stop)
	wg.Wait()
	tab.mu.RLock()
	words, cells := tab.words, len(tab.cells)
	tab.mu.RUnlock()
	if words < 3 || cells < 32768 || (from < migrateFrom) != (migrating > 0) {
		t.Fatalf("the table did not grow as meant: %d words, %d cells, a migration under way after %d fills", words, cells, migrating)
	}
	t.Logf("%d queries while the table grew to %d words and %d cells, a migration under way after %d fills", queries, words, cells, migrating)
}

// TestSharedTableCompactsUnderQueries queries a stream whose view never
// changes while, again and again, 40 other streams publish views of
// thousands of keys and then withdraw them and leave, so that the cells
// grow and are compacted under the queries. The unchanged stream must
// keep its exact answer throughout (R-DIR-4), and the table must end no
// larger than the views left need. Run it under -race.
func TestSharedTableCompactsUnderQueries(t *testing.T) {
	d, tab, prompt := steadyStream(t, 1)
	const rounds = 3
	peak := make(chan int, rounds)
	errc := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(9, 10))
		for range rounds {
			var extra []*stream
			for n := range 40 {
				s, err := randomStream(tab, rng, fmt.Sprintf("extra-%d", n), 1000)
				if err != nil {
					errc <- err
					return
				}
				extra = append(extra, s)
			}
			tab.mu.RLock()
			peak <- len(tab.cells)
			tab.mu.RUnlock()
			for _, s := range extra {
				s.invalidate("gone")
				tab.freeSlot(s.slot)
			}
		}
		close(peak)
		errc <- nil
	}()
	var dst []Match
	queries := 0
	for done := false; !done; queries++ {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
		dst = d.Query(prompt, dst[:0])
		if got := dst[0].DeviceHitTokens; got != 8*modelBlock {
			t.Fatalf("query %d: the unchanged stream hit %d tokens, want %d", queries, got, 8*modelBlock)
		}
	}
	var peaks []int
	for p := range peak {
		peaks = append(peaks, p)
	}
	tab.mu.RLock()
	cells, live := len(tab.cells), tab.live
	tab.mu.RUnlock()
	if len(peaks) != rounds || slices.Min(peaks) < 40000 || cells != minCells || live != 8 {
		t.Fatalf("the table did not grow and shrink as meant: %d cells at the peaks %v, %d cells for %d keys at the end", cells, peaks, cells, live)
	}
	t.Logf("%d queries while the table grew to %v cells and shrank to %d", queries, peaks, cells)
}

// slotTiers reads slot's tiers from cell i.
func (t *keyTable) slotTiers(i int, slot int) (dev, host bool) {
	h := t.cells[i].holders()
	if h&holdDense != 0 {
		d := t.dense(h &^ holdDense)
		w, b := slot>>6, uint64(1)<<(slot&63)
		return d[w]&b != 0, d[t.words+w]&b != 0
	}
	for _, e := range entries(h) {
		if e != 0 && int(e&slotMask) == slot {
			return e>>tierShift&tierDev != 0, e>>tierShift&tierHost != 0
		}
	}
	return false, false
}

// TestKeyTableCellsUnderChurn adds and drops keys of three slots at
// random, the table's live keys staying near a constant number, as an
// engine at steady state does: a dropped key's cell is emptied and later
// cells of its probe run move back. After every chunk each held key must
// be found with its tiers, each dropped one not at all (no stale hit,
// R-REC-1), every live record must have exactly one cell, no empty cell
// may lie between a key's home and its cell, and the cells must stay
// within their load and size bounds.
func TestKeyTableCellsUnderChurn(t *testing.T) {
	tab := newKeyTable(modelBlock, 1024)
	slots := []int{tab.allocSlot(), tab.allocSlot(), tab.allocSlot()}
	model := keyModel{}
	var keys []kvindex.Key // every key ever used, held or dropped
	rng := rand.New(rand.NewPCG(5, 6))
	const target = 3000
	var changes []keyChange
	peak := 0 // live keys at most, which size the cells
	for round := range 4000 {
		slot := slots[rng.IntN(len(slots))]
		changes = changes[:0]
		for range keyChunk {
			var k kvindex.Key
			switch live := len(model); {
			case len(keys) == 0 || (live < target && rng.IntN(3) > 0):
				k = kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
				keys = append(keys, k)
			default:
				k = keys[rng.IntN(len(keys))]
			}
			dev, host := rng.IntN(2) == 0, rng.IntN(2) == 0
			if len(model) >= target && rng.IntN(2) == 0 {
				dev, host = false, false
			}
			changes = append(changes, keyChange{k, dev, host})
			model.set(slot, changes[len(changes)-1])
		}
		tab.apply(slot, changes)
		peak = max(peak, len(model))
		if round%50 != 0 && round != 3999 {
			continue
		}
		checkKeyTable(t, tab, keys, slots, model, fmt.Sprintf("round %d", round))
		if maxLoadDen*tab.live > maxLoadNum*len(tab.cells) || len(tab.cells) > max(minCells, (peak+keyChunk)*rebuildLoadDen/rebuildLoadNum+1) {
			t.Fatalf("round %d: %d cells for %d live keys", round, len(tab.cells), tab.live)
		}
	}
	t.Logf("%d keys used, %d live, %d cells", len(keys), tab.live, len(tab.cells))
}

// TestKeyTableCompactsWhenSparse fills a table from 70 slots (bitsets
// of two words) with keys held by one slot, by two and by many (dense
// entries), then drops nearly all of it: the cells and the dense pages
// must shrink with what is left, every remaining key keep its tiers on
// every slot and no dropped key be found (R-REC-1); an entry left with
// two holders goes back inline. The table then grows again.
func TestKeyTableCompactsWhenSparse(t *testing.T) {
	tab := newKeyTable(modelBlock, 1024)
	slots := make([]int, 70)
	for i := range slots {
		slots[i] = tab.allocSlot()
	}
	rng := rand.New(rand.NewPCG(7, 8))
	model := keyModel{}
	var keys []kvindex.Key
	perSlot := map[int][]keyChange{}
	hold := func(k kvindex.Key, slot int) {
		c := keyChange{k, rng.IntN(3) != 0, rng.IntN(2) == 0}
		if !c.dev && !c.host {
			c.dev = true
		}
		model.set(slot, c)
		perSlot[slot] = append(perSlot[slot], c)
	}
	newKey := func() kvindex.Key {
		k := kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
		keys = append(keys, k)
		return k
	}
	for range 30000 {
		hold(newKey(), slots[0])
	}
	for range 5000 {
		k := newKey()
		hold(k, slots[1])
		hold(k, slots[2])
	}
	for range 20000 {
		k := newKey()
		for _, i := range rng.Perm(len(slots))[:3+rng.IntN(8)] {
			hold(k, slots[i])
		}
	}
	write := func() {
		for _, slot := range slots {
			for c := perSlot[slot]; len(c) > 0; c = c[min(keyBatch, len(c)):] {
				tab.apply(slot, c[:min(keyBatch, len(c))])
				if tab.sparse() {
					t.Fatalf("sparse after an apply: %d cells for %d live keys, %d pages", len(tab.cells), tab.live, len(tab.pool.pages))
				}
			}
			perSlot[slot] = perSlot[slot][:0]
		}
	}
	write()
	checkKeyTable(t, tab, keys, slots, model, "filled")
	peakCells, peakPages, peakBytes := len(tab.cells), len(tab.pool.pages), tab.storageBytes()

	// Every slot but the first three leaves, and the first drops all
	// but a twentieth of its keys.
	for _, k := range keys {
		for slot := range model[k] {
			if slot >= slots[3] || slot == slots[0] && rng.IntN(20) != 0 {
				delete(model[k], slot)
				perSlot[slot] = append(perSlot[slot], keyChange{k: k})
			}
		}
		if len(model[k]) == 0 {
			delete(model, k)
		}
	}
	write()
	checkKeyTable(t, tab, keys, slots, model, "after the drop")
	dense := 0
	for _, m := range model {
		if len(m) > 2 {
			dense++
		}
	}
	cells, pages, bytes := len(tab.cells), len(tab.pool.pages), tab.storageBytes()
	if cells >= peakCells || cells > max(minCells, shrinkDen*len(model)/shrinkNum) || pages >= peakPages || bytes >= peakBytes/3 {
		t.Fatalf("after the drop: %d cells (peak %d), %d pages (peak %d), %d bytes (peak %d) for %d keys",
			cells, peakCells, pages, peakPages, bytes, peakBytes, len(model))
	}
	// A compaction now leaves dense entries only to keys of three or
	// more holders.
	tab.compact()
	checkKeyTable(t, tab, keys, slots, model, "compacted")
	if got := denseRecords(tab); got != dense || len(tab.pool.pages) != (dense+pageRecords-1)/pageRecords {
		t.Fatalf("compacted: %d dense entries in %d pages, want %d", got, len(tab.pool.pages), dense)
	}
	t.Logf("%d cells, %d pages, %d bytes at the peak; %d, %d, %d for %d keys after the drop",
		peakCells, peakPages, peakBytes, cells, pages, bytes, len(model))

	// The table grows again from its compacted state.
	for range 20000 {
		k := newKey()
		hold(k, slots[rng.IntN(len(slots))])
		hold(k, slots[69])
	}
	write()
	checkKeyTable(t, tab, keys, slots, model, "grown again")
}

// denseRecords counts the keys of tab whose holders are a dense entry.
func denseRecords(tab *keyTable) int {
	n := 0
	for i := range tab.cells {
		if c := &tab.cells[i]; c.used() && c.holders()&holdDense != 0 {
			n++
		}
	}
	return n
}

// held is one slot's tiers of a key in the key table tests' model.
type held struct{ dev, host bool }

// keyModel is the key table tests' model: the slots' tiers of each key
// some slot holds.
type keyModel map[kvindex.Key]map[int]held

// set records c for slot.
func (m keyModel) set(slot int, c keyChange) {
	if m[c.k] == nil {
		m[c.k] = map[int]held{}
	}
	if c.dev || c.host {
		m[c.k][slot] = held{c.dev, c.host}
	} else {
		delete(m[c.k], slot)
	}
	if len(m[c.k]) == 0 {
		delete(m, c.k)
	}
}

// checkKeyTable checks tab against model, the slots' tiers of each key
// of keys that some slot holds: each held key must be found with its
// tiers, each dropped one not at all (no stale hit, R-REC-1), every live
// record must have exactly one cell, and no empty cell may lie between
// a key's home and its cell.
func checkKeyTable(t *testing.T, tab *keyTable, keys []kvindex.Key, slots []int, model keyModel, when string) {
	t.Helper()
	for _, k := range keys {
		r, ok := tab.lookup(k)
		want := model[k]
		if ok != (want != nil) {
			t.Fatalf("%s: key %x found %v, held by %d slots", when, k, ok, len(want))
		}
		for _, s := range slots {
			dev, host := false, false
			if ok {
				dev, host = tab.slotTiers(r, s)
			}
			if h := want[s]; dev != h.dev || host != h.host {
				t.Fatalf("%s: key %x slot %d has %v/%v, want %v/%v", when, k, s, dev, host, h.dev, h.host)
			}
		}
	}
	inUse, keysOf := 0, map[[2]uint64]int{}
	n := len(tab.cells)
	for i := range tab.cells {
		c := &tab.cells[i]
		if !c.used() {
			continue
		}
		inUse++
		keysOf[[2]uint64{c.hi, uint64(c.tag())}]++
		// Every cell from the key's home to its own is in use, or
		// lookups stop short of it.
		for h := homeOfTag(c.tag(), n); h != i; h = (h + 1) % n {
			if !tab.cells[h].used() {
				t.Fatalf("%s: an empty cell %d lies between cell %d and its home", when, h, i)
			}
		}
	}
	if inUse != tab.live || tab.live != len(model) {
		t.Fatalf("%s: %d cells in use, %d live, %d held", when, inUse, tab.live, len(model))
	}
	for k, n := range keysOf {
		if n != 1 {
			t.Fatalf("%s: key %x has %d cells", when, k, n)
		}
	}
}

// TestKeyTableRemoveAcrossTheEnd drops keys from probe runs that wrap
// from the last cell to the first, in every order: each drop must leave
// every other key findable and no dropped key found (R-REC-1).
func TestKeyTableRemoveAcrossTheEnd(t *testing.T) {
	// Homes, in a table of minCells cells: three keys at the last cell,
	// two at the first, one at the second; their run covers the last
	// cell and the first five.
	homes := []int{minCells - 1, minCells - 1, 0, minCells - 1, 1, 0}
	keys := make([]kvindex.Key, len(homes))
	for i, h := range homes {
		// The smallest tag whose home is h, plus i so that tags differ.
		tag := (uint64(h)<<32+minCells-1)/minCells + uint64(i)
		keys[i] = kvindex.Key{Hi: uint64(i + 1), Lo: tag << 32}
		if got := homeOf(keys[i], minCells); got != h {
			t.Fatalf("key %d: home %d, want %d", i, got, h)
		}
	}
	orders := [][]int{{0, 1, 2, 3, 4, 5}, {5, 4, 3, 2, 1, 0}, {1, 3, 0, 5, 2, 4}, {2, 0, 4, 1, 5, 3}, {3, 5, 1, 4, 0, 2}}
	for _, order := range orders {
		tab := newKeyTable(modelBlock, 1024)
		slot := tab.allocSlot()
		var add []keyChange
		for _, k := range keys {
			add = append(add, keyChange{k: k, dev: true})
		}
		tab.apply(slot, add)
		if len(tab.cells) != minCells || !tab.cells[minCells-1].used() || !tab.cells[4].used() {
			t.Fatalf("the keys do not fill the run meant: %d cells", len(tab.cells))
		}
		dropped := map[int]bool{}
		for _, i := range order {
			tab.apply(slot, []keyChange{{k: keys[i]}})
			dropped[i] = true
			for j, k := range keys {
				if _, ok := tab.lookup(k); ok == dropped[j] {
					t.Fatalf("order %v: after dropping key %d, key %d found %v", order, i, j, ok)
				}
			}
		}
		if tab.live != 0 || slices.ContainsFunc(tab.cells, func(c cell) bool { return c.used() }) {
			t.Fatalf("order %v: %d live keys, cells not all empty", order, tab.live)
		}
	}
}

// TestWalkStopsAtEveryBatchEdge: the walk hashes and loads a prompt's
// blocks in batches that grow from one block to walkBatch; a stream's
// prefix ending just before, at or just after the edge between two
// batches, or inside one, gets exactly what its own index matches, for
// prompts that end at those edges too (R-IDX-3).
func TestWalkStopsAtEveryBatchEdge(t *testing.T) {
	const blocks = 3*walkBatch + 20
	var edges []int
	for i, b := 0, 1; i < blocks; b = min(b*walkGrowth, walkBatch) {
		i += b
		edges = append(edges, i)
	}
	if len(edges) < 5 {
		t.Fatalf("batch edges %v: the prompt spans too few batches", edges)
	}
	lengths := []int{0, blocks - 1, blocks}
	for _, e := range edges {
		lengths = append(lengths, e-1, e, e+1, e+walkGrowth/2)
	}
	prompt := make([]uint32, blocks*modelBlock+1)
	for i := range prompt {
		prompt[i] = uint32(i*7 + 3)
	}
	d, ms := modelDirectory(t, 2*len(lengths))
	want := make([]int, len(ms))
	for i, m := range ms {
		// The second half holds the same prefixes, each with one block
		// missing beyond it, so that the walk's stop does not depend on
		// the prompt's later blocks being absent.
		l := min(lengths[i%len(lengths)], blocks)
		hold := make([]bool, blocks)
		for j := range hold {
			hold[j] = j < l || (i >= len(lengths) && j > l)
		}
		want[i] = l
		m.s.publish(chainIndex(t, prompt, hold), 1, true, true)
	}
	var dst []Match
	for _, qb := range append([]int{blocks}, edges[:len(edges)-1]...) {
		q := prompt[:qb*modelBlock+1]
		keys := kvindex.KeysFor(q, modelBlock, 1024, nil)
		dst = d.Query(q, dst[:0])
		for i, m := range ms {
			wd, wh := referenceMatch(m.s, keys)
			if wd != min(want[i], qb) || wh != 0 {
				t.Fatalf("stream %d, prompt of %d blocks: its index matches %d/%d blocks, want %d", i, qb, wd, wh, min(want[i], qb))
			}
			if got := dst[i]; got.DeviceHitTokens != wd*modelBlock || got.HostOnlyHitTokens != 0 {
				t.Fatalf("stream %d (prefix %d), prompt of %d blocks: query %d/%d tokens, want %d", i, want[i], qb, got.DeviceHitTokens, got.HostOnlyHitTokens, wd*modelBlock)
			}
		}
	}
}

// TestSynchronisedAnswerCarriesItsView: while writers withdraw and
// publish views over and over, every view holding the prompt's first
// block, an answer that says synchronised must count that block. A
// stream said synchronised before its slot counted in the shared table
// (or after it stopped counting) answered zero hits as if the engine held
// nothing: an under-report a router acts on (R-REC-2: the view appears
// whole, at once).
func TestSynchronisedAnswerCarriesItsView(t *testing.T) {
	const streams = 8
	prompt := make([]uint32, 8*modelBlock)
	for i := range prompt {
		prompt[i] = uint32(i*5 + 1)
	}
	holdA := []bool{true, true, false, false, false, false, false, false}
	holdB := []bool{true, false, true, true, true, true, true, true}
	d, ms := modelDirectory(t, streams)
	publications, stopChurn := churnViews(t, ms, prompt, holdA, holdB, 1)
	var dst []Match
	deadline := time.Now().Add(time.Second)
	synced := 0
	for time.Now().Before(deadline) || publications.Load() < 200 {
		dst = d.Query(prompt, dst[:0])
		for i, m := range dst {
			if !m.Synchronized {
				continue
			}
			synced++
			if m.ReusablePrefixTokens < modelBlock {
				stopChurn()
				t.Fatalf("stream %d synchronised at %d with %d tokens: its view holds the first block", i, m.Sequence, m.ReusablePrefixTokens)
			}
		}
	}
	stopChurn()
	if synced == 0 {
		t.Fatalf("no synchronised answer over %d publications", publications.Load())
	}
}

// churnViews has every stream of ms publish views of prompt over and
// over, holding holdA's blocks and holdB's in turn, each publication
// after the first a calibration that replaces the served view except
// every invalidateEvery-th, which withdraws the view first (1: every
// one). It returns the count of publications and a stop that waits for
// the writers.
func churnViews(t *testing.T, ms []*modelStream, prompt []uint32, holdA, holdB []bool, invalidateEvery int) (*atomic.Int64, func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	publications := new(atomic.Int64)
	for _, m := range ms {
		wg.Add(1)
		go func(s *stream) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				hold := holdA
				if i%2 == 1 {
					hold = holdB
				}
				if i%invalidateEvery == invalidateEvery-1 {
					s.invalidate("fault")
				}
				s.publish(chainIndex(t, prompt, hold), uint64(i), true, true)
				publications.Add(1)
			}
		}(m.s)
	}
	var once sync.Once
	return publications, func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
		})
	}
}

// TestKeyTableFillReservesOnce: publishing a view of n keys makes room
// for them in one rebuild, to rebuildLoad, where a change batch at a time
// would take dozens; a second slot holding the same keys, which need no
// room, leaves the cells at that size, not at the twice as many its
// reservation asked for. Both slots then hold every key (R-DIR-2).
func TestKeyTableFillReservesOnce(t *testing.T) {
	const n = 20000
	ix := kvindex.New(kvindex.Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: n})
	b := storedBatch(promptTokens(1, n*benchBlockSize), 0, 512)
	for e := range b.Events {
		if err := ix.Apply(&b.Events[e], kvindex.Snapshot); err != nil {
			t.Fatal(err)
		}
	}
	tab := newKeyTable(benchBlockSize, 1024)
	a, c := tab.allocSlot(), tab.allocSlot()
	var buf []keyChange
	want := (n*rebuildLoadDen + rebuildLoadNum - 1) / rebuildLoadNum
	tab.fill(a, ix, &buf)
	if len(tab.cells) != want || tab.live != n {
		t.Fatalf("one fill of %d keys: %d cells for %d keys, want %d cells (one rebuild to rebuildLoad)", n, len(tab.cells), tab.live, want)
	}
	tab.fill(c, ix, &buf)
	if len(tab.cells) != want || tab.live != n || tab.reserved != 0 {
		t.Fatalf("the same keys for a second slot: %d cells for %d keys, %d reserved; want %d cells", len(tab.cells), tab.live, tab.reserved, want)
	}
	ix.ForEachKey(func(k kvindex.Key, _, _ bool) {
		r, ok := tab.lookup(k)
		if !ok {
			t.Fatalf("key %x missing", k)
		}
		for _, s := range []int{a, c} {
			if dev, host := tab.slotTiers(r, s); !dev || host {
				t.Fatalf("key %x slot %d has %v/%v, want Device only", k, s, dev, host)
			}
		}
	})
}

// TestViewSizeOutlivesTheView: a stream reports what its view holds, and
// once the view is withdrawn (a fault, R-REC-3) what it held, which the
// recovery snapshot's index reserves (kvindex.Reserve).
func TestViewSizeOutlivesTheView(t *testing.T) {
	const n = 3000
	ix := kvindex.New(kvindex.Config{BlockSize: benchBlockSize, HashSeed: 1024, MaxBlocks: 4096})
	b := storedBatch(promptTokens(2, n*benchBlockSize), 0, 512)
	for e := range b.Events {
		if err := ix.Apply(&b.Events[e], kvindex.Snapshot); err != nil {
			t.Fatal(err)
		}
	}
	s := newStream(StreamSpec{InstanceName: "a", BlockSize: benchBlockSize, HashSeed: 1024})
	s.attach(newKeyTable(benchBlockSize, 1024))
	if got := s.viewSize(); got != 0 {
		t.Fatalf("before any view: %d", got)
	}
	s.publish(ix, 1, true, true)
	if got := s.viewSize(); got != n {
		t.Fatalf("with the view: %d, want %d", got, n)
	}
	s.invalidate("gap")
	if got := s.viewSize(); got != n {
		t.Fatalf("after the view was withdrawn: %d, want %d", got, n)
	}
}
