package kvindex

import (
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
