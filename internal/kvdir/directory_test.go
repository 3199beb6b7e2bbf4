package kvdir

import (
	"context"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// TestLateJoiningSubscriber covers R-REC-1 and R-WIRE-3: an engine that
// already holds blocks is indexed from its snapshot when kvcar subscribes
// late, and live deltas continue from the watermark.
func TestLateJoiningSubscriber(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	prompt := seqTokens(1, 5*testBlock)
	if _, err := e.StoreChain(0, prompt, kvevent.Device); err != nil {
		t.Fatal(err)
	}
	d := newDirectory(t, testLimits(), specOf(e, 0))
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, prompt)

	more := concat(prompt, seqTokens(100, 2*testBlock))
	if _, _, err := e.Prefill(0, more); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, more)
	if m := matchOf(t, d, StreamKey{e.Name(), 0}, more); m.DeviceHitTokens != 7*testBlock {
		t.Fatalf("device hit %d tokens, want %d", m.DeviceHitTokens, 7*testBlock)
	}
}

// TestEmptyEngineThenLive covers an engine that has published nothing: its
// snapshot is the end marker alone and every live message counts from 0.
func TestEmptyEngineThenLive(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	waitSynced(t, d, StreamKey{e.Name(), 0}, 0)
	prompt := seqTokens(1, 3*testBlock)
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	eventually(t, "first live message applied", 5*time.Second, func() (bool, string) {
		m := matchOf(t, d, StreamKey{e.Name(), 0}, prompt)
		return m.DeviceHitTokens == 3*testBlock, describe(m)
	})
	assertMatchesEngine(t, d, e, 0)
}

// TestTieredReplicas covers R-IDX-2 end to end: a Device eviction with
// Host offload leaves the Host copy, announced tokenless, as a host-only
// hit; removing the Host copy leaves nothing.
func TestTieredReplicas(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, HostBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)

	prompt := seqTokens(1, 4*testBlock)
	hashes, err := e.StoreChain(0, prompt, kvevent.Device)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.StoreChain(0, prompt, kvevent.Host); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	m := matchOf(t, d, k, prompt)
	if m.DeviceHitTokens != 16 || m.HostOnlyHitTokens != 0 || m.DeviceBlocks != 4 || m.HostBlocks != 4 {
		t.Fatalf("both tiers: %s", describe(m))
	}
	// Device copy of the last two blocks removed: Host keeps them.
	if err := e.Remove(0, hashes[2:], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	m = matchOf(t, d, k, prompt)
	if m.DeviceHitTokens != 8 || m.HostOnlyHitTokens != 8 || m.ReusablePrefixTokens != 16 {
		t.Fatalf("after Device removal: %s", describe(m))
	}
	assertQueryMatchesOracle(t, d, e, 0, prompt)
	// Host copy of block 1 removed too: block 1 stays on Device only.
	if err := e.Remove(0, hashes[1:2], kvevent.Host); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, prompt)
	assertMatchesEngine(t, d, e, 0)
}

// TestHostOffloadByEviction covers the engine's own offload path: a full
// Device evicts to Host with a tokenless cpu BlockStored then a gpu
// BlockRemoved, and the index follows it exactly.
func TestHostOffloadByEviction(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 6, HostBlocks: 8})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	waitSynced(t, d, StreamKey{e.Name(), 0}, 0)
	prompts := [][]uint32{seqTokens(1, 4*testBlock), seqTokens(1000, 4*testBlock), seqTokens(2000, 4*testBlock)}
	for _, p := range prompts {
		if _, _, err := e.Prefill(0, p); err != nil {
			t.Fatal(err)
		}
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
	for _, p := range prompts {
		assertQueryMatchesOracle(t, d, e, 0, p)
	}
	if dev, host := e.Oracle(0, prompts[0]); host == 0 {
		t.Fatalf("workload did not offload to Host (device=%d host=%d)", dev, host)
	}
}

// TestContiguousPrefixStop covers R-IDX-3: the walk stops at the first
// block held on neither tier, even when later blocks are resident, and a
// trailing partial block never counts.
func TestContiguousPrefixStop(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	prompt := seqTokens(1, 5*testBlock)
	hashes, err := e.StoreChain(0, prompt, kvevent.Device)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(0, hashes[2:3], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	m := matchOf(t, d, k, prompt)
	if m.DeviceHitTokens != 2*testBlock || m.DeviceBlocks != 4 {
		t.Fatalf("hole at block 2: %s", describe(m))
	}
	// Partial last block (R-IDX-3): 2 full blocks + 3 tokens.
	partial := prompt[:2*testBlock+3]
	if m := matchOf(t, d, k, partial); m.DeviceHitTokens != 2*testBlock {
		t.Fatalf("partial block counted: %s", describe(m))
	}
	// A different first block: nothing matches.
	other := concat(seqTokens(500, testBlock), prompt[testBlock:])
	if m := matchOf(t, d, k, other); m.ReusablePrefixTokens != 0 {
		t.Fatalf("diverged prompt hit: %s", describe(m))
	}
	assertQueryMatchesOracle(t, d, e, 0, prompt)
}

// TestDPViewIsolation covers R-IDX-4: two DP ranks of one instance are
// separate streams, and a prefix split across them is never stitched.
func TestDPViewIsolation(t *testing.T) {
	e := startEngine(t, enginesim.Config{DPSize: 2, DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0), specOf(e, 1))
	prompt := seqTokens(1, 4*testBlock)
	if _, err := e.StoreChain(0, prompt[:2*testBlock], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	if _, err := e.StoreChain(1, seqTokens(900, 2*testBlock), kvevent.Device); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	waitCaughtUp(t, d, e, 1)
	ms := d.Query(prompt, nil)
	if len(ms) != 2 || ms[0].DPRank != 0 || ms[1].DPRank != 1 {
		t.Fatalf("matches not one per DP in order: %+v", ms)
	}
	if ms[0].DeviceHitTokens != 2*testBlock || ms[1].ReusablePrefixTokens != 0 {
		t.Fatalf("dp0 %s; dp1 %s", describe(ms[0]), describe(ms[1]))
	}
	assertMatchesEngine(t, d, e, 0)
	assertMatchesEngine(t, d, e, 1)
}

// TestSequenceGapRecovers covers R-REC-1/R-REC-3: a gap invalidates the
// stream at once, a snapshot follows, and the view equals the engine's.
func TestSequenceGapRecovers(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	if _, _, err := e.Prefill(0, seqTokens(1, 3*testBlock)); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	gapsBefore := d.streamOf(k).counters.gaps.Load()
	// The engine skips 5 sequence numbers, then publishes.
	if err := e.SkipSeq(0, 5); err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(50, 2*testBlock)
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	if got := d.streamOf(k).counters.gaps.Load(); got <= gapsBefore {
		t.Fatalf("gap not detected: gaps %d -> %d", gapsBefore, got)
	}
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, prompt)
}

// TestSnapshotLiveMergeDedup covers R-REC-2: with a slow snapshot, live
// deltas published meanwhile are buffered, those covered by the watermark
// dropped, the rest applied, and the merged view published whole.
func TestSnapshotLiveMergeDedup(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 256, SnapshotBatchBlocks: 2, ReplaySlowDelay: 30 * time.Millisecond})
	for i := range 6 {
		if _, _, err := e.Prefill(0, seqTokens(i*1000, 4*testBlock)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.SetReplayMode(0, enginesim.ReplaySlow); err != nil {
		t.Fatal(err)
	}
	// Thirteen replies 30 ms apart take 0.4 s: leave room for a loaded
	// machine under the race detector.
	lim := testLimits()
	lim.ReplayTimeout = 3 * time.Second
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	s := d.streamOf(k)
	eventually(t, "snapshot started", 5*time.Second, func() (bool, string) {
		return s.counters.snapshotsStarted.Load() > 0, describe(matchOf(t, d, k, nil))
	})
	// The live subscription may reach the publisher after the snapshot's
	// request: a change published before it would never reach the stream
	// (ZeroMQ drops what a subscriber it does not know yet would get), and
	// the merge path would go untested.
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	// While the snapshot trickles in, the engine keeps changing.
	for i := range 5 {
		if _, _, err := e.Prefill(0, seqTokens(50000+i*1000, 3*testBlock)); err != nil {
			t.Fatal(err)
		}
		if m := matchOf(t, d, k, nil); m.Synchronized {
			t.Logf("synchronised before delta %d", i)
		}
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
	if s.counters.snapshotsOK.Load() == 0 || s.counters.bufferedBatches.Load() == 0 {
		t.Fatalf("snapshots ok %d, buffered deltas %d: the merge path was not exercised",
			s.counters.snapshotsOK.Load(), s.counters.bufferedBatches.Load())
	}
	t.Logf("buffered %d live deltas, %d covered by the watermark", s.counters.bufferedBatches.Load(), s.counters.coveredBatches.Load())
}

// TestPublisherRestartSamePort covers R-REC-1 on a process restart: the
// engine comes back empty on the same ports with seq from 0; the stream
// drops its view, resubscribes by itself and converges on the new state.
func TestPublisherRestartSamePort(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	old := seqTokens(1, 4*testBlock)
	if _, _, err := e.Prefill(0, old); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	fresh := seqTokens(7000, 2*testBlock)
	eventually(t, "old blocks gone and new blocks indexed", 10*time.Second, func() (bool, string) {
		if _, _, err := e.Prefill(0, fresh); err != nil {
			t.Fatal(err)
		}
		m := matchOf(t, d, k, fresh)
		return m.Synchronized && m.DeviceHitTokens == 2*testBlock, describe(m)
	})
	if m := matchOf(t, d, k, old); m.ReusablePrefixTokens != 0 {
		t.Fatalf("stale hit after restart: %s", describe(m))
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
}

// TestCorruptMessageInvalidatesOnlyItsStream covers R-REC-3 and the
// "loses nothing" rule: corrupt MessagePack on one stream invalidates it
// and triggers recovery; the other stream keeps serving throughout.
func TestCorruptMessageInvalidatesOnlyItsStream(t *testing.T) {
	a := startEngine(t, enginesim.Config{Name: "127.0.0.1:8001", DeviceBlocks: 64})
	b := startEngine(t, enginesim.Config{Name: "127.0.0.1:8002", DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(a, 0), specOf(b, 0))
	prompt := seqTokens(1, 3*testBlock)
	for _, e := range []*enginesim.Engine{a, b} {
		if _, _, err := e.Prefill(0, prompt); err != nil {
			t.Fatal(err)
		}
		waitCaughtUp(t, d, e, 0)
	}
	ka, kb := StreamKey{a.Name(), 0}, StreamKey{b.Name(), 0}
	errsBefore := d.streamOf(ka).counters.decodeErrors.Load()
	for _, bad := range [][]byte{{0x93, 0xcb, 1, 2}, {0xdd, 0xff, 0xff, 0xff, 0xff}, []byte("not msgpack at all")} {
		if err := a.SendRaw(0, bad); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "decode errors counted", 5*time.Second, func() (bool, string) {
		return d.streamOf(ka).counters.decodeErrors.Load() >= errsBefore+1, describe(matchOf(t, d, ka, nil))
	})
	if m := matchOf(t, d, kb, prompt); !m.Synchronized || m.DeviceHitTokens != 3*testBlock {
		t.Fatalf("healthy stream affected: %s", describe(m))
	}
	if _, _, err := a.Prefill(0, seqTokens(300, 2*testBlock)); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, a, 0)
	assertMatchesEngine(t, d, a, 0)
	assertQueryMatchesOracle(t, d, a, 0, prompt)
}

// TestFullStateLiveBatchResyncs covers R-WIRE-4: a live batch of
// AllBlocksCleared plus the full state synchronises a stream whose
// snapshots fail.
func TestFullStateLiveBatchResyncs(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	if err := e.SetReplayMode(0, enginesim.ReplayIgnore); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Prefill(0, seqTokens(1, 4*testBlock)); err != nil {
		t.Fatal(err)
	}
	d := newDirectory(t, testLimits(), specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.WaitSubscribed(ctx, 0, 1); err != nil {
		t.Fatal(err)
	}
	if m := matchOf(t, d, k, nil); m.Synchronized {
		t.Fatalf("synchronised without any snapshot answer: %s", describe(m))
	}
	if err := e.SendFullState(0); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
	if s := d.streamOf(k); s.counters.fullStateSyncs.Load() != 1 || s.counters.snapshotsOK.Load() != 0 {
		t.Fatalf("full-state syncs %d, snapshots ok %d", s.counters.fullStateSyncs.Load(), s.counters.snapshotsOK.Load())
	}
}

// TestSnapshotTimeoutRetries covers R-REC-5: a snapshot that never ends
// leaves the stream unsynchronised with a reason and is retried, and the
// stream synchronises once the engine answers again.
func TestSnapshotTimeoutRetries(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	if _, _, err := e.Prefill(0, seqTokens(1, 4*testBlock)); err != nil {
		t.Fatal(err)
	}
	if err := e.SetReplayMode(0, enginesim.ReplayNeverEnd); err != nil {
		t.Fatal(err)
	}
	lim := testLimits()
	lim.ReplayTimeout = 150 * time.Millisecond
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	s := d.streamOf(k)
	eventually(t, "two failed snapshot attempts", 10*time.Second, func() (bool, string) {
		return s.counters.snapshotsFailed.Load() >= 2, describe(matchOf(t, d, k, nil))
	})
	if m := matchOf(t, d, k, seqTokens(1, 4*testBlock)); m.Synchronized || m.ReusablePrefixTokens != 0 || m.Error == "" {
		t.Fatalf("timed-out stream serves: %s", describe(m))
	}
	if err := e.SetReplayMode(0, enginesim.ReplayNormal); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
}

// TestResyncFindsDroppedTail covers R-REC-4: changes the engine never
// published are found by the periodic calibration snapshot.
func TestResyncFindsDroppedTail(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	lim := testLimits()
	lim.ResyncInterval = 200 * time.Millisecond
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	prompt := seqTokens(1, 3*testBlock)
	hashes, err := e.StoreChain(0, prompt, kvevent.Device)
	if err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	if err := e.SetDropTail(0, true); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(0, hashes[1:], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	eventually(t, "calibration removes the silently dropped blocks", 10*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, prompt)
		return m.Synchronized && m.DeviceHitTokens == testBlock, describe(m)
	})
	assertMatchesEngine(t, d, e, 0)
}

// TestStreamsStatus checks the operator view of a stream against what it
// did: synchronised, counters, last snapshot time and event age.
func TestStreamsStatus(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, testLimits(), specOf(e, 0))
	waitSynced(t, d, StreamKey{e.Name(), 0}, 0)
	if _, _, err := e.Prefill(0, seqTokens(1, 2*testBlock)); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	st := d.Streams()
	if len(st) != 1 {
		t.Fatalf("%d streams", len(st))
	}
	s := st[0]
	if !s.Synchronized || s.InstanceName != e.Name() || s.Endpoint != e.EventEndpoint(0) || s.DeviceBlocks != 2 ||
		s.BatchesApplied != 1 || s.EventsApplied != 1 || s.SnapshotsOK != 1 || s.LastSnapshot <= 0 ||
		s.LastEventAge <= 0 || s.LastEventAge > 10*time.Second {
		t.Fatalf("status %+v", s)
	}
}
