package kvdir

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
)

// deltaBatch is a one-block root BlockStored with hash h.
func deltaBatch(h kvevent.EngineHash, first uint32) *kvevent.Batch {
	b := &kvevent.Batch{}
	b.AddStored([]kvevent.EngineHash{h}, kvevent.EngineHash{}, false, seqTokens(int(first), testBlock), testBlock, kvevent.Device)
	return b
}

func mergeSyncer(t *testing.T, watermark uint64, seqs ...uint64) *syncer {
	t.Helper()
	s := newStream(StreamSpec{InstanceName: "a", BlockSize: testBlock, HashSeed: 1024})
	y := &syncer{s: s, lim: testLimits(), log: testLogger(), lastReason: "x"}
	y.snap = &snapshot{
		idx:           kvindex.New(kvindex.Config{BlockSize: testBlock, HashSeed: 1024, MaxBlocks: 64}),
		haveWatermark: true,
		watermark:     watermark,
	}
	for _, q := range seqs {
		y.snap.buffered = append(y.snap.buffered, bufferedBatch{seq: q, batch: deltaBatch(kvevent.IntHash(q), uint32(q*100))})
	}
	return y
}

// TestMergeDropsCoveredDeltas covers R-REC-2's dedup rule on the merge
// itself: deltas at or below the watermark are dropped, the rest applied
// in order, and the stream expects the sequence after the last one.
func TestMergeDropsCoveredDeltas(t *testing.T) {
	y := mergeSyncer(t, 10, 9, 10, 11, 12)
	idx := y.snap.idx
	y.finishSnapshot()
	if y.snap != nil {
		t.Fatal("snapshot still in progress after its end marker")
	}
	synced, seq, reason := y.s.status()
	if !synced || seq != 12 || y.expected != 13 {
		t.Fatalf("synced=%v seq=%d expected=%d reason=%q", synced, seq, y.expected, reason)
	}
	if y.s.counters.coveredBatches.Load() != 2 {
		t.Fatalf("covered %d deltas, want 2", y.s.counters.coveredBatches.Load())
	}
	var held []kvevent.EngineHash
	idx.ForEach(func(h kvevent.EngineHash, _ kvindex.Key, dev, _ bool) {
		if dev {
			held = append(held, h)
		}
	})
	if len(held) != 2 {
		t.Fatalf("index holds %v, want the blocks of seq 11 and 12 only", held)
	}
	// Live messages still queued at or below the watermark are
	// duplicates, not a sequence regression.
	if !y.dedupActive || y.dedupUpTo != 12 {
		t.Fatalf("dedup active=%v up to %d", y.dedupActive, y.dedupUpTo)
	}
}

// TestMergeRejectsHoleAfterWatermark covers R-REC-2/3: a delta missing
// between the watermark and the buffered ones fails the snapshot instead
// of publishing a view with a hole.
func TestMergeRejectsHoleAfterWatermark(t *testing.T) {
	y := mergeSyncer(t, 10, 11, 13)
	y.finishSnapshot()
	synced, _, reason := y.s.status()
	if synced || !strings.Contains(reason, "expected 12, got 13") {
		t.Fatalf("synced=%v reason=%q", synced, reason)
	}
	if y.retryAt.IsZero() {
		t.Fatal("no retry scheduled")
	}
}

// TestSnapshotUnderFlood covers R-REC-2 under load: the engine publishes
// continuously while the stream takes its first snapshot, so live deltas
// straddle the watermark; the published view still equals the engine's.
func TestSnapshotUnderFlood(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 512, SnapshotBatchBlocks: 8})
	for i := range 50 {
		if _, _, err := e.Prefill(0, seqTokens(i*1000, 4*testBlock)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := e.Prefill(0, seqTokens(100_000+i*100, 3*testBlock)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	eventually(t, "synchronised during the flood", 10*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, nil)
		return m.Synchronized, describe(m)
	})
	close(stop)
	wg.Wait()
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
	c := &d.streamOf(k).counters
	t.Logf("buffered %d, covered %d, duplicates %d, gaps %d, snapshots %d ok / %d failed",
		c.bufferedBatches.Load(), c.coveredBatches.Load(), c.duplicates.Load(), c.gaps.Load(),
		c.snapshotsOK.Load(), c.snapshotsFailed.Load())
}

// TestEmptySnapshotExpectsSequenceZero covers the empty-snapshot rule: a
// snapshot without a watermark means the engine has published nothing,
// so the first live message must be sequence 0 — one lost before the
// subscription took effect is a gap, not silently accepted. An engine
// that keeps breaking the rule is tolerated after a few resyncs.
func TestEmptySnapshotExpectsSequenceZero(t *testing.T) {
	y := mergeSyncer(t, 0, 3, 4)
	y.snap.haveWatermark = false
	for attempt := 1; attempt <= emptySnapshotTolerance; attempt++ {
		y.finishSnapshot()
		if synced, _, reason := y.s.status(); synced || !strings.Contains(reason, "expected 0, got 3") {
			t.Fatalf("attempt %d: synced=%v reason=%q", attempt, synced, reason)
		}
		if y.emptyGaps != attempt {
			t.Fatalf("attempt %d: emptyGaps = %d", attempt, y.emptyGaps)
		}
		// The next attempt brings the same answer.
		y.snap = mergeSyncer(t, 0, 3, 4).snap
		y.snap.haveWatermark = false
	}
	y.finishSnapshot()
	if synced, seq, reason := y.s.status(); !synced || seq != 4 || y.expected != 5 {
		t.Fatalf("after tolerance: synced=%v seq=%d expected=%d reason=%q", synced, seq, y.expected, reason)
	}
	if y.emptyGaps != 0 {
		t.Fatalf("emptyGaps not reset by a live message: %d", y.emptyGaps)
	}
}
