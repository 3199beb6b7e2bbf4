package kvdir

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// waitReason waits until stream k is unsynchronised with a reason that
// contains want, and checks that it serves no hits meanwhile (R-REC-1).
func waitReason(t *testing.T, d *Directory, k StreamKey, want string, probe []uint32) {
	t.Helper()
	eventually(t, "unsynchronised because of "+want, 10*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, probe)
		if !m.Synchronized && m.ReusablePrefixTokens != 0 {
			t.Fatalf("unsynchronised stream serves hits: %s", describe(m))
		}
		return !m.Synchronized && strings.Contains(m.Error, want), describe(m)
	})
}

// caughtUpStream starts an engine and a directory with one stream, has
// the engine store a prompt, and returns once the stream applied it,
// with the stream's count of successful snapshots at that point.
func caughtUpStream(t *testing.T, lim Limits) (*enginesim.Engine, *Directory, StreamKey, []uint32, *stream, uint64) {
	t.Helper()
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	prompt := seqTokens(1, 3*testBlock)
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	s := d.streamOf(k)
	return e, d, k, prompt, s, s.counters.snapshotsOK.Load()
}

// TestMessageLimit covers R-REC-3 and R-CFG-2 max_message_bytes: an
// oversize live message is refused without being allocated (libzmq drops
// the link), the stream recovers by snapshot, and nothing is lost.
func TestMessageLimit(t *testing.T) {
	lim := testLimits()
	lim.MaxMessageBytes = 16 << 10
	e, d, k, prompt, s, okBefore := caughtUpStream(t, lim)
	if err := e.SendOversize(0, 64<<10); err != nil {
		t.Fatal(err)
	}
	eventually(t, "recovery snapshot after the oversize message", 10*time.Second, func() (bool, string) {
		if _, _, err := e.Prefill(0, prompt); err != nil {
			t.Fatal(err)
		}
		m := matchOf(t, d, k, nil)
		return s.counters.snapshotsOK.Load() > okBefore && m.Synchronized && m.Sequence+1 == e.Seq(0), describe(m)
	})
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, prompt)
}

// TestBufferLimit covers R-REC-2 max_buffered_bytes: live deltas beyond
// the budget during a snapshot abandon it with a clear reason, and a
// later attempt succeeds once the burst is over.
func TestBufferLimit(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 512, ReplaySlowDelay: 200 * time.Millisecond})
	if _, _, err := e.Prefill(0, seqTokens(1, 4*testBlock)); err != nil {
		t.Fatal(err)
	}
	if err := e.SetReplayMode(0, enginesim.ReplaySlow); err != nil {
		t.Fatal(err)
	}
	lim := testLimits()
	lim.MaxBufferedBytes = 2 << 10
	lim.ReplayTimeout = 2 * time.Second
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	s := d.streamOf(k)
	eventually(t, "snapshot started", 5*time.Second, func() (bool, string) {
		return s.counters.snapshotsStarted.Load() > 0, describe(matchOf(t, d, k, nil))
	})
	for i := 0; !strings.Contains(matchOf(t, d, k, nil).Error, "max_buffered_bytes"); i++ {
		if i == 500 {
			t.Fatalf("buffer limit never hit: %s", describe(matchOf(t, d, k, nil)))
		}
		if _, _, err := e.Prefill(0, seqTokens(10_000+i*100, 4*testBlock)); err != nil {
			t.Fatal(err)
		}
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
}

// TestBlockLimit covers R-CFG-2 max_blocks_per_stream: an engine holding
// more blocks than allowed leaves the stream unsynchronised naming the
// key, and it synchronises again once the engine is back under the bound.
func TestBlockLimit(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
	lim := testLimits()
	lim.MaxBlocksPerStream = 8
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	prompt := seqTokens(1, 12*testBlock)
	hashes, err := e.StoreChain(0, prompt, kvevent.Device)
	if err != nil {
		t.Fatal(err)
	}
	waitReason(t, d, k, "max_blocks_per_stream (8)", prompt)
	// The snapshot retries also exceed the bound until the engine evicts.
	if err := e.Remove(0, hashes[6:], kvevent.Device); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, prompt)
}

// TestUnknownParentInDelta covers R-IDX-5: a live BlockStored whose
// parent the stream never saw triggers a snapshot recovery.
func TestUnknownParentInDelta(t *testing.T) {
	e, d, k, _, s, okBefore := caughtUpStream(t, testLimits())
	if err := e.SendUnknownParent(0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "recovered by snapshot", 10*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, nil)
		return s.counters.snapshotsOK.Load() > okBefore && m.Synchronized, describe(m)
	})
	waitCaughtUp(t, d, e, 0)
	assertMatchesEngine(t, d, e, 0)
}

// TestWrongRankAndBlockSize covers R-CFG-4: a batch claiming another DP
// rank, or a BlockStored of another block size, invalidates the stream
// with a reason saying so, and snapshots keep failing until the engine is
// consistent again.
func TestWrongRankAndBlockSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    func(e *enginesim.Engine, on bool) error
		reason string
	}{
		{"dp_rank", func(e *enginesim.Engine, on bool) error { return e.SetWrongDPRank(0, on) }, "dp_rank"},
		{"block_size", func(e *enginesim.Engine, on bool) error { return e.SetWrongBlockSize(0, on) }, "block size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEngine(t, enginesim.Config{DeviceBlocks: 64})
			d := newDirectory(t, testLimits(), specOf(e, 0))
			k := StreamKey{e.Name(), 0}
			prompt := seqTokens(1, 3*testBlock)
			if _, _, err := e.Prefill(0, prompt); err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, d, e, 0)
			if err := tc.set(e, true); err != nil {
				t.Fatal(err)
			}
			if _, _, err := e.Prefill(0, seqTokens(500, 2*testBlock)); err != nil {
				t.Fatal(err)
			}
			waitReason(t, d, k, tc.reason, prompt)
			if err := tc.set(e, false); err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, d, e, 0)
			assertMatchesEngine(t, d, e, 0)
		})
	}
}

// TestSnapshotMissingBatchRepairedByCalibration covers a snapshot that
// silently loses a middle batch (a ROUTER past its send HWM): every batch
// carries the same watermark, so the loss cannot be seen at once. The
// view then under-reports (never a stale hit) and the periodic
// calibration (R-REC-4) makes it equal to the engine's state.
func TestSnapshotMissingBatchRepairedByCalibration(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 256, SnapshotBatchBlocks: 2})
	var prompts [][]uint32
	for i := range 6 {
		p := seqTokens(i*1000, 3*testBlock)
		prompts = append(prompts, p)
		if _, _, err := e.Prefill(0, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.SetReplayMode(0, enginesim.ReplayGapInMiddle); err != nil {
		t.Fatal(err)
	}
	lim := testLimits()
	lim.ResyncInterval = 300 * time.Millisecond
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	waitSynced(t, d, k, 0)
	short := false
	for _, p := range prompts {
		dev, host := e.Oracle(0, p)
		m := matchOf(t, d, k, p)
		if m.DeviceHitTokens > dev || m.HostOnlyHitTokens > host {
			t.Fatalf("stale hit: directory %s, engine device=%d host=%d", describe(m), dev, host)
		}
		short = short || m.DeviceHitTokens < dev
	}
	if !short {
		t.Fatal("the incomplete snapshot was not incomplete")
	}
	if err := e.SetReplayMode(0, enginesim.ReplayNormal); err != nil {
		t.Fatal(err)
	}
	eventually(t, "calibration restores the missing blocks", 10*time.Second, func() (bool, string) {
		for _, p := range prompts {
			dev, _ := e.Oracle(0, p)
			if m := matchOf(t, d, k, p); m.DeviceHitTokens != dev {
				return false, describe(m)
			}
		}
		return true, ""
	})
	assertMatchesEngine(t, d, e, 0)
}

// TestSlowSubscriberFlood_RREC3: a stream that falls behind a flood loses
// nothing silently. While its goroutine is held up (a reader holds the
// stream's lock, as a stalled process would), libzmq queues only the
// receive HWM derived from the byte limits, TCP pushes back, and the
// engine's publisher drops past its own send HWM. Once free, the stream
// sees the gap, leaves the synchronised state, resynchronises, and its
// view equals the engine's state block for block. A stall longer than
// the ZMTP heartbeat timeout (3 s, possible on a loaded machine) loses
// the link instead, which is detected and repaired the same way.
func TestSlowSubscriberFlood_RREC3(t *testing.T) {
	const chainBlocks = 16384
	e := startEngine(t, enginesim.Config{DeviceBlocks: chainBlocks, SendHWM: 4, ReplaySendHWM: enginesim.DefaultSendHWM})
	lim := testLimits()
	lim.MaxBlocksPerStream = 4 * chainBlocks
	lim.MaxMessageBytes, lim.MaxBufferedBytes = 2<<20, 8<<20
	lim.ReplayTimeout = 5 * time.Second
	if hwm := lim.receiveHWM(); hwm != 4 {
		t.Fatalf("receive HWM %d for %d/%d bytes, want 4", hwm, lim.MaxBufferedBytes, lim.MaxMessageBytes)
	}
	d := newDirectory(t, lim, specOf(e, 0))
	k := StreamKey{e.Name(), 0}
	if _, _, err := e.Prefill(0, seqTokens(1, 8*testBlock)); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, d, e, 0)
	s := d.streamOf(k)
	gapsBefore, okBefore := s.counters.gaps.Load(), s.counters.snapshotsOK.Load()
	lostBefore := s.counters.disconnects.Load()

	// Each chain replaces the whole Device cache: about 1.3 MB of stores
	// and removals per message, 130 MB in all, more than the kernel's
	// socket buffers hold.
	rng := rand.New(rand.NewPCG(1, 2))
	s.mu.RLock()
	held := true
	release := func() {
		if held {
			held = false
			s.mu.RUnlock()
		}
	}
	defer release()
	began := time.Now()
	const messages = 100
	for i := range messages {
		tokens := make([]uint32, chainBlocks*testBlock)
		for j := range tokens {
			tokens[j] = 1<<16 + rng.Uint32N(1<<20)
		}
		if _, err := e.StoreChain(0, tokens, kvevent.Device); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	flood := time.Since(began)
	release()

	// The flood's tail may be what was dropped, and the publisher drops
	// until it takes in that its subscriber's queue has room again; the
	// engine's next messages show the gap (a dropped tail with nothing
	// after it is what calibration is for, TestResyncFindsDroppedTail).
	next := 0
	eventually(t, "gap or lost link seen after the flood", 20*time.Second, func() (bool, string) {
		next++
		if _, _, err := e.Prefill(0, seqTokens(next*testBlock, testBlock)); err != nil {
			t.Fatal(err)
		}
		return s.counters.gaps.Load() > gapsBefore || s.counters.disconnects.Load() > lostBefore, describe(matchOf(t, d, k, nil))
	})
	eventually(t, "resynchronised after the flood", 20*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, nil)
		return s.counters.snapshotsOK.Load() > okBefore && m.Synchronized && m.Sequence+1 == e.Seq(0), describe(m)
	})
	assertMatchesEngine(t, d, e, 0)
	t.Logf("%d messages published in %v, %d gaps and %d lost links seen, %d snapshots", messages, flood,
		s.counters.gaps.Load()-gapsBefore, s.counters.disconnects.Load()-lostBefore, s.counters.snapshotsOK.Load()-okBefore)
}
