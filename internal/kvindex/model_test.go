package kvindex

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvcar/kvcar/internal/fuzzsrc"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/zeebo/xxh3"
)

// refModel is a deliberately naive reference of the index semantics: a Go
// map from engine hash to entry, linear scans for queries and evictions,
// and its own byte building for content keys.
type refModel struct {
	blockSize int
	seed      uint64
	max       int
	entries   map[kvevent.EngineHash]*refEntry
	clock     uint64
	stats     Stats
	// orphansKeyed counts orphans a store with a known parent keyed, and
	// liveOrphanChildren live stores under an orphan parent: coverage.
	orphansKeyed, liveOrphanChildren int
	// shared, when set, collects every content key that two keyed
	// entries held at once, even for a moment within one event.
	shared map[Key]bool
}

// markIfShared adds k to r.shared if an entry other than self holds it.
func (r *refModel) markIfShared(k Key, self *refEntry) {
	if r.shared == nil {
		return
	}
	for _, e := range r.entries {
		if e != self && !e.unkeyed && e.key == k {
			r.shared[k] = true
			return
		}
	}
}

type refEntry struct {
	key Key
	// unkeyed: an orphan, whose key is unknown and which is never a hit.
	unkeyed   bool
	dev, host bool
	// queued is set from when the entry becomes a ghost, at queuedAt,
	// until eviction reaches it: a ghost revived and dropped again keeps
	// its first place.
	queued   bool
	queuedAt uint64
}

func newRefModel(cfg Config) *refModel {
	return &refModel{blockSize: cfg.BlockSize, seed: cfg.HashSeed, max: cfg.MaxBlocks, entries: map[kvevent.EngineHash]*refEntry{}}
}

func (r *refModel) key(parent *Key, tokens []uint32) Key {
	var b []byte
	if parent != nil {
		b = binary.BigEndian.AppendUint64(b, parent.Hi)
		b = binary.BigEndian.AppendUint64(b, parent.Lo)
	}
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	u := xxh3.Hash128Seed(b, r.seed)
	return Key{Hi: u.Hi, Lo: u.Lo}
}

func (r *refModel) set(e *refEntry, m kvevent.Medium) {
	switch m {
	case kvevent.Host:
		e.host = true
	case kvevent.Device:
		e.dev = true
	}
}

// ghost makes e a ghost, queued last unless it still is queued.
func (r *refModel) ghost(e *refEntry) {
	if e.queued {
		return
	}
	r.clock++
	e.queued, e.queuedAt = true, r.clock
}

// clear drops the replica and reports whether it was there.
func (r *refModel) clear(e *refEntry, m kvevent.Medium) bool {
	p := &e.dev
	if m == kvevent.Host {
		p = &e.host
	}
	if !*p {
		return false
	}
	*p = false
	if !e.dev && !e.host {
		r.ghost(e)
	}
	return true
}

func (r *refModel) apply(ev *kvevent.Event, mode Mode) error {
	switch ev.Kind {
	case kvevent.AllBlocksCleared:
		clear(r.entries)
		return nil
	case kvevent.BlockRemoved:
		if !ev.Medium.Served() {
			return nil
		}
		for _, h := range ev.BlockHashes {
			e, ok := r.entries[h]
			if !ok || !r.clear(e, ev.Medium) {
				r.stats.UnknownRemovals++
			}
		}
		return nil
	}
	if !ev.PlainText {
		r.stats.NonPlainBlocks += uint64(len(ev.BlockHashes))
		return nil
	}
	if !ev.Medium.Served() {
		r.stats.UnservedBlocks += uint64(len(ev.BlockHashes))
		if len(ev.TokenIDs) == 0 {
			return nil
		}
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			if e, ok := r.entries[h]; ok {
				r.set(e, ev.Medium)
			} else {
				r.stats.UnresolvedReplicas++
			}
		}
		return nil
	}
	if ev.BlockSize != r.blockSize {
		return ErrBlockSize
	}
	var parent *Key
	if ev.HasParent {
		e, ok := r.entries[ev.ParentHash]
		if !ok && mode == Delta {
			return ErrUnknownParent
		}
		if !ok || e.unkeyed {
			// Orphans keep their tiers under their hash, without a key;
			// known blocks keep theirs.
			r.stats.OrphanBlocks += uint64(len(ev.BlockHashes))
			if ok && mode == Delta {
				r.liveOrphanChildren++
			}
			if !ev.Medium.Served() {
				return nil
			}
			for _, h := range ev.BlockHashes {
				if e, ok := r.entries[h]; ok {
					r.set(e, ev.Medium)
					continue
				}
				if err := r.room(); err != nil {
					return err
				}
				e := &refEntry{unkeyed: true}
				r.set(e, ev.Medium)
				r.entries[h] = e
			}
			return nil
		}
		k := e.key
		parent = &k
	}
	for j, h := range ev.BlockHashes {
		k := r.key(parent, ev.TokenIDs[j*r.blockSize:(j+1)*r.blockSize])
		parent = &k
		if e, ok := r.entries[h]; ok {
			if e.unkeyed {
				r.orphansKeyed++
			}
			e.key, e.unkeyed = k, false
			r.markIfShared(k, e)
			r.set(e, ev.Medium)
			continue
		}
		if err := r.room(); err != nil {
			return err
		}
		e := &refEntry{key: k}
		r.markIfShared(k, e)
		r.set(e, ev.Medium)
		if !e.dev && !e.host {
			r.ghost(e)
		}
		r.entries[h] = e
	}
	return nil
}

// room evicts the earliest queued ghost when the model is full: a revived
// entry leaves the queue and the next is tried.
func (r *refModel) room() error {
	if len(r.entries) < r.max {
		return nil
	}
	for {
		var victim kvevent.EngineHash
		var oldest *refEntry
		for vh, e := range r.entries {
			if e.queued && (oldest == nil || e.queuedAt < oldest.queuedAt) {
				victim, oldest = vh, e
			}
		}
		if oldest == nil {
			return ErrCapacity
		}
		oldest.queued = false
		if !oldest.dev && !oldest.host {
			delete(r.entries, victim)
			r.stats.GhostEvictions++
			return nil
		}
	}
}

func (r *refModel) match(keys []Key) Match {
	var m Match
	for _, k := range keys {
		dev, host := false, false
		for _, e := range r.entries {
			if e.key == k && !e.unkeyed {
				dev, host = dev || e.dev, host || e.host
			}
		}
		switch {
		case dev:
			m.DeviceBlocks++
		case host:
			m.HostOnlyBlocks++
		default:
			return m
		}
	}
	return m
}

func (r *refModel) counts() (int, int) {
	d, h := 0, 0
	for _, e := range r.entries {
		if e.dev {
			d++
		}
		if e.host {
			h++
		}
	}
	return d, h
}

func sentinel(err error) error {
	for _, s := range []error{ErrBlockSize, ErrTokenCount, ErrUnknownParent, ErrCapacity, ErrEvent} {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

// randomEvent draws events over a small universe of engine hashes and a
// two-letter token alphabet, so that re-stores, re-pointing, duplicate
// content keys, ghosts, orphans and capacity pressure all happen often.
func randomEvent(rng *rand.Rand, r *refModel, bs int) (*kvevent.Event, Mode) {
	mode := Delta
	if rng.IntN(3) == 0 {
		mode = Snapshot
	}
	// Mostly the two served tiers; disk and unknown tiers now and then.
	medium := kvevent.Medium(rng.IntN(2))
	if rng.IntN(10) == 0 {
		medium = kvevent.Disk + kvevent.Medium(rng.IntN(3))
	}
	// A quarter of the universe is 128-bit hashes whose low half equals
	// an integer hash's, so the tables must keep the halves apart.
	hash := func() kvevent.EngineHash {
		v := uint64(rng.IntN(40))
		if v >= 30 {
			return kvevent.EngineHash{Hi: v, Lo: v - 30}
		}
		return kvevent.IntHash(v)
	}
	hashes := func(n int) []kvevent.EngineHash {
		hs := make([]kvevent.EngineHash, n)
		for i := range hs {
			hs[i] = hash()
		}
		return hs
	}
	switch p := rng.IntN(100); {
	case p < 2:
		return &kvevent.Event{Kind: kvevent.AllBlocksCleared}, mode
	case p < 35:
		return &kvevent.Event{Kind: kvevent.BlockRemoved, Medium: medium, BlockHashes: hashes(1 + rng.IntN(4))}, mode
	case p < 50:
		return &kvevent.Event{Kind: kvevent.BlockStored, Medium: medium, BlockHashes: hashes(1 + rng.IntN(3)), PlainText: true}, mode
	}
	n := 1 + rng.IntN(3)
	ev := &kvevent.Event{
		Kind:        kvevent.BlockStored,
		Medium:      medium,
		BlockHashes: hashes(n),
		TokenIDs:    make([]uint32, n*bs),
		BlockSize:   bs,
		PlainText:   rng.IntN(30) != 0,
	}
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = uint32(rng.IntN(2))
	}
	if rng.IntN(60) == 0 {
		ev.BlockSize = bs + 1
	}
	switch rng.IntN(5) {
	case 0: // root
	case 1, 2: // a random hash, known or not
		ev.HasParent, ev.ParentHash = true, hash()
	default: // a hash the model holds, to grow chains
		if len(r.entries) > 0 {
			// Drawn from the sorted hashes, not a map's order, so that a
			// sequence is the same on every run (a fuzzer's failing
			// input must fail again).
			held := slices.SortedFunc(maps.Keys(r.entries), func(a, b kvevent.EngineHash) int {
				return cmp.Or(cmp.Compare(a.Hi, b.Hi), cmp.Compare(a.Lo, b.Lo))
			})
			ev.HasParent, ev.ParentHash = true, held[rng.IntN(len(held))]
		}
	}
	return ev, mode
}

func compareWithModel(ix *Index, r *refModel, rng *rand.Rand, bs int) error {
	if err := checkInvariants(ix); err != nil {
		return err
	}
	if ix.Len() != len(r.entries) {
		return fmt.Errorf("Len %d, model %d", ix.Len(), len(r.entries))
	}
	got := map[kvevent.EngineHash]entryState{}
	ix.ForEach(func(h kvevent.EngineHash, k Key, d, hst bool) { got[h] = entryState{key: k, dev: d, host: hst} })
	for h, e := range r.entries {
		g, ok := got[h]
		if !ok || g != (entryState{key: e.key, dev: e.dev, host: e.host}) {
			return fmt.Errorf("hash %v: index %+v (present %v), model %+v", h, g, ok, *e)
		}
	}
	if d, h := ix.Counts(); true {
		if md, mh := r.counts(); d != md || h != mh {
			return fmt.Errorf("Counts %d/%d, model %d/%d", d, h, md, mh)
		}
	}
	if ix.Stats() != r.stats {
		return fmt.Errorf("Stats %+v, model %+v", ix.Stats(), r.stats)
	}
	for q := 0; q < 8; q++ {
		tokens := make([]uint32, rng.IntN(5*bs+1))
		for i := range tokens {
			tokens[i] = uint32(rng.IntN(2))
		}
		keys := KeysFor(tokens, bs, r.seed, nil)
		if m, mm := matchOf(ix, keys), r.match(keys); m != mm {
			return fmt.Errorf("Match(%v) = %+v, model %+v", tokens, m, mm)
		}
	}
	return nil
}

// TestAgainstReferenceModel drives the index and the reference model with
// the same random event sequences and compares state, counters, errors and
// queries after every event (R-IDX-1..3, R-IDX-5, R-CFG-2).
func TestAgainstReferenceModel(t *testing.T) {
	const bs = 2
	seen := map[string]int{}
	for seed := uint64(1); seed <= 24; seed++ {
		cfg := Config{BlockSize: bs, HashSeed: 1024 + seed, MaxBlocks: 8 + int(seed%4)*8}
		name := fmt.Sprintf("seed %d", seed)
		if againstModel(t, cfg, rand.New(rand.NewPCG(seed, 0x6b76636172)), 1500, name, seen) == 0 {
			t.Fatalf("%s: the sequence never held a replica", name)
		}
	}
	// The sequences must have reached the cases the model exists to check.
	for _, c := range []string{ErrCapacity.Error(), ErrUnknownParent.Error(), ErrBlockSize.Error(),
		"ghost eviction", "orphan", "orphan keyed later", "live child of an orphan",
		"unresolved replica", "unserved tier", "shared content key"} {
		if seen[c] == 0 {
			t.Errorf("random sequences never produced %q", c)
		}
	}
	t.Logf("coverage: %v", seen)
}

// FuzzAgainstReferenceModel is TestAgainstReferenceModel with the
// events' random choices read from the fuzzer's bytes (fuzzsrc.Source).
func FuzzAgainstReferenceModel(f *testing.F) {
	f.Add(uint8(0), []byte{})
	f.Add(uint8(5), []byte("stores, removals, another tier, a clear"))
	f.Fuzz(func(t *testing.T, size uint8, choices []byte) {
		againstModel(t, fuzzConfig(size), rand.New(fuzzsrc.New(choices)), fuzzsrc.Steps(choices, 32, 4, 256), "fuzzed", map[string]int{})
	})
}

// againstModel applies steps random events to an index of cfg and to the
// reference model, and fails at the first difference in errors, state or
// answers; it adds what the events reached to seen and returns the sum,
// over the steps, of the replicas the index held.
func againstModel(t testing.TB, cfg Config, rng *rand.Rand, steps int, name string, seen map[string]int) (hits int) {
	t.Helper()
	bs := cfg.BlockSize
	ix := New(cfg)
	r := newRefModel(ix.Config())
	for step := range steps {
		ev, mode := randomEvent(rng, r, bs)
		err, merr := ix.Apply(ev, mode), r.apply(ev, mode)
		if err != nil {
			seen[sentinel(err).Error()]++
		}
		if sentinel(err) != sentinel(merr) {
			t.Fatalf("%s step %d %v %v: err %v, model %v", name, step, ev.Kind, mode, err, merr)
		}
		if err := compareWithModel(ix, r, rng, bs); err != nil {
			t.Fatalf("%s step %d after %v %v %+v: %v", name, step, ev.Kind, mode, ev, err)
		}
		d, h := ix.Counts()
		hits += d + h
		if hasSharedKey(r) {
			seen["shared content key"]++
		}
	}
	st := ix.Stats()
	seen["ghost eviction"] += int(st.GhostEvictions)
	seen["orphan"] += int(st.OrphanBlocks)
	seen["orphan keyed later"] += r.orphansKeyed
	seen["live child of an orphan"] += r.liveOrphanChildren
	seen["unresolved replica"] += int(st.UnresolvedReplicas)
	seen["unserved tier"] += int(st.UnservedBlocks)
	return hits
}

func hasSharedKey(r *refModel) bool {
	keys := make(map[Key]bool, len(r.entries))
	for _, e := range r.entries {
		if keys[e.key] {
			return true
		}
		keys[e.key] = true
	}
	return false
}
