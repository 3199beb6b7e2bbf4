package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// TestKeyLookupUnionAndStaleness: a lookup sees the union of the tiers of
// the entries sharing a key (R-IDX-2), leaves ghosts and orphans out,
// reuses its cells for a rebuild, and panics once its index has changed
// rather than answer from entries that moved.
func TestKeyLookupUnionAndStaleness(t *testing.T) {
	ix := newTestIndex(64)
	tokens := seq(1, 2*testBlockSize)
	keys := keysOf(tokens)
	// Two engine hashes for the same content, one on each tier.
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 1, 2), Delta)
	mustApply(t, ix, storedEv(kvevent.Host, -1, tokens, 11, 12), Delta)
	var l KeyLookup
	l.Build(ix)
	if d, h := l.Tiers(keys[1]); !d || !h {
		t.Fatalf("shared key: %v/%v, want both tiers", d, h)
	}
	if m := l.Match(keys); m != (Match{DeviceBlocks: 2}) {
		t.Fatalf("Match = %+v", m)
	}
	cells := len(l.t.cells)

	mustApply(t, ix, removedEv(kvevent.Device, 2), Delta)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("a lookup used after its index changed did not panic")
			}
		}()
		l.Tiers(keys[1])
	}()

	l.Build(ix)
	if len(l.t.cells) != cells {
		t.Fatalf("rebuilt lookup has %d cells, had %d", len(l.t.cells), cells)
	}
	if d, h := l.Tiers(keys[1]); d || !h {
		t.Fatalf("after the Device copy's removal: %v/%v, want Host only", d, h)
	}
	// Block 2's Device entry is a ghost now: in the engine table, not in
	// the lookup.
	if got := l.t.cells; countCells(got) != 3 {
		t.Fatalf("lookup holds %d entries, want the 3 on a tier", countCells(got))
	}

	var empty KeyLookup
	if d, h := empty.Tiers(keys[0]); d || h {
		t.Fatal("the zero lookup holds a key")
	}
}

func countCells(cells []uint32) int {
	n := 0
	for _, c := range cells {
		if c != 0 {
			n++
		}
	}
	return n
}

// TestForEachKeyAgainst builds pairs of indexes from the same random
// events, each missing some of them, as two views of one engine taken
// apart are, and checks that ForEachKeyAgainst gives every keyed entry on
// a tier once, with its own tiers and those of the other index's entry
// of the same engine hash when that entry holds the same key (R-REC-2's
// calibration swap compares views this way).
func TestForEachKeyAgainst(t *testing.T) {
	const bs = 2
	type state struct {
		key       Key
		keyed     bool
		dev, host bool
	}
	statesOf := func(ix *Index) map[kvevent.EngineHash]state {
		out := map[kvevent.EngineHash]state{}
		ix.ForEach(func(h kvevent.EngineHash, k Key, d, hst bool) { out[h] = state{key: k, dev: d, host: hst} })
		for s := range ix.entries {
			st := out[ix.entries[s].engine]
			st.keyed = ix.meta[s]&flagUnkeyed == 0
			out[ix.entries[s].engine] = st
		}
		return out
	}
	compared, both := 0, 0
	for seed := uint64(1); seed <= 8; seed++ {
		cfg := Config{BlockSize: bs, HashSeed: 3, MaxBlocks: 200}
		a, b := New(cfg), New(cfg)
		ra, rb := newRefModel(a.Config()), newRefModel(b.Config())
		rng := rand.New(rand.NewPCG(seed, 0x61676e))
		for range 600 {
			ev, mode := randomEvent(rng, ra, bs)
			_ = ra.apply(ev, mode)
			_ = a.Apply(ev, mode)
			if rng.IntN(5) != 0 {
				_ = rb.apply(ev, mode)
				_ = b.Apply(ev, mode)
			}
		}
		for _, pair := range [][2]*Index{{a, b}, {b, a}} {
			ix, other := pair[0], pair[1]
			own, theirs := statesOf(ix), statesOf(other)
			want := map[string]int{}
			for h, st := range own {
				if !st.keyed || !st.dev && !st.host {
					continue
				}
				o := theirs[h]
				if !o.keyed || o.key != st.key {
					o = state{}
				}
				want[fmt.Sprint(st.key, st.dev, st.host, o.dev, o.host)]++
				if o.dev || o.host {
					both++
				}
			}
			ix.ForEachKeyAgainst(other, func(k Key, d, h, od, oh bool) {
				want[fmt.Sprint(k, d, h, od, oh)]--
				compared++
			})
			for c, n := range want {
				if n != 0 {
					t.Fatalf("seed %d: %q: %d more in the model than ForEachKeyAgainst gave", seed, c, n)
				}
			}
		}
	}
	if compared == 0 || both == 0 || both == compared {
		t.Fatalf("%d entries compared, %d of them held by both: the test covers too little", compared, both)
	}
}
