package kvindex

import (
	"errors"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex/prefillgen"
)

// TestTieredReplicas_RIDX2: Device and Host copies are independent; removing
// one leaves the other, and a block on both counts once, as Device.
func TestTieredReplicas_RIDX2(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(1, 3*testBlockSize)
	keys := keysOf(tokens)
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 10, 11, 12), Delta)
	mustApply(t, ix, tokenlessEv(kvevent.Host, 10, 11, 12), Delta)

	if m := matchOf(ix, keys); m != (Match{DeviceBlocks: 3}) {
		t.Fatalf("both tiers: %+v, want 3 device", m)
	}
	if d, h := ix.Counts(); d != 3 || h != 3 {
		t.Fatalf("Counts = %d, %d; want 3, 3", d, h)
	}

	mustApply(t, ix, removedEv(kvevent.Device, 11, 12), Delta)
	if m := matchOf(ix, keys); m != (Match{DeviceBlocks: 1, HostOnlyBlocks: 2}) {
		t.Fatalf("after Device removal: %+v, want 1 device + 2 host-only", m)
	}

	mustApply(t, ix, storedEv(kvevent.Device, 10, tokens[testBlockSize:], 11, 12), Delta)
	mustApply(t, ix, removedEv(kvevent.Host, 10, 11, 12), Delta)
	if m := matchOf(ix, keys); m != (Match{DeviceBlocks: 3}) {
		t.Fatalf("after Host removal: %+v, want 3 device", m)
	}
	if d, h := ix.Counts(); d != 3 || h != 0 {
		t.Fatalf("Counts = %d, %d; want 3, 0", d, h)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestContiguousPrefixStop_RIDX3: the walk stops at the first block on
// neither tier even if later blocks are cached.
func TestContiguousPrefixStop_RIDX3(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(100, 4*testBlockSize)
	keys := keysOf(tokens)
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 1, 2, 3, 4), Delta)
	mustApply(t, ix, tokenlessEv(kvevent.Host, 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 3), Delta)

	if m := matchOf(ix, keys); m != (Match{DeviceBlocks: 1, HostOnlyBlocks: 1}) {
		t.Fatalf("Match = %+v, want host-only 1 then device 1, stop at block 3", m)
	}
	// A query whose tokens diverge in block 2 stops there.
	other := cat(tokens[:testBlockSize], seq(900, 3*testBlockSize))
	if m := matchOf(ix, keysOf(other)); m != (Match{HostOnlyBlocks: 1}) {
		t.Fatalf("diverging query: %+v, want 1 host-only", m)
	}
	// Partial trailing tokens never count (R-IDX-3).
	if m := matchOf(ix, keysOf(cat(tokens[:2*testBlockSize], tokens[2*testBlockSize:2*testBlockSize+3]))); m.Blocks() != 2 {
		t.Fatalf("partial tail: %+v, want 2 blocks", m)
	}
	if m := matchOf(ix, nil); m != (Match{}) {
		t.Fatalf("empty query: %+v", m)
	}
}

// TestUnknownParentDelta_RIDX5: a live store whose parent is unknown fails
// with ErrUnknownParent and changes nothing.
func TestUnknownParentDelta_RIDX5(t *testing.T) {
	ix := newTestIndex(0)
	mustApply(t, ix, storedEv(kvevent.Device, -1, seq(1, testBlockSize), 1), Delta)
	before := snapshotState(ix)
	err := ix.Apply(storedEv(kvevent.Device, 99, seq(50, 2*testBlockSize), 2, 3), Delta)
	if !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("err = %v, want ErrUnknownParent", err)
	}
	if after := snapshotState(ix); !maps.Equal(before, after) {
		t.Fatalf("state changed: %v -> %v", before, after)
	}
	if ix.Stats().OrphanBlocks != 0 {
		t.Fatalf("delta error counted as orphan: %+v", ix.Stats())
	}
}

// TestSnapshotOrphanKept_RIDX5: in a snapshot an orphan suffix, its
// children too, is kept under its engine hashes without a content key:
// never a hit, but counted on its tiers, and independent prefixes are
// still indexed.
func TestSnapshotOrphanKept_RIDX5(t *testing.T) {
	ix := newTestIndex(0)
	a := seq(1, 2*testBlockSize)
	b := seq(500, 2*testBlockSize)
	orphan, child := seq(300, 2*testBlockSize), seq(400, testBlockSize)
	mustApply(t, ix, storedEv(kvevent.Device, 77, orphan, 20, 21), Snapshot) // parent 77 evicted
	mustApply(t, ix, storedEv(kvevent.Device, 21, child, 22), Snapshot)      // child of the orphan
	mustApply(t, ix, tokenlessEv(kvevent.Host, 21), Snapshot)                // the orphan's Host copy
	mustApply(t, ix, storedEv(kvevent.Device, -1, a, 1, 2), Snapshot)
	mustApply(t, ix, storedEv(kvevent.Host, -1, b, 5, 6), Snapshot)

	if ix.Len() != 7 {
		t.Fatalf("Len = %d, want 7", ix.Len())
	}
	if st := ix.Stats(); st.OrphanBlocks != 3 || st.UnresolvedReplicas != 0 {
		t.Fatalf("stats %+v, want 3 orphan blocks and every replica resolved", st)
	}
	if d, h := ix.Counts(); d != 5 || h != 3 {
		t.Fatalf("Counts = %d Device / %d Host, want 5 / 3", d, h)
	}
	if m := matchOf(ix, keysOf(a)); m != (Match{DeviceBlocks: 2}) {
		t.Fatalf("prefix a: %+v", m)
	}
	if m := matchOf(ix, keysOf(b)); m != (Match{HostOnlyBlocks: 2}) {
		t.Fatalf("prefix b: %+v", m)
	}
	// Whatever the orphans' true parent was, no prompt reaches them.
	for _, p := range [][]uint32{orphan, cat(a, orphan), cat(b, orphan, child)} {
		if m := matchOf(ix, keysOf(p)); m.Blocks() > 2 {
			t.Fatalf("orphan reported as a hit: %+v", m)
		}
	}
	st := snapshotState(ix)
	for _, h := range []uint64{20, 21, 22} {
		if st[h].key != (Key{}) || !st[h].dev {
			t.Fatalf("orphan %d: %+v, want on Device without a key", h, st[h])
		}
	}
	if !st[21].host {
		t.Fatal("the orphan's Host copy was not attached to it")
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestOrphanHostCopyKnownOnceKeyed_RIDX5 is the case an engine with Host
// offload produces: a block on Host whose parent left both tiers is an
// orphan in a snapshot; the parent is computed again and the block, its
// Host copy kept, is loaded back and announced as a Device store with
// tokens (no new Host store: the engine's copy never left); then Device
// evicts it. The engine still holds it on Host, so the index must report
// it as a Host-only hit, not lose it. Removing its Host copy while it was
// an orphan makes it a ghost that the later store revives on Device only.
func TestOrphanHostCopyKnownOnceKeyed_RIDX5(t *testing.T) {
	for _, removeHostFirst := range []bool{false, true} {
		ix := newTestIndex(0)
		tokens := seq(1, 3*testBlockSize)
		keys := keysOf(tokens)
		type call struct {
			k    Key
			d, h bool
		}
		var calls []call
		ix.SetObserver(func(k Key, d, h, _ bool) { calls = append(calls, call{k, d, h}) })
		mustApply(t, ix, storedEv(kvevent.Host, 1, tokens[testBlockSize:2*testBlockSize], 2), Snapshot)
		mustApply(t, ix, storedEv(kvevent.Device, 2, tokens[2*testBlockSize:], 3), Snapshot)
		if len(calls) != 0 {
			t.Fatalf("observer told of orphans: %v", calls)
		}
		if removeHostFirst {
			mustApply(t, ix, removedEv(kvevent.Host, 2), Delta)
		}
		mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 1, 2, 3), Delta)
		if m := matchOf(ix, keys); m != (Match{DeviceBlocks: 3}) {
			t.Fatalf("after the chain is stored again: %+v", m)
		}
		mustApply(t, ix, removedEv(kvevent.Device, 3, 2), Delta)
		want := Match{DeviceBlocks: 1, HostOnlyBlocks: 1}
		if removeHostFirst {
			want = Match{DeviceBlocks: 1}
		}
		if m := matchOf(ix, keys); m != want {
			t.Fatalf("Host copy removed first %v: %+v, want %+v", removeHostFirst, m, want)
		}
		if onDev, onHost := keyTiersOf(ix, keys[1]); onDev || onHost != !removeHostFirst {
			t.Fatalf("Tiers of the once-orphan through a KeyLookup: %v/%v", onDev, onHost)
		}
		if last := calls[len(calls)-1]; last != (call{keys[1], false, !removeHostFirst}) {
			t.Fatalf("observer's last call %+v, want the once-orphan's key on Host %v", last, !removeHostFirst)
		}
		if err := checkInvariants(ix); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLiveChildOfOrphan_RIDX5: a live store under an orphan parent is no
// lost event (the parent is known, only its key is not): the children are
// orphans too. A live store under a hash never seen still is.
func TestLiveChildOfOrphan_RIDX5(t *testing.T) {
	ix := newTestIndex(0)
	mustApply(t, ix, storedEv(kvevent.Device, 77, seq(300, testBlockSize), 20), Snapshot)
	mustApply(t, ix, storedEv(kvevent.Device, 20, seq(400, 2*testBlockSize), 21, 22), Delta)
	if d, _ := ix.Counts(); d != 3 || ix.Stats().OrphanBlocks != 3 {
		t.Fatalf("Counts %d Device, stats %+v: want 3 orphans on Device", d, ix.Stats())
	}
	if err := ix.Apply(storedEv(kvevent.Device, 78, seq(500, testBlockSize), 23), Delta); !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("unknown parent live: %v, want ErrUnknownParent", err)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestAdoptKeys_RIDX5: a snapshot's orphan takes the key the served
// view held for its engine hash, keeping the snapshot's tiers, so that
// when its parent is stored again the prefix through it is a hit without
// the engine announcing it again. Orphans the served view did not key,
// and indexes of another block size or seed, adopt nothing.
func TestAdoptKeys_RIDX5(t *testing.T) {
	tokens := seq(1, 3*testBlockSize)
	keys := keysOf(tokens)
	served := newTestIndex(0)
	mustApply(t, served, storedEv(kvevent.Device, -1, tokens, 1, 2, 3), Delta)
	mustApply(t, served, storedEv(kvevent.Device, 77, seq(90, testBlockSize), 9), Snapshot) // an orphan there too

	calibrated := newTestIndex(0)
	// Block 1 was evicted from both tiers; 2 is on Host, 3 on Device.
	mustApply(t, calibrated, storedEv(kvevent.Host, 1, tokens[testBlockSize:2*testBlockSize], 2), Snapshot)
	mustApply(t, calibrated, storedEv(kvevent.Device, 2, tokens[2*testBlockSize:], 3), Snapshot)
	mustApply(t, calibrated, storedEv(kvevent.Device, 8, seq(90, testBlockSize), 9), Snapshot)
	mustApply(t, calibrated, storedEv(kvevent.Device, 8, seq(95, testBlockSize), 10), Snapshot)

	otherSeed := newTestIndexSeed(served, 7)
	mustApply(t, otherSeed, storedEv(kvevent.Device, -1, tokens, 1, 2, 3), Delta)
	if n := calibrated.AdoptKeys(otherSeed); n != 0 {
		t.Fatalf("adopted %d keys from an index of another seed", n)
	}
	if n := calibrated.AdoptKeys(served); n != 2 {
		t.Fatalf("adopted %d keys, want 2 (blocks 2 and 3; 9 and 10 are unkeyed or unknown there)", n)
	}
	st := snapshotState(calibrated)
	if st[2] != (entryState{key: keys[1], host: true}) || st[3] != (entryState{key: keys[2], dev: true}) {
		t.Fatalf("adopted entries %+v %+v", st[2], st[3])
	}
	if st[9].key != (Key{}) || st[10].key != (Key{}) {
		t.Fatalf("orphans the served view did not key were keyed: %+v %+v", st[9], st[10])
	}
	if m := matchOf(calibrated, keys); m.Blocks() != 0 {
		t.Fatalf("before the parent is stored again: %+v", m)
	}
	mustApply(t, calibrated, storedEv(kvevent.Device, -1, tokens[:testBlockSize], 1), Delta)
	if m := matchOf(calibrated, keys); m != (Match{DeviceBlocks: 2, HostOnlyBlocks: 1}) {
		t.Fatalf("after the parent is stored again: %+v, want blocks 1 and 3 on Device, 2 on Host only", m)
	}
	if err := checkInvariants(calibrated); err != nil {
		t.Fatal(err)
	}
}

// newTestIndexSeed returns an empty index like ix but with another hash
// seed.
func newTestIndexSeed(ix *Index, seed uint64) *Index {
	cfg := ix.Config()
	cfg.HashSeed = seed
	return New(cfg)
}

// TestTokenlessHostReplica_RIDX1: a hash-only Host announcement attaches to
// the known block's key; an unknown hash is counted and ignored.
func TestTokenlessHostReplica_RIDX1(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(7, 2*testBlockSize)
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 1, 2), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 1, 2), Delta)
	if m := matchOf(ix, keysOf(tokens)); m.Blocks() != 0 {
		t.Fatalf("after removal: %+v", m)
	}
	mustApply(t, ix, tokenlessEv(kvevent.Host, 1, 2, 42), Delta)
	if m := matchOf(ix, keysOf(tokens)); m != (Match{HostOnlyBlocks: 2}) {
		t.Fatalf("after Host offload: %+v, want 2 host-only", m)
	}
	if st := ix.Stats(); st.UnresolvedReplicas != 1 {
		t.Fatalf("UnresolvedReplicas = %d, want 1", st.UnresolvedReplicas)
	}
	if ix.Len() != 2 {
		t.Fatalf("Len = %d: unresolved hash created an entry", ix.Len())
	}
}

// TestGhostChaining_RIDX1: a parent dropped from both tiers still anchors
// the key of a child stored later, but is not a hit itself.
func TestGhostChaining_RIDX1(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(1, 3*testBlockSize)
	keys := keysOf(tokens)
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens[:testBlockSize], 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 1), Delta)
	if ix.Len() != 1 {
		t.Fatalf("ghost dropped: Len = %d", ix.Len())
	}
	mustApply(t, ix, storedEv(kvevent.Device, 1, tokens[testBlockSize:], 2, 3), Delta)

	st := snapshotState(ix)
	if st[2].key != keys[1] || st[3].key != keys[2] {
		t.Fatalf("children keyed %#x %#x, want %#x %#x", st[2].key, st[3].key, keys[1], keys[2])
	}
	if m := matchOf(ix, keys); m.Blocks() != 0 {
		t.Fatalf("ghost root counted: %+v", m)
	}
	mustApply(t, ix, tokenlessEv(kvevent.Host, 1), Delta)
	if m := matchOf(ix, keys); m != (Match{HostOnlyBlocks: 1, DeviceBlocks: 2}) {
		t.Fatalf("revived ghost: %+v", m)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestGhostQueueRevived_RCFG2: a ghost revived stays queued and eviction
// passes over it while it is resident; dropped again, it keeps its first
// place in the queue, so it goes before a ghost made after that.
func TestGhostQueueRevived_RCFG2(t *testing.T) {
	ix := newTestIndex(4)
	// evicted checks that the last store evicted block gone and kept block
	// kept, and that the structures agree.
	evicted := func(gone, kept uint64, why string) {
		t.Helper()
		st := snapshotState(ix)
		if _, ok := st[gone]; ok {
			t.Fatalf("block %d kept, %d not: %s", gone, kept, why)
		}
		if _, ok := st[kept]; !ok {
			t.Fatalf("block %d evicted: %s", kept, why)
		}
		if err := checkInvariants(ix); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(t, ix, storedEv(kvevent.Device, -1, seq(1, 4*testBlockSize), 1, 2, 3, 4), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 1), Delta) // ghost, queued first
	mustApply(t, ix, removedEv(kvevent.Device, 2), Delta) // ghost, queued second
	mustApply(t, ix, tokenlessEv(kvevent.Host, 1), Delta) // 1 revived, still queued
	mustApply(t, ix, storedEv(kvevent.Device, 4, seq(100, testBlockSize), 5), Delta)
	evicted(2, 1, "eviction passes over the resident 1")
	// 1 left the queue when eviction passed it; dropped again it queues
	// behind 3, made a ghost before it.
	mustApply(t, ix, removedEv(kvevent.Device, 3), Delta)
	mustApply(t, ix, removedEv(kvevent.Host, 1), Delta)
	mustApply(t, ix, storedEv(kvevent.Device, 5, seq(200, testBlockSize), 6), Delta)
	evicted(3, 1, "ghost 3 is older than 1")
	// A ghost revived and dropped while still queued keeps its first place.
	mustApply(t, ix, removedEv(kvevent.Device, 4), Delta) // queued after 1
	mustApply(t, ix, tokenlessEv(kvevent.Host, 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Host, 1), Delta)
	mustApply(t, ix, storedEv(kvevent.Device, 6, seq(300, testBlockSize), 7), Delta)
	evicted(1, 4, "ghost 1 keeps its first place in the queue")
}

// TestCapacity_RCFG2: MaxBlocks counts ghosts; the oldest ghost is evicted
// for a new entry, and with no ghost the store fails with ErrCapacity.
func TestCapacity_RCFG2(t *testing.T) {
	ix := newTestIndex(4)
	mustApply(t, ix, storedEv(kvevent.Device, -1, seq(1, 4*testBlockSize), 1, 2, 3, 4), Delta)

	before := snapshotState(ix)
	err := ix.Apply(storedEv(kvevent.Device, 4, seq(100, testBlockSize), 5), Delta)
	if !errors.Is(err, ErrCapacity) {
		t.Fatalf("err = %v, want ErrCapacity", err)
	}
	if after := snapshotState(ix); !maps.Equal(before, after) {
		t.Fatalf("failed store changed state: %v -> %v", before, after)
	}
	// Re-storing an existing hash needs no new entry.
	mustApply(t, ix, tokenlessEv(kvevent.Host, 2), Delta)
	mustApply(t, ix, storedEv(kvevent.Host, -1, seq(1, testBlockSize), 1), Delta)

	mustApply(t, ix, removedEv(kvevent.Device, 3), Delta)
	mustApply(t, ix, removedEv(kvevent.Host, 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 1), Delta) // 3 is the older ghost, then 1
	mustApply(t, ix, storedEv(kvevent.Device, 4, seq(100, testBlockSize), 5), Delta)
	st := snapshotState(ix)
	if _, ok := st[3]; ok {
		t.Fatal("newer ghost evicted before the older one")
	}
	if _, ok := st[1]; !ok {
		t.Fatal("ghost 1 evicted too early")
	}
	if ix.Len() != 4 || ix.Stats().GhostEvictions != 1 {
		t.Fatalf("Len = %d, GhostEvictions = %d; want 4, 1", ix.Len(), ix.Stats().GhostEvictions)
	}
	// Block 5 chains from 4, so its key is the fifth key of the sequence.
	if want := keysOf(cat(seq(1, 4*testBlockSize), seq(100, testBlockSize)))[4]; st[5].key != want {
		t.Fatalf("block 5 key %#x, want %#x", st[5].key, want)
	}
	// The evicted hash is gone: a tokenless replica cannot resolve it.
	mustApply(t, ix, tokenlessEv(kvevent.Host, 3), Delta)
	if ix.Stats().UnresolvedReplicas != 1 {
		t.Fatalf("evicted hash still resolves")
	}

	// A multi-block event fails part-way: earlier blocks stay, the
	// structures stay consistent.
	err = ix.Apply(storedEv(kvevent.Device, 5, seq(200, 2*testBlockSize), 6, 7), Delta)
	if !errors.Is(err, ErrCapacity) {
		t.Fatalf("err = %v, want ErrCapacity", err)
	}
	if _, ok := snapshotState(ix)[6]; !ok {
		t.Fatal("block before the failing one not applied (documented behaviour)")
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

func TestAllBlocksCleared(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(1, 2*testBlockSize)
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 1, 2), Delta)
	mustApply(t, ix, tokenlessEv(kvevent.Host, 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 2), Delta) // ghost
	mustApply(t, ix, &kvevent.Event{Kind: kvevent.AllBlocksCleared}, Delta)
	if ix.Len() != 0 {
		t.Fatalf("Len = %d after clear", ix.Len())
	}
	if d, h := ix.Counts(); d != 0 || h != 0 {
		t.Fatalf("Counts = %d, %d after clear", d, h)
	}
	if m := matchOf(ix, keysOf(tokens)); m.Blocks() != 0 {
		t.Fatalf("Match after clear: %+v", m)
	}
	// Ghosts are gone too: the old root no longer anchors children.
	if err := ix.Apply(storedEv(kvevent.Device, 2, seq(9, testBlockSize), 3), Delta); !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("err = %v, want ErrUnknownParent", err)
	}
	mustApply(t, ix, storedEv(kvevent.Host, -1, tokens, 1, 2), Delta)
	if m := matchOf(ix, keysOf(tokens)); m != (Match{HostOnlyBlocks: 2}) {
		t.Fatalf("refill after clear: %+v", m)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestDuplicateContentKeys_RIDX2: two engine hashes with the same content
// key are two holders; the query sees the union and each removal only
// drops its own replica.
func TestDuplicateContentKeys_RIDX2(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(1, 2*testBlockSize)
	keys := keysOf(tokens)
	mustApply(t, ix, storedEv(kvevent.Host, -1, tokens, 1, 2), Delta)
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, 101, 102), Delta)
	mustApply(t, ix, tokenlessEv(kvevent.Host, 101), Delta)

	st := snapshotState(ix)
	if st[1].key != st[101].key || st[2].key != st[102].key {
		t.Fatal("same prefix under two hashes got different keys")
	}
	if m := matchOf(ix, keys); m != (Match{DeviceBlocks: 2}) {
		t.Fatalf("union: %+v, want 2 device", m)
	}
	mustApply(t, ix, removedEv(kvevent.Device, 101, 102), Delta)
	if m := matchOf(ix, keys); m != (Match{HostOnlyBlocks: 2}) {
		t.Fatalf("after removing the Device holder: %+v, want 2 host-only", m)
	}
	mustApply(t, ix, removedEv(kvevent.Host, 1), Delta)
	if m := matchOf(ix, keys); m != (Match{HostOnlyBlocks: 2}) {
		t.Fatalf("after removing one Host holder: %+v, want 2 host-only via 101", m)
	}
	mustApply(t, ix, removedEv(kvevent.Host, 101), Delta)
	if m := matchOf(ix, keys); m.Blocks() != 0 {
		t.Fatalf("no holder left for block 1: %+v", m)
	}
	if d, h := ix.Counts(); d != 0 || h != 1 {
		t.Fatalf("Counts = %d, %d; want 0, 1 (hash 2 on Host)", d, h)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreRepoints: a hash stored again with other content follows it,
// and the old key stops matching through that hash.
func TestRestoreRepoints(t *testing.T) {
	ix := newTestIndex(0)
	a, b := seq(1, testBlockSize), seq(50, testBlockSize)
	mustApply(t, ix, storedEv(kvevent.Device, -1, a, 1), Delta)
	mustApply(t, ix, storedEv(kvevent.Device, -1, a, 1), Delta) // idempotent
	if d, _ := ix.Counts(); d != 1 || ix.Len() != 1 {
		t.Fatalf("idempotent re-store: device %d, len %d", d, ix.Len())
	}
	mustApply(t, ix, storedEv(kvevent.Host, -1, b, 1), Delta)
	if m := matchOf(ix, keysOf(a)); m.Blocks() != 0 {
		t.Fatalf("old content still matches: %+v", m)
	}
	// The re-pointed entry keeps its Device replica: the engine reported
	// no removal, and the hash is what the engine's tiers are keyed by.
	if m := matchOf(ix, keysOf(b)); m != (Match{DeviceBlocks: 1}) {
		t.Fatalf("new content: %+v", m)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

func TestBlockSizeMismatch(t *testing.T) {
	ix := newTestIndex(0)
	ev := storedEv(kvevent.Device, -1, seq(1, 16), 1, 2)
	ev.BlockSize = 8
	err := ix.Apply(ev, Delta)
	if !errors.Is(err, ErrBlockSize) {
		t.Fatalf("err = %v, want ErrBlockSize", err)
	}
	if ix.Len() != 0 {
		t.Fatal("mismatched event applied")
	}
	ev = storedEv(kvevent.Device, -1, seq(1, 7), 1, 2)
	if err := ix.Apply(ev, Snapshot); !errors.Is(err, ErrTokenCount) {
		t.Fatalf("err = %v, want ErrTokenCount", err)
	}
}

func TestNonPlainAndUnknownRemovals_RWIRE5(t *testing.T) {
	ix := newTestIndex(0)
	ev := storedEv(kvevent.Device, -1, seq(1, 2*testBlockSize), 1, 2)
	ev.PlainText = false
	mustApply(t, ix, ev, Delta)
	if ix.Len() != 0 || ix.Stats().NonPlainBlocks != 2 {
		t.Fatalf("LoRA blocks indexed: len %d, stats %+v", ix.Len(), ix.Stats())
	}
	mustApply(t, ix, storedEv(kvevent.Device, -1, seq(1, testBlockSize), 1), Delta)
	mustApply(t, ix, removedEv(kvevent.Host, 1, 9), Delta) // wrong tier, unknown hash
	if st := ix.Stats(); st.UnknownRemovals != 2 {
		t.Fatalf("UnknownRemovals = %d, want 2", st.UnknownRemovals)
	}
	if err := ix.Apply(&kvevent.Event{Kind: 0}, Delta); !errors.Is(err, ErrEvent) {
		t.Fatalf("err = %v, want ErrEvent", err)
	}
	if err := ix.Apply(&kvevent.Event{Kind: kvevent.BlockRemoved, Medium: 7}, Delta); !errors.Is(err, ErrEvent) {
		t.Fatalf("err = %v, want ErrEvent", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := New(Config{HashSeed: 5}).Config()
	if c.BlockSize != DefaultBlockSize || c.MaxBlocks != DefaultMaxBlocks || c.HashSeed != 5 {
		t.Fatalf("Config = %+v", c)
	}
	if c := New(Config{MaxBlocks: 1 << 30}).Config(); c.MaxBlocks != maxSlots {
		t.Fatalf("MaxBlocks %d not clamped to %d", c.MaxBlocks, maxSlots)
	}
}

// TestGrowthKeepsState: many blocks force several table rebuilds.
func TestGrowthKeepsState(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(1, 1000*testBlockSize)
	hashes := make([]uint64, 1000)
	for i := range hashes {
		hashes[i] = uint64(i)
	}
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, hashes...), Snapshot)
	if m := matchOf(ix, keysOf(tokens)); m.DeviceBlocks != 1000 {
		t.Fatalf("Match = %+v", m)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

func TestMatchNoAllocs_RIDX3(t *testing.T) {
	ix := newTestIndex(0)
	tokens := seq(1, 64*testBlockSize)
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	mustApply(t, ix, storedEv(kvevent.Device, -1, tokens, hashes...), Delta)
	keys := keysOf(tokens)
	var l KeyLookup
	l.Build(ix)
	if n := testing.AllocsPerRun(20, func() { _ = l.Match(keys) }); n != 0 {
		t.Fatalf("Match allocates %v times", n)
	}
}

// TestCapacityAcrossChunks_RCFG2: a long event that runs out of room keeps
// exactly the blocks stored before the failing one, across the internal
// chunking, and those blocks form a matching prefix.
func TestCapacityAcrossChunks_RCFG2(t *testing.T) {
	ix := newTestIndex(20)
	tokens := seq(1, 40*testBlockSize)
	hashes := make([]uint64, 40)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	err := ix.Apply(storedEv(kvevent.Host, -1, tokens, hashes...), Delta)
	if !errors.Is(err, ErrCapacity) {
		t.Fatalf("err = %v, want ErrCapacity", err)
	}
	if ix.Len() != 20 {
		t.Fatalf("Len = %d, want 20", ix.Len())
	}
	if m := matchOf(ix, keysOf(tokens)); m != (Match{HostOnlyBlocks: 20}) {
		t.Fatalf("Match = %+v, want 20 host-only", m)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestLookupByEngineHash covers the per-hash view used to compare two
// indexes of one stream (calibration drift): tiers of a resident block,
// of a ghost, and of an unknown hash.
func TestLookupByEngineHash(t *testing.T) {
	ix := New(Config{BlockSize: 4, HashSeed: 1024, MaxBlocks: 16})
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	stored := kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Device, BlockHashes: hs(10, 11),
		TokenIDs: toks, BlockSize: 4, PlainText: true}
	if err := ix.Apply(&stored, Delta); err != nil {
		t.Fatal(err)
	}
	host := kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Host, BlockHashes: hs(11), PlainText: true}
	if err := ix.Apply(&host, Delta); err != nil {
		t.Fatal(err)
	}
	removed := kvevent.Event{Kind: kvevent.BlockRemoved, Medium: kvevent.Device, BlockHashes: hs(10), PlainText: true}
	if err := ix.Apply(&removed, Delta); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		h              uint64
		dev, host, has bool
	}{{10, false, false, true}, {11, true, true, true}, {12, false, false, false}} {
		d, h, ok := ix.Lookup(kvevent.IntHash(tc.h))
		if d != tc.dev || h != tc.host || ok != tc.has {
			t.Errorf("Lookup(%d) = %v %v %v, want %v %v %v", tc.h, d, h, ok, tc.dev, tc.host, tc.has)
		}
	}
}

// TestStorageBound_RCFG2: max_blocks_per_stream bounds the index's memory.
// Filling an index to its limit and past it (ghost eviction, tokenless
// replicas of unknown hashes) never holds more than MaxStorageBytes, for
// limits just past a table-size step, where the tables are largest per
// block.
func TestStorageBound_RCFG2(t *testing.T) {
	for _, maxBlocks := range []int{1, 13, 3<<10 + 1, 12289} {
		cfg := Config{BlockSize: testBlockSize, HashSeed: testSeed, MaxBlocks: maxBlocks}
		ix := New(cfg)
		limit := cfg.MaxStorageBytes()
		var parent int64 = -1
		for i := range 2 * maxBlocks {
			h := uint64(i + 1)
			var ev *kvevent.Event
			if i%3 == 2 {
				ev = tokenlessEv(kvevent.Host, h)
			} else {
				ev = storedEv(kvevent.Device, parent, seq(i*testBlockSize, testBlockSize), h)
				parent = int64(h)
			}
			if err := ix.Apply(ev, Delta); err != nil && !errors.Is(err, ErrCapacity) && !errors.Is(err, ErrUnknownParent) {
				t.Fatalf("max %d, event %d: %v", maxBlocks, i, err)
			}
			if i%64 == 0 && i < maxBlocks {
				mustApply(t, ix, removedEv(kvevent.Device, h), Delta) // make a ghost
			}
			if got := ix.StorageBytes(); got > limit {
				t.Fatalf("max %d, after %d events: %d bytes, over the bound %d", maxBlocks, i+1, got, limit)
			}
		}
		t.Logf("max_blocks %d: %d bytes at the limit (%.1f per block), bound %d", maxBlocks, ix.StorageBytes(),
			float64(ix.StorageBytes())/float64(maxBlocks), limit)
	}
}

// TestUnservedTiers (item 8): a block stored on a tier that is neither
// Device nor Host (disk, external, unknown) is never a hit, but its
// mapping is kept so that children stored on Device resolve their parent;
// a removal on such a tier changes nothing.
func TestUnservedTiers(t *testing.T) {
	for _, m := range []kvevent.Medium{kvevent.Disk, kvevent.External, kvevent.OtherMedium} {
		ix := newTestIndex(0)
		a, b := seq(1, testBlockSize), seq(50, testBlockSize)
		mustApply(t, ix, storedEv(m, -1, a, 1), Delta)
		if mt := matchOf(ix, keysOf(a)); mt.Blocks() != 0 {
			t.Fatalf("%v: block on an unserved tier matched: %+v", m, mt)
		}
		if d, h := ix.Counts(); d != 0 || h != 0 {
			t.Fatalf("%v: counts %d/%d", m, d, h)
		}
		mustApply(t, ix, storedEv(kvevent.Device, 1, b, 2), Delta)
		// The child is keyed under its parent's content, so the prefix
		// a+b finds it only past a block that is no hit: nothing matches,
		// and the child's own key is the one of the whole prefix.
		if mt := matchOf(ix, keysOf(cat(a, b))); mt.Blocks() != 0 {
			t.Fatalf("%v: prefix through an unserved parent matched: %+v", m, mt)
		}
		if st := snapshotState(ix)[2]; st.key != keysOf(cat(a, b))[1] || !st.dev {
			t.Fatalf("%v: child state %+v", m, st)
		}
		// The parent comes to Device: the whole prefix matches.
		mustApply(t, ix, tokenlessEv(kvevent.Device, 1), Delta)
		if mt := matchOf(ix, keysOf(cat(a, b))); mt != (Match{DeviceBlocks: 2}) {
			t.Fatalf("%v: after the Device copy: %+v", m, mt)
		}
		mustApply(t, ix, removedEv(m, 1, 2), Delta)
		if mt := matchOf(ix, keysOf(cat(a, b))); mt != (Match{DeviceBlocks: 2}) {
			t.Fatalf("%v: a removal on an unserved tier changed Device: %+v", m, mt)
		}
		mustApply(t, ix, tokenlessEv(m, 1, 2, 3), Delta)
		if st := ix.Stats(); st.UnservedBlocks != 4 || st.UnresolvedReplicas != 0 {
			t.Fatalf("%v: stats %+v", m, st)
		}
		if err := checkInvariants(ix); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWideEngineHashes (item 9): 128-bit engine hashes (byte-string
// hashes reduced by kvevent.BytesHash) are kept whole: two hashes that
// share their low 64 bits are different blocks.
func TestWideEngineHashes(t *testing.T) {
	ix := newTestIndex(0)
	a, b := seq(1, testBlockSize), seq(50, testBlockSize)
	h1 := kvevent.EngineHash{Hi: 1, Lo: 7}
	h2 := kvevent.EngineHash{Hi: 2, Lo: 7}
	stored := func(h kvevent.EngineHash, tokens []uint32) *kvevent.Event {
		return &kvevent.Event{Kind: kvevent.BlockStored, Medium: kvevent.Device, BlockHashes: []kvevent.EngineHash{h},
			TokenIDs: tokens, BlockSize: testBlockSize, PlainText: true}
	}
	mustApply(t, ix, stored(h1, a), Delta)
	mustApply(t, ix, stored(h2, b), Delta)
	mustApply(t, ix, stored(kvevent.IntHash(7), seq(90, testBlockSize)), Delta)
	if ix.Len() != 3 {
		t.Fatalf("Len %d, want 3 distinct blocks", ix.Len())
	}
	rm := &kvevent.Event{Kind: kvevent.BlockRemoved, Medium: kvevent.Device, BlockHashes: []kvevent.EngineHash{h2}}
	mustApply(t, ix, rm, Delta)
	if m := matchOf(ix, keysOf(a)); m != (Match{DeviceBlocks: 1}) {
		t.Fatalf("removing %v touched %v: %+v", h2, h1, m)
	}
	if m := matchOf(ix, keysOf(b)); m.Blocks() != 0 {
		t.Fatalf("removed block still matches: %+v", m)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
}

// TestHistoryModeOrphans: in History mode an unknown parent is a block
// stored before the view began; its children are kept as orphans, not an
// error, and are never hits.
func TestHistoryModeOrphans(t *testing.T) {
	ix := newTestIndex(0)
	a, b := seq(1, testBlockSize), seq(50, 2*testBlockSize)
	mustApply(t, ix, storedEv(kvevent.Device, 77, b, 2, 3), History)
	mustApply(t, ix, storedEv(kvevent.Device, 3, seq(90, testBlockSize), 4), History)
	mustApply(t, ix, storedEv(kvevent.Device, -1, a, 1), History)
	if st := ix.Stats(); st.OrphanBlocks != 3 || ix.Len() != 4 {
		t.Fatalf("stats %+v, len %d", st, ix.Len())
	}
	if m := matchOf(ix, keysOf(cat(a, b))); m != (Match{DeviceBlocks: 1}) {
		t.Fatalf("Match = %+v", m)
	}
	if err := ix.Apply(storedEv(kvevent.Device, 77, b, 2, 3), Delta); !errors.Is(err, ErrUnknownParent) {
		t.Fatalf("Delta mode: %v, want ErrUnknownParent", err)
	}
}

// TestTableFarFromHome builds a table where hundreds of engine hashes
// share one home, so that cells lie 256 and more past it, and removes
// them in random order: removals must then find later cells' homes from
// their entries, count the far cells exactly, and keep every remaining
// entry reachable (R-IDX-3 relies on lookups finding what was stored).
func TestTableFarFromHome(t *testing.T) {
	const maxBlocks, n = 2000, 400
	ix := New(Config{BlockSize: testBlockSize, MaxBlocks: maxBlocks})
	probe := newTable(maxBlocks)
	probe.alloc(tableSize(n, maxBlocks))
	rng := rand.New(rand.NewPCG(7, 8))
	for v := uint64(1); len(ix.entries) < n; v++ {
		h := kvevent.IntHash(v)
		if home, _ := probe.engineHash(h); home == 5 {
			ix.entries = append(ix.entries, entry{key: Key{Hi: rng.Uint64(), Lo: rng.Uint64()}, engine: h})
			ix.meta = append(ix.meta, tierDevice)
		}
	}
	ix.device = n
	ix.rebuildTable(n)
	if ix.byEngine.far != n-homeSpan {
		t.Fatalf("%d far cells, want %d", ix.byEngine.far, n-homeSpan)
	}
	if err := checkInvariants(ix); err != nil {
		t.Fatal(err)
	}
	gone := map[uint32]bool{}
	for _, s := range rng.Perm(n) {
		ix.deleteEngine(uint32(s))
		gone[uint32(s)] = true
		if err := checkHomes(ix, &ix.byEngine, false); err != nil {
			t.Fatalf("after removing %d of %d: %v", len(gone), n, err)
		}
		for o := range uint32(n) {
			if got, ok := ix.findEngine(ix.entries[o].engine); ok == gone[o] || (ok && got != o) {
				t.Fatalf("after removing %d: slot %d found %v at %d", len(gone), o, ok, got)
			}
		}
	}
	if ix.byEngine.far != 0 {
		t.Fatalf("%d far cells left in an empty table", ix.byEngine.far)
	}
}

// TestSteadyChurnLargeTables runs an index of a few thousand blocks, whose
// tables are far larger than homeSpan cells, at steady state as an engine
// does: every message removes the blocks stored window messages earlier
// and stores as many new ones, which take the slots of the oldest ghosts.
// Removals then take the path that finds later cells' homes from their
// home bits alone, and the blocks of a message are warmed and stored in
// batches; every entry must stay reachable through the engine table and
// a KeyLookup, removed blocks must be on no tier and stored ones on
// Device (R-IDX-3, R-CFG-2). Messages come in each of the benchmarks'
// shapes (prefillgen.Shapes), applied a run at a time.
func TestSteadyChurnLargeTables(t *testing.T) {
	const window = 50
	size := window * prefillgen.Blocks
	for _, shape := range prefillgen.Shapes() {
		ix := New(Config{BlockSize: shape.Options.BlockSize(), HashSeed: 1024, MaxBlocks: size})
		dec := kvevent.NewDecoder(8 << 20)
		var batch kvevent.Batch
		apply := func(f *prefillgen.Message, i int) {
			f.Rewrite(i, window)
			if err := dec.DecodeBatch(f.Payload, &batch); err != nil {
				t.Fatal(err)
			}
			for e := 0; e < len(batch.Events); {
				n, err := ix.ApplyRun(batch.Events[e:], Delta, prefillgen.Blocks)
				if e += n; err != nil {
					t.Fatalf("%s: message %d event %d: %v", shape.Name, i, e, err)
				}
			}
		}
		fill := prefillgen.NewWith(t, shape.Options.Fill())
		shape.Options.Removals = true
		steady := prefillgen.NewWith(t, shape.Options)
		for i := range window {
			apply(fill, i)
		}
		for i := window; i < 4*window; i++ {
			apply(steady, i)
			if dev, _ := ix.Counts(); dev != size {
				t.Fatalf("%s: message %d: %d blocks on Device, want %d", shape.Name, i, dev, size)
			}
			for _, ev := range batch.Events {
				for _, h := range ev.BlockHashes {
					// A removed block is a ghost, or gone when a new
					// block took its slot.
					onDev, _, ok := ix.Lookup(h)
					if stored := ev.Kind == kvevent.BlockStored; onDev != stored || (stored && !ok) {
						t.Fatalf("%s: message %d: %v block %v: known %v, on Device %v", shape.Name, i, ev.Kind, h, ok, onDev)
					}
				}
			}
			if i%10 == 0 {
				if err := checkInvariants(ix); err != nil {
					t.Fatalf("%s: message %d: %v", shape.Name, i, err)
				}
			}
		}
		if ix.byEngine.far != 0 || len(ix.byEngine.cells) <= homeSpan {
			t.Fatalf("%s: far cells %d in %d cells; the test wants the home-bits path", shape.Name, ix.byEngine.far, len(ix.byEngine.cells))
		}
		if st := ix.Stats(); st.GhostEvictions == 0 {
			t.Fatalf("%s: no ghost was evicted", shape.Name)
		}
	}
}

// TestAdoptKeysRandom applies random event sequences to two indexes, one
// of them in snapshot mode only and missing some events so that it holds
// orphans the other keys, and checks
// AdoptKeys: every orphan the other index keys takes that key and keeps
// its tiers, every other entry is unchanged, and the tables stay whole
// (R-IDX-5).
func TestAdoptKeysRandom(t *testing.T) {
	const bs = 2
	adopted, orphans := 0, 0
	for seed := uint64(1); seed <= 16; seed++ {
		cfg := Config{BlockSize: bs, HashSeed: 99, MaxBlocks: 64}
		served, calibrated := New(cfg), New(cfg)
		rng := rand.New(rand.NewPCG(seed, 0x61646f7074))
		r := newRefModel(served.Config())
		for range 400 {
			ev, mode := randomEvent(rng, r, bs)
			_ = r.apply(ev, mode)
			_ = served.Apply(ev, mode)
			// The other index misses some events, among them parents it
			// then sees children of: a snapshot taken in between.
			if rng.IntN(3) > 0 {
				_ = calibrated.Apply(ev, Snapshot)
			}
		}
		before := map[kvevent.EngineHash]entryState{}
		calibrated.ForEach(func(h kvevent.EngineHash, k Key, d, hst bool) { before[h] = entryState{k, d, hst} })
		keyed := map[kvevent.EngineHash]Key{}
		served.ForEach(func(h kvevent.EngineHash, k Key, _, _ bool) {
			if s, ok := served.findEngine(h); ok && served.meta[s]&flagUnkeyed == 0 {
				keyed[h] = k
			}
		})
		for h := range before {
			if s, _ := calibrated.findEngine(h); calibrated.meta[s]&flagUnkeyed != 0 {
				orphans++
			}
		}
		n := calibrated.AdoptKeys(served)
		adopted += n
		got := 0
		calibrated.ForEach(func(h kvevent.EngineHash, k Key, d, hst bool) {
			b := before[h]
			if d != b.dev || hst != b.host {
				t.Fatalf("seed %d: hash %v changed tiers %v/%v -> %v/%v", seed, h, b.dev, b.host, d, hst)
			}
			s, _ := calibrated.findEngine(h)
			orphan := calibrated.meta[s]&flagUnkeyed != 0
			sk, servedKeyed := keyed[h]
			switch {
			case k != b.key && (orphan || !servedKeyed || k != sk):
				t.Fatalf("seed %d: hash %v key %v -> %v, served has %v (%v)", seed, h, b.key, k, sk, servedKeyed)
			case k != b.key:
				got++
			case orphan && servedKeyed:
				t.Fatalf("seed %d: orphan %v not adopted though the served index keys it", seed, h)
			}
		})
		if got != n {
			t.Fatalf("seed %d: AdoptKeys said %d, %d entries changed key", seed, n, got)
		}
		if err := checkInvariants(calibrated); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	if adopted == 0 || orphans == adopted {
		t.Fatalf("%d orphans, %d adopted keys: the sequences must give both outcomes", orphans, adopted)
	}
	t.Logf("%d orphans, %d adopted keys", orphans, adopted)
}

// TestReserveSizesStorageOnce: Reserve(n) makes room for n entries at
// once, so filling to n never grows storage or tables; it is capped at
// MaxBlocks (R-CFG-2), keeps what the index held, and the index then
// answers as one grown entry by entry.
func TestReserveSizesStorageOnce(t *testing.T) {
	const n = 3000
	tokens := seq(1, n*testBlockSize)
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	grown, reserved := newTestIndex(4096), newTestIndex(4096)
	// Something held before the reservation must survive it.
	for _, ix := range []*Index{grown, reserved} {
		mustApply(t, ix, storedEv(kvevent.Device, -1, tokens[:testBlockSize], hashes[0]), Snapshot)
	}
	reserved.Reserve(n)
	before := reserved.StorageBytes()
	if m := matchOf(reserved, keysOf(tokens)); m.DeviceBlocks != 1 {
		t.Fatalf("after Reserve: Match = %+v, want the one block held before", m)
	}
	for i := 1; i < n; i += 100 {
		end := min(i+100, n)
		for _, ix := range []*Index{grown, reserved} {
			mustApply(t, ix, storedEv(kvevent.Device, int64(hashes[i-1]), tokens[i*testBlockSize:end*testBlockSize], hashes[i:end]...), Snapshot)
		}
		if got := reserved.StorageBytes(); got != before {
			t.Fatalf("after %d blocks the reserved index grew from %d to %d bytes", end, before, got)
		}
	}
	for _, cut := range []int{1, 17, n / 2, n} {
		if g, r := matchOf(grown, keysOf(tokens[:cut*testBlockSize])), matchOf(reserved, keysOf(tokens[:cut*testBlockSize])); g != r || r.DeviceBlocks != cut {
			t.Fatalf("prefix of %d blocks: grown %+v, reserved %+v", cut, g, r)
		}
	}
	if r, g := reserved.Resident(), grown.Resident(); r != n || g != n {
		t.Fatalf("Resident = %d and %d, want %d", r, g, n)
	}
	if err := checkInvariants(reserved); err != nil {
		t.Fatal(err)
	}
	capped := newTestIndex(100)
	capped.Reserve(1 << 20)
	if got, limit := capped.StorageBytes(), capped.Config().MaxStorageBytes(); got > limit {
		t.Fatalf("Reserve past MaxBlocks: %d bytes, over the bound %d", got, limit)
	}
}

// TestResidentLeavesOutGhosts: a removed block stays as a ghost (Len)
// but no longer counts as resident.
func TestResidentLeavesOutGhosts(t *testing.T) {
	ix := newTestIndex(0)
	mustApply(t, ix, storedEv(kvevent.Device, -1, seq(1, 3*testBlockSize), 1, 2, 3), Snapshot)
	mustApply(t, ix, tokenlessEv(kvevent.Host, 3), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 3), Delta)
	mustApply(t, ix, removedEv(kvevent.Device, 2), Delta)
	if got := ix.Resident(); got != 2 {
		t.Fatalf("Resident = %d, want 2 (block 1 on Device, block 3 on Host)", got)
	}
	if ix.Len() != 3 {
		t.Fatalf("Len = %d, want 3 with the ghost", ix.Len())
	}
}
