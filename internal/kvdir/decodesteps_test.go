package kvdir

import (
	"testing"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// TestDecodeStepBatches covers live batches of many one-block events,
// the shape of an engine's decode step (each running request that filled
// a block adds a BlockStored of it alone), with removals among them once
// the cache is full. kvcar applies such a batch in runs of events under
// one hold of the stream lock and writes the additions to the shared key
// table when the batch ends; after every batch the stream mirrors the
// engine, every request's prompt is answered as the engine's oracle
// answers it, and no snapshot was needed (R-WIRE-1, R-IDX-3, R-DIR-1).
func TestDecodeStepBatches(t *testing.T) {
	const requests, steps = 80, 8
	// Room for about six steps: the last ones evict the least recently
	// used blocks, whose requests then recompute their prompts whole.
	e := startEngine(t, enginesim.Config{DeviceBlocks: 6 * requests})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	s := d.streamOf(k)
	snapshots := s.counters.snapshotsOK.Load()
	prompts := make([][]uint32, requests)
	sawRemovals := false
	for step := range steps {
		for r := range prompts {
			prompts[r] = append(prompts[r], seqTokens(1+r*1000+step*testBlock, testBlock)...)
		}
		events := s.counters.eventsApplied.Load()
		removals := s.counters.eventsByKind[kvevent.BlockRemoved].Load()
		if err := e.PrefillBatch(0, prompts); err != nil {
			t.Fatal(err)
		}
		waitCaughtUp(t, d, e, 0)
		assertMatchesEngine(t, d, e, 0)
		for _, p := range prompts {
			assertQueryMatchesOracle(t, d, e, 0, p)
		}
		n := s.counters.eventsApplied.Load() - events
		if dev := matchOf(t, d, k, nil).DeviceBlocks; (step+1)*requests <= 6*requests {
			// Before the cache fills, each request adds one event of one
			// block: the decode step's shape.
			if n != requests || dev != (step+1)*requests {
				t.Fatalf("step %d: %d events applied and %d blocks held, want %d and %d", step, n, dev, requests, (step+1)*requests)
			}
		} else if n < requests {
			t.Fatalf("step %d: %d events applied, want at least one a request (%d)", step, n, requests)
		}
		sawRemovals = sawRemovals || s.counters.eventsByKind[kvevent.BlockRemoved].Load() > removals
	}
	if !sawRemovals {
		t.Fatal("no step evicted: the cache never filled")
	}
	if got := s.counters.snapshotsOK.Load(); got != snapshots {
		t.Fatalf("%d snapshots during the steps: the live batches were not applied as such", got-snapshots)
	}
}
