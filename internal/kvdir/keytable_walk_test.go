package kvdir

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvindex"
)

// walkTable returns a table whose first slot holds, on Device and
// published, the keys of a 12-block prompt, and whose second holds extra
// random keys, so that the cells span several stripes.
func walkTable(t *testing.T, extra int) (tab *keyTable, prompt []uint32, keys []kvindex.Key, other int) {
	t.Helper()
	prompt = make([]uint32, 12*modelBlock)
	for i := range prompt {
		prompt[i] = uint32(i*31 + 7)
	}
	keys = kvindex.KeysFor(prompt, modelBlock, 1024, nil)
	tab = newKeyTable(modelBlock, 1024)
	slot := tab.allocSlot()
	changes := make([]keyChange, len(keys))
	for i, k := range keys {
		changes[i] = keyChange{k: k, dev: true}
	}
	tab.apply(slot, changes)
	tab.setPublished(slot, true)
	other = tab.allocSlot()
	rng := rand.New(rand.NewPCG(5, 6))
	changes = changes[:0]
	for range extra {
		changes = append(changes, keyChange{k: kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}, host: true})
	}
	tab.apply(other, changes)
	tab.setPublished(other, true)
	return tab, prompt, keys, other
}

// walkChecked walks tab's current view without its lock and fails the
// test unless the walk completes with the whole prompt for slot 0. It
// returns the view and the write count the walk began at.
func walkChecked(t *testing.T, tab *keyTable, prompt []uint32, wr *walkResult) (*tableView, uint64) {
	t.Helper()
	w := tab.writes.Load()
	v := tab.view.Load()
	if !tab.walkView(v, prompt, wr, true) {
		t.Fatal("a walk with no writer about gave up")
	}
	if blocks, hostOnly, ok := wr.resultOf(0); !ok || blocks != len(prompt)/modelBlock || hostOnly != 0 {
		t.Fatalf("slot 0 matched %d blocks (%d host-only, published %v), want %d", blocks, hostOnly, ok, len(prompt)/modelBlock)
	}
	if !tab.held(v, w, wr) {
		t.Fatal("the walk's check failed with no writer about")
	}
	return v, w
}

// TestWalkCheckSeesEveryWrite: a walk without the table's lock keeps its
// answer only if nothing it read changed before its check. A change to
// a key it read, a change of the published slots and a cell array
// rebuilt must each fail the check; a change only in stripes it did not
// read must not (R-REC-2: an answer is of one moment of the table).
func TestWalkCheckSeesEveryWrite(t *testing.T) {
	tab, prompt, keys, other := walkTable(t, 3000)
	// As a walk under way does, so that the writes below are shared.
	tab.walkers.Add(1)
	defer tab.walkers.Add(-1)
	if len(tab.stamps) < 8 {
		t.Fatalf("%d stripes for %d cells: too few to tell them apart", len(tab.stamps), len(tab.cells))
	}
	var wr walkResult

	// A change to the prompt's last key, in its stripe.
	v, w := walkChecked(t, tab, prompt, &wr)
	tab.apply(0, []keyChange{{k: keys[len(keys)-1], dev: true, host: true}})
	if tab.held(v, w, &wr) {
		t.Fatal("the check missed a change to a key the walk read")
	}

	// A key added in a stripe the walk did not read.
	v, w = walkChecked(t, tab, prompt, &wr)
	read := make(map[uint32]bool)
	for _, s := range wr.reads {
		read[s] = true
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var far kvindex.Key
	for {
		far = kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
		i, held := tab.lookup(far)
		if !held && !read[uint32(i>>stripeShift)] {
			break
		}
	}
	tab.apply(other, []keyChange{{k: far, dev: true}})
	if tab.writes.Load() == w {
		t.Fatal("a write left the write count where it was")
	}
	if !tab.held(v, w, &wr) {
		t.Fatal("a change in a stripe the walk did not read failed its check")
	}

	// The published slots change.
	v, w = walkChecked(t, tab, prompt, &wr)
	tab.setPublished(other, false)
	if tab.held(v, w, &wr) {
		t.Fatal("the check missed a slot unpublished")
	}

	// The cells rebuilt larger.
	v, w = walkChecked(t, tab, prompt, &wr)
	tab.reserve(4 * len(tab.cells))
	if tab.held(v, w, &wr) {
		t.Fatal("the check missed the cells rebuilt")
	}
}

// TestWalkBegunDuringAWrite: a walk that begins while a writer is in
// the middle of changing a stripe it reads must fail its check even if
// the write count has not moved by its end; one that only shares the
// time of a write elsewhere must not.
func TestWalkBegunDuringAWrite(t *testing.T) {
	tab, prompt, keys, _ := walkTable(t, 3000)
	var wr walkResult
	i, held := tab.lookup(keys[0])
	if !held {
		t.Fatal("the prompt's first key is not in the table")
	}
	// Under way: the count odd, the first key's stripe stamped.
	tab.walkers.Add(1)
	defer tab.walkers.Add(-1)
	tab.mu.Lock()
	tab.beginWrite()
	tab.touch(i)
	w := tab.writes.Load()
	v := tab.view.Load()
	walked := tab.walkView(v, prompt, &wr, true)
	ok := tab.held(v, w, &wr)
	tab.endWrite()
	tab.mu.Unlock()
	if !walked || ok {
		t.Fatalf("a walk begun during a write to its stripe: walked %v, kept %v", walked, ok)
	}

	// Under way elsewhere: a stripe no key of the prompt is in.
	read := make(map[uint32]bool)
	for _, s := range wr.reads {
		read[s] = true
	}
	far := -1
	for s := range tab.stamps {
		if !read[uint32(s)] {
			far = s << stripeShift
			break
		}
	}
	tab.mu.Lock()
	tab.beginWrite()
	tab.touch(far)
	w = tab.writes.Load()
	walked = tab.walkView(v, prompt, &wr, true)
	ok = tab.held(v, w, &wr)
	tab.endWrite()
	tab.mu.Unlock()
	if !walked || !ok {
		t.Fatalf("a walk begun during a write elsewhere: walked %v, kept %v", walked, ok)
	}
	walkChecked(t, tab, prompt, &wr)
}

// TestWriteWithoutWalkersIsPlain: a write that finds no walk under way
// writes with plain stores and stamps nothing, and a walk that starts
// meanwhile must not read the cells without the lock: it waits for the
// write and walks holding the lock. A write that finds a walk under way
// stamps the stripes it changes.
func TestWriteWithoutWalkersIsPlain(t *testing.T) {
	tab, prompt, keys, _ := walkTable(t, 3000)
	i, held := tab.lookup(keys[0])
	if !held {
		t.Fatal("the prompt's first key is not in the table")
	}
	s := i >> stripeShift
	locked0 := tab.lockedWalks.Load()
	tab.mu.Lock()
	tab.beginWrite()
	if tab.shared || !tab.plain.Load() {
		tab.endWrite()
		tab.mu.Unlock()
		t.Fatalf("a write with no walk under way: shared %v, plain %v", tab.shared, tab.plain.Load())
	}
	tab.touch(i)
	stamped := tab.stamps[s] != 0
	done := make(chan int)
	go func() {
		var wr walkResult
		tab.walk(prompt, &wr)
		blocks, _, _ := wr.resultOf(0)
		done <- blocks
	}()
	select {
	case blocks := <-done:
		t.Errorf("a walk answered %d blocks in the middle of a plain write", blocks)
	case <-time.After(50 * time.Millisecond):
	}
	tab.endWrite()
	tab.mu.Unlock()
	if blocks := <-done; blocks != len(keys) {
		t.Fatalf("the walk that waited matched %d blocks, want %d", blocks, len(keys))
	}
	if stamped || tab.lockedWalks.Load() != locked0+1 || tab.plain.Load() {
		t.Fatalf("plain write: stamped %v, %d walks under the lock (want 1), plain left %v", stamped, tab.lockedWalks.Load()-locked0, tab.plain.Load())
	}

	tab.walkers.Add(1)
	tab.mu.Lock()
	tab.beginWrite()
	shared, plain := tab.shared, tab.plain.Load()
	tab.touch(i)
	w := tab.writes.Load()
	tab.endWrite()
	tab.mu.Unlock()
	tab.walkers.Add(-1)
	if !shared || plain || tab.stamps[s] != w {
		t.Fatalf("a write with a walk under way: shared %v, plain %v, stamp %d (want %d)", shared, plain, tab.stamps[s], w)
	}
}

// TestWalkSurvivesTornReads gives a walk cells that only a read torn by
// writers could show it: holders naming a dense entry beyond the pool,
// an inline slot beyond the bitsets, a probe run with no empty cell. The
// walk must give up, neither panic nor loop nor answer.
func TestWalkSurvivesTornReads(t *testing.T) {
	prompt := make([]uint32, 4*modelBlock)
	for i := range prompt {
		prompt[i] = uint32(i + 11)
	}
	keys := kvindex.KeysFor(prompt, modelBlock, 1024, nil)
	tab := newKeyTable(modelBlock, 1024)
	newView := func() *tableView {
		return &tableView{cells: make([]cell, minCells), stamps: make([]uint64, minCells/stripeCells), words: 1, published: []uint64{1}}
	}
	put := func(v *tableView, k kvindex.Key, h uint32) {
		v.cells[emptyFrom(v.cells, homeOf(k, len(v.cells)))] = cell{hi: k.Hi, tagHold: uint64(tagOf(k))<<32 | uint64(h)}
	}
	slot0 := uint32(entryPresent | tierDev<<tierShift)

	full := newView()
	for i := range full.cells {
		full.cells[i] = cell{hi: 1, tagHold: uint64(tagOf(keys[0])^1)<<32 | uint64(slot0)}
	}
	denseBeyond := newView()
	put(denseBeyond, keys[0], slot0)
	put(denseBeyond, keys[1], holdDense|pageRecords*3+5)
	slotBeyond := newView()
	put(slotBeyond, keys[0], slot0)
	put(slotBeyond, keys[1], entryPresent|tierDev<<tierShift|200)

	for name, v := range map[string]*tableView{"full": full, "dense entry beyond the pool": denseBeyond, "slot beyond the bitsets": slotBeyond} {
		var wr walkResult
		if tab.walkView(v, prompt, &wr, true) {
			blocks, _, _ := wr.resultOf(0)
			t.Errorf("%s: the walk answered %d blocks", name, blocks)
		}
	}

	// The same views, whole: the walk answers.
	good := newView()
	for _, k := range keys {
		put(good, k, slot0)
	}
	var wr walkResult
	if !tab.walkView(good, prompt, &wr, true) {
		t.Fatal("a consistent view was given up on")
	}
	if blocks, _, ok := wr.resultOf(0); !ok || blocks != len(keys) {
		t.Fatalf("a consistent view answered %d blocks, want %d", blocks, len(keys))
	}
}

// TestWalkWithoutLockUnderWrites queries a slot whose keys never change
// while a writer adds and drops other keys as fast as it can: every
// answer must be exact (R-DIR-4), and most walks must complete without
// the table's lock, which the writer holds for most of its time. Run it
// under -race: the walks read the cells while the writer writes them.
func TestWalkWithoutLockUnderWrites(t *testing.T) {
	tab, prompt, _, other := walkTable(t, 20000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var changes int
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(9, 10))
		live := make([]kvindex.Key, 0, 4096)
		batch := make([]keyChange, 0, keyBatch)
		for {
			select {
			case <-stop:
				return
			default:
			}
			batch = batch[:0]
			for range keyBatch / 2 {
				k := kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
				live = append(live, k)
				batch = append(batch, keyChange{k: k, dev: true})
			}
			for len(live) > 2048 && len(batch) < keyBatch {
				j := rng.IntN(len(live))
				batch = append(batch, keyChange{k: live[j]})
				live[j] = live[len(live)-1]
				live = live[:len(live)-1]
			}
			tab.apply(other, batch)
			changes += len(batch)
		}
	}()
	var wr walkResult
	want := len(prompt) / modelBlock
	locked0 := tab.lockedWalks.Load()
	queries := 0
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline) || queries < 1000; queries++ {
		tab.walk(prompt, &wr)
		if blocks, hostOnly, ok := wr.resultOf(0); !ok || blocks != want || hostOnly != 0 {
			close(stop)
			wg.Wait()
			t.Fatalf("query %d: slot 0 matched %d blocks (%d host-only, published %v), want %d", queries, blocks, hostOnly, ok, want)
		}
	}
	close(stop)
	wg.Wait()
	locked := int(tab.lockedWalks.Load() - locked0)
	t.Logf("%d queries, %d of them under the lock, while the writer made %d changes", queries, locked, changes)
	if changes == 0 || 2*locked > queries {
		t.Fatalf("%d of %d walks took the lock while the writer made %d changes", locked, queries, changes)
	}
	if !slices.ContainsFunc(tab.stamps, func(s uint64) bool { return s > 0 }) {
		t.Fatal("the writer stamped no stripe")
	}
}

// TestWalkNeverOverReportsUnderWrites: a slot's prompt is cut at a random
// block and stored whole again, over and over, while other keys come and
// go and the cells grow. Each prompt key is held by three slots while the
// cut one holds it and by two when it does not, so its record moves
// between a dense entry and the cell's inline holders; the other keys are
// held by three other slots, so the dense entries the prompt's keys free
// are taken by them, and their number swings, so that the cells are
// rebuilt and compacted. Every walk's answer for the cut slot must lie
// between the least and the most it held over the walk's life (the
// writes under way at its ends included), and the slots that hold none
// of the prompt must match none of it. A walk that kept an answer from a
// torn read could report a block whose removal had ended before it began,
// or another key's holders (the never-over-report rule, R-REC-2).
func TestWalkNeverOverReportsUnderWrites(t *testing.T) {
	tab, prompt, keys, _ := walkTable(t, 2000)
	whole := make([]keyChange, len(keys))
	for i, k := range keys {
		whole[i] = keyChange{k: k, dev: true}
	}
	stable, cut := tab.allocSlot(), tab.allocSlot()
	for _, s := range []int{stable, cut} {
		tab.apply(s, whole)
		tab.setPublished(s, true)
	}
	var others [3]int
	for i := range others {
		others[i] = tab.allocSlot()
		tab.setPublished(others[i], true)
	}

	// held[s] is the cut slot's prefix once write s has ended, -1 for a
	// write not yet begun; the writer stores it before the write begins,
	// and moves seq to s once it has ended.
	const writes = 1 << 16
	var (
		held [writes + 2]atomic.Int32
		seq  atomic.Int64
	)
	for i := range held {
		held[i].Store(-1)
	}
	held[0].Store(int32(len(keys)))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(11, 12))
		live := make([]kvindex.Key, 0, 1<<14)
		churn := make([]keyChange, 0, keyBatch)
		growing := true
		for s := int64(1); s+1 < writes; s += 2 {
			select {
			case <-stop:
				return
			default:
			}
			j := rng.IntN(len(keys))
			gone := slices.Clone(whole[j:])
			for i := range gone {
				gone[i].dev = false
			}
			held[s].Store(int32(j))
			tab.apply(cut, gone)
			seq.Store(s)
			// The other keys grow to 4,096 and fall to 256, again and
			// again, so that the cells are rebuilt larger, dense pages
			// added and the table compacted while walks go on.
			churn = churn[:0]
			switch {
			case len(live) >= 1<<12:
				growing = false
			case len(live) <= 1<<8:
				growing = true
			}
			for growing && len(churn) < keyBatch {
				k := kvindex.Key{Hi: rng.Uint64(), Lo: rng.Uint64()}
				live = append(live, k)
				churn = append(churn, keyChange{k: k, host: true})
			}
			for !growing && len(churn) < keyBatch {
				i := rng.IntN(len(live))
				churn = append(churn, keyChange{k: live[i]})
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			}
			for _, o := range others {
				tab.apply(o, churn)
			}
			held[s+1].Store(int32(len(keys)))
			tab.apply(cut, whole[j:])
			seq.Store(s + 1)
		}
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		close(stop)
		wg.Wait()
		t.Fatalf(format, args...)
	}
	var wr walkResult
	queries, across := 0, 0
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline) || queries < 2000; queries++ {
		s0 := seq.Load()
		tab.walk(prompt, &wr)
		s1 := seq.Load()
		if s1+1 >= writes {
			break
		}
		lo, hi := held[s0].Load(), held[s0].Load()
		for s := s0 + 1; s <= s1+1; s++ {
			if v := held[s].Load(); v >= 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		if blocks, _, ok := wr.resultOf(cut); !ok || int32(blocks) < lo || int32(blocks) > hi {
			fail("walk %d over writes %d-%d: the cut slot matched %d blocks (published %v), held %d-%d meanwhile", queries, s0, s1+1, blocks, ok, lo, hi)
		}
		for _, s := range []int{0, stable} {
			if blocks, hostOnly, ok := wr.resultOf(s); !ok || blocks != len(keys) || hostOnly != 0 {
				fail("walk %d: stable slot %d matched %d blocks (%d host-only, published %v), want %d", queries, s, blocks, hostOnly, ok, len(keys))
			}
		}
		for _, s := range others {
			if blocks, _, _ := wr.resultOf(s); blocks != 0 {
				fail("walk %d: slot %d, which holds none of the prompt, matched %d blocks", queries, s, blocks)
			}
		}
		if s1 > s0 {
			across++
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d walks, %d of them across a write's end; %d writes, %d walks under the lock", queries, across, seq.Load(), tab.lockedWalks.Load())
	if seq.Load() < 100 || across == 0 {
		t.Fatalf("the writer ended only %d writes, %d during a walk", seq.Load(), across)
	}
}
