package kvdir

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
)

const testBlock = 4 // small blocks keep token lists readable

func testLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("KVCAR_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func testLimits() Limits {
	return Limits{
		MaxBlocksPerStream: 4096,
		MaxMessageBytes:    1 << 20,
		MaxBufferedBytes:   4 << 20,
		ReplayTimeout:      500 * time.Millisecond,
	}
}

func startEngine(t *testing.T, cfg enginesim.Config) *enginesim.Engine {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "127.0.0.1:8000"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = testBlock
	}
	if cfg.Topic == "" {
		cfg.Topic = "xllm-kv"
	}
	e, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func specOf(e *enginesim.Engine, dp int) StreamSpec {
	return StreamSpec{
		InstanceName:   e.Name(),
		DPRank:         dp,
		Endpoint:       e.EventEndpoint(dp),
		ReplayEndpoint: e.ReplayEndpoint(dp),
		Topic:          "xllm-kv",
		BlockSize:      e.BlockSize(),
		HashSeed:       1024,
	}
}

func newDirectory(t *testing.T, lim Limits, specs ...StreamSpec) *Directory {
	t.Helper()
	d, err := New(lim, Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close directory: %v", err)
		}
	})
	if err := d.SetStreams(specs); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *Directory) streamOf(k StreamKey) *stream {
	for _, s := range d.set.Load().streams {
		if s.spec.Key() == k {
			return s
		}
	}
	return nil
}

func matchOf(t *testing.T, d *Directory, k StreamKey, tokens []uint32) Match {
	t.Helper()
	for _, m := range d.Query(tokens, nil) {
		if m.InstanceName == k.InstanceName && m.DPRank == k.DPRank {
			return m
		}
	}
	t.Fatalf("no stream %v in the directory", k)
	return Match{}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: not reached within %v; last state: %s", what, d, last)
}

func describe(m Match) string {
	return fmt.Sprintf("synced=%v seq=%d dev=%d host=%d hit=%d/%d err=%q",
		m.Synchronized, m.Sequence, m.DeviceBlocks, m.HostBlocks, m.DeviceHitTokens, m.HostOnlyHitTokens, m.Error)
}

// waitSynced waits until stream k is synchronised at sequence >= seq.
func waitSynced(t *testing.T, d *Directory, k StreamKey, seq uint64) Match {
	t.Helper()
	var m Match
	eventually(t, fmt.Sprintf("%v synchronised at seq >= %d", k, seq), 10*time.Second, func() (bool, string) {
		m = matchOf(t, d, k, nil)
		return m.Synchronized && m.Sequence >= seq, describe(m)
	})
	return m
}

// waitCaughtUp waits until stream k has applied everything the engine
// rank has published: its view reflects a live sequence (not an empty
// snapshot) at least the last one sent.
func waitCaughtUp(t *testing.T, d *Directory, e *enginesim.Engine, dp int) Match {
	t.Helper()
	k := StreamKey{e.Name(), dp}
	next := e.Seq(dp)
	if next == 0 {
		return waitSynced(t, d, k, 0)
	}
	var m Match
	eventually(t, fmt.Sprintf("%v caught up with sequence %d", k, next-1), 10*time.Second, func() (bool, string) {
		m = matchOf(t, d, k, nil)
		s := d.streamOf(k)
		s.mu.RLock()
		has := s.hasSeq
		s.mu.RUnlock()
		return m.Synchronized && has && m.Sequence >= next-1, describe(m)
	})
	return m
}

func waitUnsynced(t *testing.T, d *Directory, k StreamKey) Match {
	t.Helper()
	var m Match
	eventually(t, fmt.Sprintf("%v unsynchronised", k), 10*time.Second, func() (bool, string) {
		m = matchOf(t, d, k, nil)
		return !m.Synchronized, describe(m)
	})
	return m
}

type tiers struct{ device, host bool }

// assertMatchesEngine checks the directory's view of rank dp against the
// engine's true state (R-REC-1: never a stale hit): every block the index
// holds is resident in the engine on exactly those tiers, and every engine
// block reachable from a root through resident blocks is indexed.
func assertMatchesEngine(t *testing.T, d *Directory, e *enginesim.Engine, dp int) {
	t.Helper()
	s := d.streamOf(StreamKey{e.Name(), dp})
	got := map[kvevent.EngineHash]tiers{}
	s.mu.RLock()
	if !s.synced || s.idx == nil {
		s.mu.RUnlock()
		t.Fatalf("stream %v is not synchronised: %s", s.spec, s.reason)
	}
	s.idx.ForEach(func(h kvevent.EngineHash, _ kvindex.Key, dev, host bool) {
		if dev || host {
			got[h] = tiers{dev, host}
		}
	})
	s.mu.RUnlock()

	truth := e.State(dp)
	want := map[kvevent.EngineHash]tiers{}
	rooted := map[kvevent.EngineHash]bool{}
	for _, b := range truth { // parent first
		want[b.Hash] = tiers{b.Device, b.Host}
		if !b.HasParent || rooted[b.Parent] {
			rooted[b.Hash] = true
		}
	}
	for h, tr := range got {
		w, ok := want[h]
		if !ok {
			t.Errorf("stale block %x: indexed on %+v, not resident in the engine", h, tr)
		} else if w != tr {
			t.Errorf("block %x: indexed on %+v, engine has %+v", h, tr, w)
		}
	}
	for h := range rooted {
		if _, ok := got[h]; !ok {
			t.Errorf("block %x resident in the engine (%+v) is missing from the index", h, want[h])
		}
	}
}

// assertQueryMatchesOracle checks that a query for tokens reports exactly
// what the engine would reuse.
func assertQueryMatchesOracle(t *testing.T, d *Directory, e *enginesim.Engine, dp int, tokens []uint32) {
	t.Helper()
	dev, host := e.Oracle(dp, tokens)
	m := matchOf(t, d, StreamKey{e.Name(), dp}, tokens)
	if m.DeviceHitTokens != dev || m.HostOnlyHitTokens != host || m.ReusablePrefixTokens != dev+host {
		t.Errorf("query hit device=%d host_only=%d reusable=%d, engine reuses device=%d host=%d",
			m.DeviceHitTokens, m.HostOnlyHitTokens, m.ReusablePrefixTokens, dev, host)
	}
}

func seqTokens(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

func concat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }
