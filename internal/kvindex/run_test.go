package kvindex

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvcar/kvcar/internal/fuzzsrc"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// observed is one observer call.
type observed struct {
	key           Key
	dev, host, dr bool
}

// runEvents returns a batch of random events that form runs: mostly
// stored events continuing the chain of the one before (one block, now
// and then a few, or more than a chunk), broken now and then by another
// tier, a parent that is not the last block, text that is not plain, a
// tokenless replica, runs of removals, a clear or a block size the index
// does not have. Hashes come from a small universe, so blocks are stored
// again with other content (a key replaced, which drops a tier) and
// evicted ghosts come back.
func runEvents(rng *rand.Rand, bs int) []kvevent.Event {
	hash := func() kvevent.EngineHash { return kvevent.IntHash(uint64(rng.IntN(48))) }
	tokens := func(blocks int) []uint32 {
		t := make([]uint32, blocks*bs)
		for i := range t {
			t[i] = uint32(rng.IntN(3))
		}
		return t
	}
	var evs []kvevent.Event
	var last kvevent.EngineHash
	hasLast := false
	medium := kvevent.Device
	for range 1 + rng.IntN(40) {
		switch p := rng.IntN(100); {
		case p < 2:
			evs = append(evs, kvevent.Event{Kind: kvevent.AllBlocksCleared, PlainText: true})
			hasLast = false
			continue
		case p < 16:
			// Removals of one or two blocks (of none, or of more than a
			// batch, now and then), a run of them now and then, on a tier
			// with hits or, rarely, disk.
			m := kvevent.Medium(rng.IntN(2))
			if rng.IntN(10) == 0 {
				m = kvevent.Disk
			}
			for range 1 + rng.IntN(3) {
				ev := kvevent.Event{Kind: kvevent.BlockRemoved, Medium: m, PlainText: true}
				switch rng.IntN(8) {
				case 0: // none: engines may send an empty list
				case 1: // more than a batch of fetches
					for range warmBatch + 1 + rng.IntN(8) {
						ev.BlockHashes = append(ev.BlockHashes, hash())
					}
				default:
					for range 1 + rng.IntN(2) {
						ev.BlockHashes = append(ev.BlockHashes, hash())
					}
				}
				evs = append(evs, ev)
			}
			continue
		case p < 19:
			evs = append(evs, kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Host,
				BlockHashes: []kvevent.EngineHash{hash()}, PlainText: true})
			continue
		}
		n := 1
		switch rng.IntN(30) {
		case 0: // more than a chunk
			n = chunkBlocks + 1 + rng.IntN(8)
		case 1, 2, 3, 4, 5:
			n += rng.IntN(3)
		}
		ev := kvevent.Event{Kind: kvevent.BlockStored, Medium: medium, BlockSize: bs, PlainText: true, TokenIDs: tokens(n)}
		for range n {
			ev.BlockHashes = append(ev.BlockHashes, hash())
		}
		switch p := rng.IntN(100); {
		case p < 70 && hasLast: // the run goes on
			ev.HasParent, ev.ParentHash = true, last
		case p < 80: // a root
		default: // a random parent, known or not
			ev.HasParent, ev.ParentHash = true, hash()
		}
		switch p := rng.IntN(100); {
		case p < 8:
			ev.Medium = kvevent.Medium(rng.IntN(2))
			medium = ev.Medium
		case p < 10:
			ev.Medium = kvevent.Disk
		case p < 12:
			ev.PlainText = false
		case p < 13:
			ev.BlockSize = bs + 1
		}
		last, hasLast = ev.BlockHashes[n-1], true
		evs = append(evs, ev)
	}
	return evs
}

// TestApplyRunMatchesApply checks that ApplyRun, called as a stream calls
// it, leaves the index, its counters and the observer's calls exactly as
// Apply of each event in turn does, fails at the same event with the same
// error, joins events only as its rule says, and ends a run of stores
// after an event that dropped a tier; removals on one medium join as one
// step (R-IDX-1, R-IDX-2, R-IDX-5, R-CFG-2).
func TestApplyRunMatchesApply(t *testing.T) {
	const bs = 2
	seen := map[string]int{}
	for seed := uint64(1); seed <= 40; seed++ {
		cfg := Config{BlockSize: bs, HashSeed: 1024 + seed, MaxBlocks: 8 + int(seed%5)*8}
		runAgainstApply(t, cfg, rand.New(rand.NewPCG(seed, 0x72756e)), 300, fmt.Sprintf("seed %d", seed), seen)
	}
	for _, c := range []string{"joined", "joined removals", "drop inside a run's reach", "ghost eviction",
		ErrCapacity.Error(), ErrUnknownParent.Error(), ErrBlockSize.Error()} {
		if seen[c] == 0 {
			t.Errorf("random batches never produced %q", c)
		}
	}
	t.Logf("coverage: %v", seen)
}

// FuzzApplyRunMatchesApply is TestApplyRunMatchesApply with the batches'
// random choices read from the fuzzer's bytes (fuzzsrc.Source).
func FuzzApplyRunMatchesApply(f *testing.F) {
	f.Add(uint8(0), []byte{})
	f.Add(uint8(3), []byte("a chain, a removal, another tier"))
	f.Fuzz(func(t *testing.T, size uint8, choices []byte) {
		runAgainstApply(t, fuzzConfig(size), rand.New(fuzzsrc.New(choices)), fuzzsrc.Steps(choices, 8, 16, 32), "fuzzed", map[string]int{})
	})
}

// runAgainstApply applies batches of runEvents(rng) to two indexes of
// cfg, by Apply and by ApplyRun, and fails at the first difference; what
// the batches reached is added to seen.
func runAgainstApply(t testing.TB, cfg Config, rng *rand.Rand, batches int, name string, seen map[string]int) {
	t.Helper()
	bs := cfg.BlockSize
	one, run := New(cfg), New(cfg)
	var oneLog, runLog []observed
	oneDrops := 0
	one.SetObserver(func(k Key, d, h, dr bool) {
		oneLog = append(oneLog, observed{k, d, h, dr})
		if dr {
			oneDrops++
		}
	})
	run.SetObserver(func(k Key, d, h, dr bool) { runLog = append(runLog, observed{k, d, h, dr}) })
	for batch := range batches {
		evs := runEvents(rng, bs)
		mode := Delta
		if rng.IntN(4) == 0 {
			mode = Snapshot
		}
		// Apply, event by event, up to the first failure; which
		// events dropped a tier.
		var oneErr error
		failed := len(evs)
		dropped := make([]bool, len(evs))
		for i := range evs {
			before := oneDrops
			if oneErr = one.Apply(&evs[i], mode); oneErr != nil {
				failed = i
				break
			}
			dropped[i] = oneDrops > before
		}
		// ApplyRun, run after run, with a random bound on a run's
		// blocks, as applyPublished calls it.
		var runErr error
		n := 0
		for n < len(evs) {
			limit := 1 + rng.IntN(24)
			k, err := run.ApplyRun(evs[n:], mode, limit)
			where := fmt.Sprintf("%s batch %d events [%d, %d) of %d", name, batch, n, n+k, len(evs))
			if err == nil && k == 0 {
				t.Fatalf("%s: applied none without an error", where)
			}
			if err != nil && n+k != failed {
				t.Fatalf("%s: failed at event %d (%v), Apply at %d (%v)", where, n+k, err, failed, oneErr)
			}
			if err == nil && n+k > failed {
				t.Fatalf("%s: applied past event %d, where Apply failed: %v", where, failed, oneErr)
			}
			if k > 1 && evs[n].Kind == kvevent.BlockRemoved {
				// A run of removals on one medium, one step.
				seen["joined removals"]++
				blocks := 0
				for i := n; i < n+k; i++ {
					if e := &evs[i]; e.Kind != kvevent.BlockRemoved || e.Medium != evs[n].Medium || blocks >= limit {
						t.Fatalf("%s: joined event %d, %v on %v after %d blocks of removals, limit %d", where, i, e.Kind, e.Medium, blocks, limit)
					}
					blocks += len(evs[i].BlockHashes)
				}
			} else if k > 1 {
				seen["joined"]++
				blocks := 0
				for i := n; i < n+k; i++ {
					e := &evs[i]
					if e.Kind != kvevent.BlockStored || !e.PlainText || e.Medium != evs[n].Medium || len(e.TokenIDs) == 0 {
						t.Fatalf("%s: joined event %d, %v on %v plain %v with %d tokens", where, i, e.Kind, e.Medium, e.PlainText, len(e.TokenIDs))
					}
					if i > n && (!e.HasParent || e.ParentHash != evs[i-1].BlockHashes[len(evs[i-1].BlockHashes)-1]) {
						t.Fatalf("%s: joined event %d does not continue the chain", where, i)
					}
					if i < n+k-1 && dropped[i] {
						t.Fatalf("%s: went on after event %d, which dropped a tier", where, i)
					}
					if blocks >= limit {
						t.Fatalf("%s: joined event %d after %d blocks, limit %d", where, i, blocks, limit)
					}
					blocks += len(e.BlockHashes)
				}
			}
			n += k
			if err != nil {
				runErr = err
				seen[sentinel(err).Error()]++
				break
			}
		}
		if (oneErr == nil) != (runErr == nil) || oneErr != nil && oneErr.Error() != runErr.Error() {
			t.Fatalf("%s batch %d: ApplyRun's error %v, Apply's %v", name, batch, runErr, oneErr)
		}
		for i := range failed {
			if dropped[i] && i+1 < failed && evs[i+1].Kind == kvevent.BlockStored {
				seen["drop inside a run's reach"]++
			}
		}
		if !slices.Equal(oneLog, runLog) {
			t.Fatalf("%s batch %d: observer calls differ:\nApply    %v\nApplyRun %v", name, batch, oneLog, runLog)
		}
		oneLog, runLog = oneLog[:0], runLog[:0]
		if a, b := snapshotAll(one), snapshotAll(run); !maps.Equal(a, b) {
			t.Fatalf("%s batch %d: entries differ:\nApply    %v\nApplyRun %v", name, batch, a, b)
		}
		if one.Stats() != run.Stats() {
			t.Fatalf("%s batch %d: stats %+v, Apply's %+v", name, batch, run.Stats(), one.Stats())
		}
		d1, h1 := one.Counts()
		d2, h2 := run.Counts()
		if d1 != d2 || h1 != h2 || one.Len() != run.Len() {
			t.Fatalf("%s batch %d: counts %d/%d of %d, Apply's %d/%d of %d", name, batch, d2, h2, run.Len(), d1, h1, one.Len())
		}
		if err := checkInvariants(run); err != nil {
			t.Fatalf("%s batch %d: %v", name, batch, err)
		}
	}
	seen["ghost eviction"] += int(run.Stats().GhostEvictions)
}

// snapshotAll is every entry of ix by engine hash, ghosts and orphans
// included.
func snapshotAll(ix *Index) map[kvevent.EngineHash]entryState {
	m := map[kvevent.EngineHash]entryState{}
	ix.ForEach(func(h kvevent.EngineHash, k Key, d, hst bool) { m[h] = entryState{key: k, dev: d, host: hst} })
	return m
}
