package kvindex

import (
	"fmt"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
)

const (
	testBlockSize = 4
	testSeed      = 1024
)

func newTestIndex(maxBlocks int) *Index {
	return New(Config{BlockSize: testBlockSize, HashSeed: testSeed, MaxBlocks: maxBlocks})
}

// hs builds integer engine hashes.
func hs(vs ...uint64) []kvevent.EngineHash {
	out := make([]kvevent.EngineHash, len(vs))
	for i, v := range vs {
		out[i] = kvevent.IntHash(v)
	}
	return out
}

// storedEv builds a BlockStored event with tokens; parent < 0 means a root.
func storedEv(m kvevent.Medium, parent int64, tokens []uint32, hashes ...uint64) *kvevent.Event {
	ev := &kvevent.Event{
		Kind:        kvevent.BlockStored,
		Medium:      m,
		BlockHashes: hs(hashes...),
		TokenIDs:    tokens,
		BlockSize:   testBlockSize,
		PlainText:   true,
	}
	if parent >= 0 {
		ev.HasParent, ev.ParentHash = true, kvevent.IntHash(uint64(parent))
	}
	return ev
}

// tokenlessEv builds a hash-only BlockStored as engines send for Host
// offload copies: no tokens, no parent, block size 0.
func tokenlessEv(m kvevent.Medium, hashes ...uint64) *kvevent.Event {
	return &kvevent.Event{Kind: kvevent.BlockStored, Medium: m, BlockHashes: hs(hashes...), PlainText: true}
}

func removedEv(m kvevent.Medium, hashes ...uint64) *kvevent.Event {
	return &kvevent.Event{Kind: kvevent.BlockRemoved, Medium: m, BlockHashes: hs(hashes...)}
}

// seq returns n tokens start, start+1, ...
func seq(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func mustApply(t *testing.T, ix *Index, ev *kvevent.Event, mode Mode) {
	t.Helper()
	if err := ix.Apply(ev, mode); err != nil {
		t.Fatalf("Apply(%v %v): %v", ev.Kind, ev.BlockHashes, err)
	}
}

type entryState struct {
	key       Key
	dev, host bool
}

// snapshotState maps every entry's integer hash to its state; the tests
// that use it store integer hashes only.
func snapshotState(ix *Index) map[uint64]entryState {
	m := make(map[uint64]entryState)
	ix.ForEach(func(h kvevent.EngineHash, k Key, d, hst bool) {
		m[h.Lo] = entryState{key: k, dev: d, host: hst}
	})
	return m
}

// matchOf is the prefix of keys ix holds, through a lookup built for it.
func matchOf(ix *Index, keys []Key) Match {
	var l KeyLookup
	l.Build(ix)
	return l.Match(keys)
}

// keyTiersOf is the union of the tiers of the entries of ix holding k.
func keyTiersOf(ix *Index, k Key) (onDevice, onHost bool) {
	var l KeyLookup
	l.Build(ix)
	return l.Tiers(k)
}

func keysOf(tokens []uint32) []Key { return KeysFor(tokens, testBlockSize, testSeed, nil) }

// checkInvariants verifies the internal structures against each other:
// each entry is reachable once through the engine table, and each keyed
// entry on a tier once through a KeyLookup built now, the ghost queue holds
// every entry on neither tier, each queued slot once and flagged, and the
// replica counters add up.
func checkInvariants(ix *Index) error {
	n := len(ix.entries)
	if len(ix.meta) != n {
		return fmt.Errorf("%d meta bytes for %d entries", len(ix.meta), n)
	}
	if n > ix.cfg.MaxBlocks {
		return fmt.Errorf("%d entries over max %d", n, ix.cfg.MaxBlocks)
	}
	count := func(t *table) (map[uint32]int, error) {
		seen := make(map[uint32]int)
		for _, c := range t.cells {
			if c == 0 {
				continue
			}
			if int(t.slot(c)) >= n {
				return nil, fmt.Errorf("cell points at slot %d of %d", t.slot(c), n)
			}
			seen[t.slot(c)]++
		}
		return seen, nil
	}
	be, err := count(&ix.byEngine)
	if err != nil {
		return err
	}
	var l KeyLookup
	l.Build(ix)
	bk, err := count(&l.t)
	if err != nil {
		return err
	}
	looked := 0
	for s := range n {
		if keyedOnTier(ix.meta[s]) {
			looked++
		}
	}
	if len(be) != n || len(bk) != looked {
		return fmt.Errorf("tables hold %d/%d slots, entries %d of which %d keyed on a tier", len(be), len(bk), n, looked)
	}
	for _, t := range []*table{&ix.byEngine, &l.t} {
		if err := checkHomes(ix, t, t == &l.t); err != nil {
			return err
		}
	}
	dev, host := 0, 0
	for s := range ix.entries {
		e := &ix.entries[s]
		orphan := ix.meta[s]&flagUnkeyed != 0
		wantKey := 1
		if !keyedOnTier(ix.meta[s]) {
			wantKey = 0
		}
		if be[uint32(s)] != 1 || bk[uint32(s)] != wantKey {
			return fmt.Errorf("slot %d (orphan %v) appears %d/%d times", s, orphan, be[uint32(s)], bk[uint32(s)])
		}
		if got, ok := ix.findEngine(e.engine); !ok || got != uint32(s) {
			return fmt.Errorf("engine %#x resolves to %d,%v, want %d", e.engine, got, ok, s)
		}
		if ix.tiers(uint32(s))&tierDevice != 0 {
			dev++
		}
		if ix.tiers(uint32(s))&tierHost != 0 {
			host++
		}
		if wantKey == 0 {
			continue
		}
		if home, _ := l.t.keyHash(e.key); !reachable(&l.t, home, uint32(s)) {
			return fmt.Errorf("slot %d unreachable from its key's home", s)
		}
		if t := l.tiers(e.key, false); t&ix.tiers(uint32(s)) != ix.tiers(uint32(s)) {
			return fmt.Errorf("key of slot %d hides its tiers %b", s, ix.tiers(uint32(s)))
		}
	}
	if dev != ix.device || host != ix.host {
		return fmt.Errorf("counters %d/%d, entries %d/%d", ix.device, ix.host, dev, host)
	}
	queued := make(map[uint32]bool)
	q := ix.ghosts
	for i := range q.n {
		s := q.buf[(q.head+i)%len(q.buf)]
		if int(s) >= n || queued[s] || ix.meta[s]&flagQueued == 0 {
			return fmt.Errorf("queue slot %d: out of range, twice or not flagged", s)
		}
		queued[s] = true
	}
	for s := range ix.entries {
		flagged := ix.meta[s]&flagQueued != 0
		if flagged != queued[uint32(s)] {
			return fmt.Errorf("slot %d flagged queued %v, queued %v", s, flagged, queued[uint32(s)])
		}
		if ix.tiers(uint32(s)) == 0 && !flagged {
			return fmt.Errorf("ghost %d not queued", s)
		}
	}
	return nil
}

// reachable reports whether a probe from home meets slot s before an
// empty cell, which every lookup relies on.
func reachable(t *table, home uint64, s uint32) bool {
	for i := home; t.cells[i] != 0; i = t.next(i) {
		if t.slot(t.cells[i]) == s {
			return true
		}
	}
	return false
}

// checkHomes verifies that every cell of t holds its entry's home bits
// and fingerprint, and that far counts the cells homeSpan or more past
// their home.
func checkHomes(ix *Index, t *table, byKey bool) error {
	n := uint64(len(t.cells))
	far := 0
	for j, c := range t.cells {
		if c == 0 {
			continue
		}
		e := &ix.entries[t.slot(c)]
		home, tag := t.engineHash(e.engine)
		if byKey {
			home, tag = t.keyHash(e.key)
		}
		if c>>t.sb != tag {
			return fmt.Errorf("cell %d holds tag %#x, its entry's is %#x", j, c>>t.sb, tag)
		}
		if (uint64(j)+n-home)%n >= homeSpan {
			far++
		} else if h := t.cellHome(uint64(j), c); h != home {
			return fmt.Errorf("cell %d: home bits give %d, home is %d", j, h, home)
		}
	}
	if far != t.far {
		return fmt.Errorf("%d cells far from home, counted %d", far, t.far)
	}
	return nil
}

// fuzzConfig is the index the fuzz targets drive: two-token blocks, and
// room for 4 to 51 blocks as the fuzzer's size byte says.
func fuzzConfig(size uint8) Config {
	return Config{BlockSize: 2, HashSeed: 1024, MaxBlocks: 4 + int(size%48)}
}
