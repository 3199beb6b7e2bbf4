package kvdir

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
)

// The tests of this file cover the history and live sync modes over real
// TCP against the engine emulator answering replays with its buffered
// history (as vLLM and SGLang do) or binding no replay endpoint at all
// (their default). The invariant under test in every one: the directory
// may under-report, never over-report.

func specMode(e *enginesim.Engine, dp int, mode config.SyncMode) StreamSpec {
	s := specOf(e, dp)
	s.Mode = mode
	return s
}

// assertNoStale checks that every replica the stream's view holds is
// resident in the engine on that tier: a partial view may lack blocks,
// never hold one the engine does not.
func assertNoStale(t *testing.T, d *Directory, e *enginesim.Engine, dp int) (indexed int) {
	t.Helper()
	s := d.streamOf(StreamKey{e.Name(), dp})
	want := map[kvevent.EngineHash]tiers{}
	for _, b := range e.State(dp) {
		want[b.Hash] = tiers{b.Device, b.Host}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.synced || s.idx == nil {
		t.Fatalf("stream %v is not synchronised: %s", s.spec, s.reason)
	}
	s.idx.ForEach(func(h kvevent.EngineHash, _ kvindex.Key, dev, host bool) {
		w := want[h]
		if (dev && !w.device) || (host && !w.host) {
			t.Errorf("stale replica %v: indexed device=%v host=%v, engine has %+v", h, dev, host, w)
		}
		if dev || host {
			indexed++
		}
	})
	return indexed
}

func waitMatch(t *testing.T, d *Directory, k StreamKey, what string, cond func(Match) bool) Match {
	t.Helper()
	var m Match
	eventually(t, what, 10*time.Second, func() (bool, string) {
		m = matchOf(t, d, k, nil)
		return cond(m), describe(m) + " complete=" + boolStr(m.Complete)
	})
	return m
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func prefill(t *testing.T, e *enginesim.Engine, tokens []uint32) {
	t.Helper()
	if _, _, err := e.Prefill(0, tokens); err != nil {
		t.Fatal(err)
	}
}

// Live mode (no replay endpoint), an engine that published before the
// directory subscribed: the stream reports nothing until a message
// arrives, then serves a partial view that holds what it saw and never
// what it did not; a gap restarts it, a restart of the publisher makes it
// complete from sequence 0.
func TestLiveModeJoiningLate(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayNone})
	old := seqTokens(1, 3*testBlock)
	prefill(t, e, old)
	d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncLive))
	k := StreamKey{e.Name(), 0}
	if e.ReplayEndpoint(0) != "" {
		t.Fatalf("engine without replay has replay endpoint %q", e.ReplayEndpoint(0))
	}
	// Item 4: subscribed, nothing received yet: not synchronised.
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if m := matchOf(t, d, k, old); m.Synchronized || m.ReusablePrefixTokens != 0 {
		t.Fatalf("live stream synchronised before any message: %s", describe(m))
	}
	fresh := seqTokens(1000, 2*testBlock)
	prefill(t, e, fresh)
	m := waitMatch(t, d, k, "partial live view", func(m Match) bool { return m.Synchronized && m.Sequence == e.Seq(0)-1 })
	if m.Complete {
		t.Fatalf("a view started at sequence %d reports complete", m.Sequence)
	}
	assertQueryMatchesOracle(t, d, e, 0, fresh)
	if m := matchOf(t, d, k, old); m.ReusablePrefixTokens != 0 {
		t.Fatalf("block stored before the view began reported: %s", describe(m))
	}
	assertNoStale(t, d, e, 0)
	s := d.streamOf(k)
	if n := s.counters.partialStarts.Load(); n != 1 {
		t.Fatalf("partial starts %d, want 1", n)
	}
	// A child of a block the view never saw is an orphan, not a fault.
	prefill(t, e, concat(old, seqTokens(5000, testBlock)))
	waitCaughtUp(t, d, e, 0)
	if st := s.report(time.Now()); st.SnapshotsStarted != 0 || !st.Synchronized {
		t.Fatalf("unknown parent in live mode caused recovery: %+v", st)
	}
	assertNoStale(t, d, e, 0)

	// A gap restarts the view at the message after it.
	if err := e.SkipSeq(0, 2); err != nil {
		t.Fatal(err)
	}
	after := seqTokens(2000, testBlock)
	prefill(t, e, after)
	waitMatch(t, d, k, "view restarted after the gap", func(m Match) bool { return m.Synchronized && m.Sequence == e.Seq(0)-1 })
	if n := s.counters.partialStarts.Load(); n != 2 {
		t.Fatalf("partial starts %d after a gap, want 2", n)
	}
	if m := matchOf(t, d, k, fresh); m.ReusablePrefixTokens != 0 {
		t.Fatalf("block from before the gap still reported: %s", describe(m))
	}
	assertQueryMatchesOracle(t, d, e, 0, after)

	// A restarted publisher starts again at sequence 0: complete.
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	prefill(t, e, fresh)
	m = waitMatch(t, d, k, "complete view after the restart", func(m Match) bool { return m.Synchronized && m.Complete })
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, fresh)
	if m.Sequence != 0 {
		t.Fatalf("sequence %d, want 0", m.Sequence)
	}
}

// Live mode seen from the engine's first message is complete, and
// follows stores, evictions to Host and removals exactly.
func TestLiveModeFromStart(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 6, HostBlocks: 4, Replay: enginesim.ReplayNone})
	d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncLive))
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	var prompts [][]uint32
	for i := range 6 {
		p := seqTokens(100*i, 2*testBlock)
		prompts = append(prompts, p)
		prefill(t, e, p)
	}
	m := waitCaughtUp(t, d, e, 0)
	if !m.Complete {
		t.Fatalf("view seen from sequence 0 is partial: %s", describe(m))
	}
	assertMatchesEngine(t, d, e, 0)
	for _, p := range prompts {
		assertQueryMatchesOracle(t, d, e, 0, p)
	}
	if n := d.streamOf(StreamKey{e.Name(), 0}).counters.partialStarts.Load(); n != 0 {
		t.Fatalf("partial starts %d, want 0", n)
	}
}

// History mode against an engine whose history reaches back to sequence
// 0: the replay rebuilds the whole state, and calibrations that replay
// from the view's sequence on never drop a block stored before the
// engine's history window.
func TestHistoryModeFromZeroAndCalibration(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory, HistoryBatches: 3})
	lim := testLimits()
	lim.ResyncInterval = 100 * time.Millisecond
	var prompts [][]uint32
	prompts = append(prompts, seqTokens(1, 2*testBlock))
	prefill(t, e, prompts[0]) // seq 0, in the history for now
	d := newDirectory(t, lim, specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	m := waitCaughtUp(t, d, e, 0)
	if !m.Complete {
		t.Fatalf("history from sequence 0 gave a partial view: %s", describe(m))
	}
	// Six more batches push sequence 0 out of the engine's 3-batch
	// history; calibrations keep replaying.
	for i := 1; i < 7; i++ {
		p := seqTokens(100*i, testBlock)
		prompts = append(prompts, p)
		prefill(t, e, p)
	}
	waitCaughtUp(t, d, e, 0)
	s := d.streamOf(k)
	ok := s.counters.snapshotsOK.Load()
	eventually(t, "three more calibrations", 10*time.Second, func() (bool, string) {
		n := s.counters.snapshotsOK.Load()
		return n >= ok+3, describe(matchOf(t, d, k, nil))
	})
	m = matchOf(t, d, k, nil)
	if !m.Synchronized || !m.Complete {
		t.Fatalf("after calibrations: %s complete=%v", describe(m), m.Complete)
	}
	assertMatchesEngine(t, d, e, 0)
	for _, p := range prompts {
		assertQueryMatchesOracle(t, d, e, 0, p)
	}
}

// History mode joining late: the history window starts after sequence 0,
// so the view is partial and holds exactly the blocks stored inside the
// window whose chains start there.
func TestHistoryModeWindow(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory, HistoryBatches: 3})
	var prompts [][]uint32
	for i := range 6 {
		p := seqTokens(100*i, 2*testBlock)
		prompts = append(prompts, p)
		prefill(t, e, p)
	}
	d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	m := waitCaughtUp(t, d, e, 0)
	if m.Complete {
		t.Fatalf("a 3-batch window of 6 batches reported complete")
	}
	if n := assertNoStale(t, d, e, 0); n != 3*2 {
		t.Fatalf("%d blocks indexed, want the 6 of the window", n)
	}
	for i, p := range prompts {
		hit := matchOf(t, d, k, p).ReusablePrefixTokens
		if want := 0; i >= 3 {
			want = len(p)
			if hit != want {
				t.Errorf("prompt %d in the window: hit %d, want %d", i, hit, want)
			}
		} else if hit != want {
			t.Errorf("prompt %d before the window: hit %d, want 0", i, hit)
		}
	}
	if st := d.streamOf(k).report(time.Now()); st.PartialStarts != 1 || st.SyncMode != "history" {
		t.Fatalf("status %+v", st)
	}
}

// History mode repairs a gap from the engine's history: the messages the
// live channel lost are replayed, and the view stays complete.
func TestHistoryModeRepairsGap(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory, ReplayTopicFrames: true})
	d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	a, b, c := seqTokens(1, 2*testBlock), seqTokens(100, 2*testBlock), seqTokens(200, testBlock)
	prefill(t, e, a)
	waitCaughtUp(t, d, e, 0)
	if err := e.SetDropLive(0, true); err != nil {
		t.Fatal(err)
	}
	prefill(t, e, b) // in the history, lost on the live channel
	if err := e.SetDropLive(0, false); err != nil {
		t.Fatal(err)
	}
	prefill(t, e, c)
	m := waitCaughtUp(t, d, e, 0)
	if !m.Complete {
		t.Fatalf("repaired view is partial: %s", describe(m))
	}
	assertMatchesEngine(t, d, e, 0)
	for _, p := range [][]uint32{a, b, c} {
		assertQueryMatchesOracle(t, d, e, 0, p)
	}
	st := d.streamOf(k).report(time.Now())
	if st.Gaps != 1 || st.PartialStarts != 0 {
		t.Fatalf("gaps %d partial starts %d, want 1 and 0", st.Gaps, st.PartialStarts)
	}
}

// A lost tail (the last message, with nothing after it to show the gap)
// is found by the periodic calibration, which replays from the view's
// next sequence.
func TestHistoryModeCalibrationFindsLostTail(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory})
	lim := testLimits()
	lim.ResyncInterval = 100 * time.Millisecond
	d := newDirectory(t, lim, specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	a, b := seqTokens(1, 2*testBlock), seqTokens(100, 2*testBlock)
	prefill(t, e, a)
	waitCaughtUp(t, d, e, 0)
	if err := e.SetDropLive(0, true); err != nil {
		t.Fatal(err)
	}
	prefill(t, e, b)
	m := waitCaughtUp(t, d, e, 0)
	if !m.Complete || d.streamOf(k).counters.tailRepairs.Load() != 1 {
		t.Fatalf("lost tail: %s tail repairs %d", describe(m), d.streamOf(k).counters.tailRepairs.Load())
	}
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, b)
}

// A gap older than the engine's history cannot be repaired: the view
// restarts empty at the first batch the history still holds, partial,
// and never reports a block from before the gap.
func TestHistoryModeGapBeyondWindow(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory, HistoryBatches: 2})
	d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	a := seqTokens(1, 2*testBlock)
	prefill(t, e, a)
	waitCaughtUp(t, d, e, 0)
	if err := e.SetDropLive(0, true); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ { // three lost batches, only two kept
		prefill(t, e, seqTokens(100*i, testBlock))
	}
	if err := e.Remove(0, []kvevent.EngineHash{e.State(0)[0].Hash}, kvevent.Device); err != nil { // lost too
		t.Fatal(err)
	}
	if err := e.SetDropLive(0, false); err != nil {
		t.Fatal(err)
	}
	last := seqTokens(900, testBlock)
	prefill(t, e, last)
	m := waitCaughtUp(t, d, e, 0)
	if m.Complete {
		t.Fatalf("view after an unrepairable gap reports complete")
	}
	if hit := matchOf(t, d, k, a).ReusablePrefixTokens; hit != 0 {
		t.Fatalf("prompt from before the gap (its root removed) reported %d tokens", hit)
	}
	assertNoStale(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, last)
	if st := d.streamOf(k).report(time.Now()); st.PartialStarts != 1 || st.Gaps == 0 {
		t.Fatalf("status %+v", st)
	}
}

// A history replay that never answers does not keep the stream deaf for
// ever: once live messages are waiting, the view starts partial from
// them.
func TestHistoryModeReplayNeverAnswers(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory})
	if err := e.SetReplayMode(0, enginesim.ReplayIgnore); err != nil {
		t.Fatal(err)
	}
	old := seqTokens(1, 2*testBlock)
	prefill(t, e, old)
	lim := testLimits()
	lim.ReplayTimeout = 200 * time.Millisecond
	d := newDirectory(t, lim, specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	waitReason(t, d, k, "history replay timed out", old)
	fresh := seqTokens(500, 2*testBlock)
	prefill(t, e, fresh)
	m := waitCaughtUp(t, d, e, 0)
	if m.Complete {
		t.Fatalf("view without history reports complete")
	}
	assertQueryMatchesOracle(t, d, e, 0, fresh)
	assertNoStale(t, d, e, 0)
}

// A restarted engine in history mode: the link drops, the view goes, and
// the new process's history (from its sequence 0) makes a complete one.
func TestHistoryModeRestart(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayHistory})
	d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncHistory))
	k := StreamKey{e.Name(), 0}
	a := seqTokens(1, 2*testBlock)
	prefill(t, e, a)
	waitCaughtUp(t, d, e, 0)
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	b := seqTokens(100, testBlock)
	prefill(t, e, b)
	// Both processes published one batch, so the old view is complete at
	// the sequence the new one reaches as well, until the stream sees the
	// link drop: only b, which the old process never stored, tells the
	// new process's view from it.
	eventually(t, "complete view of the new process", 10*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, b)
		return m.Synchronized && m.Complete && m.Sequence == e.Seq(0)-1 && m.DeviceHitTokens == len(b),
			describe(m) + " complete=" + boolStr(m.Complete)
	})
	if d.streamOf(k).counters.disconnects.Load() == 0 {
		t.Fatalf("the restart's link drop was not counted")
	}
	assertMatchesEngine(t, d, e, 0)
	if hit := matchOf(t, d, k, a).ReusablePrefixTokens; hit != 0 {
		t.Fatalf("block of the old process reported: %d", hit)
	}
}

// Item 4: a stream whose publisher sends only another topic must not
// report synchronised, in any mode: before the change a snapshot stream
// reported synchronised from its replay while hearing nothing live.
func TestDeafStreamNotSynchronised(t *testing.T) {
	for _, mode := range []config.SyncMode{config.SyncSnapshot, config.SyncHistory, config.SyncLive} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := enginesim.Config{DeviceBlocks: 64, Topic: "kv@pod-7@model"}
			switch mode {
			case config.SyncHistory:
				cfg.Replay = enginesim.ReplayHistory
			case config.SyncLive:
				cfg.Replay = enginesim.ReplayNone
			}
			e := startEngine(t, cfg)
			spec := specMode(e, 0, mode)
			spec.Topic = "xllm-kv"
			d := newDirectory(t, testLimits(), spec)
			k := StreamKey{e.Name(), 0}
			if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
				t.Fatal(err)
			}
			p := seqTokens(1, 2*testBlock)
			prefill(t, e, p)
			waitReason(t, d, k, `publisher sends topic "kv@pod-7@model"`, p)
			prefill(t, e, seqTokens(100, testBlock))
			time.Sleep(100 * time.Millisecond)
			if m := matchOf(t, d, k, p); m.Synchronized || !strings.Contains(m.Error, "kv@pod-7@model") {
				t.Fatalf("deaf stream: %s", describe(m))
			}
		})
	}
}

// An empty topic accepts every topic (the template's "all").
func TestEmptyTopicAcceptsAll(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Topic: "kv@pod-7@model", Replay: enginesim.ReplayNone})
	spec := specMode(e, 0, config.SyncLive)
	spec.Topic = ""
	d := newDirectory(t, testLimits(), spec)
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	p := seqTokens(1, 2*testBlock)
	prefill(t, e, p)
	waitCaughtUp(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, p)
}

// /metrics counts partial starts and says which streams are complete.
func TestMetricsPartialStarts(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, Replay: enginesim.ReplayNone})
	prefill(t, e, seqTokens(1, testBlock)) // published before the directory listens
	reg := prometheus.NewRegistry()
	d, err := New(testLimits(), Options{Logger: testLogger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.SetStreams([]StreamSpec{specMode(e, 0, config.SyncLive)}); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	prefill(t, e, seqTokens(100, testBlock))
	waitCaughtUp(t, d, e, 0)
	labels := []string{"instance", e.Name(), "dp_rank", "0"}
	if v := value(t, reg, "kvcar_stream_partial_starts_total", labels...); v != 1 {
		t.Fatalf("partial starts %v, want 1", v)
	}
	if v := value(t, reg, "kvcar_stream_complete", labels...); v != 0 {
		t.Fatalf("complete %v, want 0", v)
	}
	if v := value(t, reg, "kvcar_stream_synchronized", labels...); v != 1 {
		t.Fatalf("synchronized %v, want 1", v)
	}
}

// SGLang's encodings over TCP: signed int64 hashes, CPU_PINNED Host
// copies announced by hash, tagged maps, and the older arrays with the
// positional metadata map and a 0 for a root's parent; followed exactly
// in history mode.
func TestSGLangDialects(t *testing.T) {
	shapes := map[string]kvevent.Shape{
		"maps":   {Hashes: kvevent.HashInt64, UpperMedium: true, PinnedHost: true},
		"legacy": {EventsAsArrays: true, Hashes: kvevent.HashInt64, UpperMedium: true, PinnedHost: true, SGLangMeta: true, ZeroRootParent: true},
	}
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			e := startEngine(t, enginesim.Config{DeviceBlocks: 6, HostBlocks: 6, Shape: shape, Replay: enginesim.ReplayHistory})
			d := newDirectory(t, testLimits(), specMode(e, 0, config.SyncHistory))
			var prompts [][]uint32
			for i := range 6 {
				p := seqTokens(1_000_000_000+1000*i, 2*testBlock) // ids above 2^29, as large vocabularies
				prompts = append(prompts, p)
				prefill(t, e, p)
			}
			m := waitCaughtUp(t, d, e, 0)
			if !m.Complete || m.HostBlocks == 0 {
				t.Fatalf("%s: %s complete=%v (want Host copies)", name, describe(m), m.Complete)
			}
			assertMatchesEngine(t, d, e, 0)
			for _, p := range prompts {
				assertQueryMatchesOracle(t, d, e, 0, p)
			}
		})
	}
}

// A stream whose engine is not there waits on its sockets instead of
// polling in a loop, in every mode.
func TestStreamWithoutEngineIdles(t *testing.T) {
	port := freePorts(t, 2)
	ep := func(p int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", p) }
	specs := []StreamSpec{
		{InstanceName: "snap", Endpoint: ep(port), ReplayEndpoint: ep(port + 1), Topic: "t", BlockSize: testBlock},
		{InstanceName: "hist", Endpoint: ep(port), ReplayEndpoint: ep(port + 1), Topic: "t", Mode: config.SyncHistory, BlockSize: testBlock},
		{InstanceName: "live", Endpoint: ep(port), Topic: "t", Mode: config.SyncLive, BlockSize: testBlock},
	}
	d := newDirectory(t, testLimits(), specs...)
	time.Sleep(500 * time.Millisecond)
	for _, s := range specs {
		st := d.streamOf(s.Key())
		if n := st.counters.waits.Load(); n > 50 {
			t.Errorf("%s: %d waits in 0.5 s without an engine: the stream spins", s.InstanceName, n)
		}
		if m := matchOf(t, d, s.Key(), nil); m.Synchronized {
			t.Errorf("%s: synchronised without an engine", s.InstanceName)
		}
	}
}

// Item 12 in snapshot mode: replies and the end marker with a topic
// frame ([empty, topic, seq, payload], [empty, empty, END, empty]) make
// the same snapshot as without.
func TestSnapshotWithTopicFrames(t *testing.T) {
	e := startEngine(t, enginesim.Config{DeviceBlocks: 64, HostBlocks: 8, ReplayTopicFrames: true})
	p := seqTokens(1, 3*testBlock)
	prefill(t, e, p)
	d := newDirectory(t, testLimits(), specOf(e, 0))
	m := waitCaughtUp(t, d, e, 0)
	if !m.Complete || d.streamOf(StreamKey{e.Name(), 0}).counters.snapshotsOK.Load() == 0 {
		t.Fatalf("%s complete=%v", describe(m), m.Complete)
	}
	assertMatchesEngine(t, d, e, 0)
	assertQueryMatchesOracle(t, d, e, 0, p)
}
