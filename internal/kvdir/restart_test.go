package kvdir

// A publisher that restarts behind a bound subscriber, over real TCP
// ZeroMQ (R-REC: never over-report once a restart is seen).

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// hrBatch encodes one batch storing tokens as a chain of blocks hashed
// base, base+1, ... (root first), or removing those hashes.
func hrStore(base uint64, tokens []uint32) []byte {
	var b kvevent.Batch
	n := len(tokens) / testBlock
	hs := make([]kvevent.EngineHash, n)
	for i := range hs {
		hs[i] = kvevent.IntHash(base + uint64(i))
	}
	b.AddStored(hs, kvevent.EngineHash{}, false, tokens, testBlock, kvevent.Device)
	b.HasDPRank = true
	return kvevent.AppendBatch(nil, &b, kvevent.Shape{})
}

func hrContext(t *testing.T) *kvtransport.Context {
	t.Helper()
	c, err := kvtransport.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// hrDial makes a publisher dialing the hub and waits for the hub's
// subscription to reach it.
func hrDial(t *testing.T, c *kvtransport.Context, bind string) *kvtransport.Publisher {
	t.Helper()
	p, err := c.DialPublisher(bind, kvtransport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	eventually(t, "hub subscribed to the dialing publisher", 5*time.Second, func() (bool, string) {
		n, err := p.DrainSubscriptions()
		return err == nil && n > 0, fmt.Sprint(n, err)
	})
	return p
}

func hrSend(t *testing.T, p *kvtransport.Publisher, topic string, seq uint64, payload []byte) {
	t.Helper()
	if err := p.Send(kvevent.LiveFrames(topic, seq, payload)); err != nil {
		t.Fatal(err)
	}
}

func hrBoundSpec(name, topic, bind string, mode config.SyncMode, replay string) StreamSpec {
	return StreamSpec{InstanceName: name, Endpoint: bind, ReplayEndpoint: replay, Topic: topic, Mode: mode,
		AnyRank: true, Bind: bind, BindPorts: 1, BlockSize: testBlock, HashSeed: 1024}
}

// hrReplay is an engine's replay endpoint answering from history (seq,
// payload pairs) that the test may replace.
type hrReplay struct {
	mu      sync.Mutex
	history func(start uint64) [][2]any
	ep      string
	stop    chan struct{}
	done    chan struct{}
}

func startHRReplay(t *testing.T, c *kvtransport.Context, history func(start uint64) [][2]any) *hrReplay {
	t.Helper()
	r := &hrReplay{history: history, stop: make(chan struct{}), done: make(chan struct{})}
	epc := make(chan string, 1)
	go func() {
		defer close(r.done)
		rs, err := c.BindReplayServer("tcp://127.0.0.1:0", kvtransport.ReplayServerOptions{SendHWM: 100000})
		if err != nil {
			epc <- ""
			return
		}
		defer rs.Close()
		epc <- rs.Endpoint()
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			id, frames, err := rs.Recv(20 * time.Millisecond)
			if err != nil {
				continue
			}
			start, err := kvevent.ParseReplayRequest(frames)
			if err != nil {
				continue
			}
			r.mu.Lock()
			h := r.history(start)
			r.mu.Unlock()
			for _, e := range h {
				_ = rs.Reply(id, kvevent.ReplayFrames(e[0].(uint64), e[1].([]byte)))
			}
			_ = rs.Reply(id, kvevent.ReplayEnd())
		}
	}()
	r.ep = <-epc
	if r.ep == "" {
		t.Fatal("replay server did not bind")
	}
	t.Cleanup(func() { close(r.stop); <-r.done })
	return r
}

func (r *hrReplay) set(h func(start uint64) [][2]any) {
	r.mu.Lock()
	r.history = h
	r.mu.Unlock()
}

// TestHubHistoryRestartAfterReplayOnlyView: history mode on the bound
// subscriber. kvcar builds the view from the engine's history alone (the
// engine was idle when kvcar subscribed); then the engine restarts, which
// on the hub shows only as its sequence going back (README "Bound
// subscriber"). Its sequence 0, the first live message, is taken for a
// restart and the view replayed from 0: the old process's blocks are not
// reported once it has arrived. It was once taken for a duplicate of the
// replay, and the old blocks stayed reported for ever, as calibrations
// replay from the old sequence, where the new history has nothing.
func TestHubHistoryRestartAfterReplayOnlyView(t *testing.T) {
	port := freePorts(t, 1)
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	const name, topic = "10.0.0.1:8000", "kv@10.0.0.1:8000"
	c := hrContext(t)
	old := seqTokens(1, 3*testBlock)
	oldHistory := [][2]any{{uint64(0), hrStore(100, old)}, {uint64(1), hrStore(200, seqTokens(300, testBlock))},
		{uint64(2), hrStore(210, seqTokens(400, testBlock))}}
	rep := startHRReplay(t, c, func(start uint64) [][2]any {
		var out [][2]any
		for _, e := range oldHistory {
			if e[0].(uint64) >= start {
				out = append(out, e)
			}
		}
		return out
	})
	lim := testLimits()
	lim.ResyncInterval = time.Second
	d := newDirectory(t, lim, hrBoundSpec(name, topic, bind, config.SyncHistory, rep.ep))
	k := StreamKey{name, 0}
	eventually(t, "view from the history", 5*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, old)
		return m.Synchronized && m.ReusablePrefixTokens == len(old), describe(m)
	})

	// The engine restarts: empty cache, history from 0 again, and it
	// dials the hub and publishes its first batch.
	fresh := seqTokens(7000, 2*testBlock)
	newHistory := [][2]any{{uint64(0), hrStore(5000, fresh)}}
	rep.set(func(start uint64) [][2]any {
		if start == 0 {
			return newHistory
		}
		return nil
	})
	s := d.streamOf(k)
	dup0 := s.counters.duplicates.Load()
	engine := hrDial(t, c, bind)
	hrSend(t, engine, topic, 0, newHistory[0][1].([]byte))
	eventually(t, "the restarted engine's blocks served", 5*time.Second, func() (bool, string) {
		m := matchOf(t, d, k, fresh)
		return m.Synchronized && m.ReusablePrefixTokens == len(fresh), describe(m)
	})
	time.Sleep(2500 * time.Millisecond) // two calibrations
	if m := matchOf(t, d, k, old); m.ReusablePrefixTokens > 0 {
		t.Errorf("after the engine restarted (sequence went back from 2 to 0) kvcar still reports %d tokens of the old "+
			"process's blocks, which the new process does not hold: %s (duplicates %d)",
			m.ReusablePrefixTokens, describe(m), s.counters.duplicates.Load()-dup0)
	}
	if m := matchOf(t, d, k, fresh); m.ReusablePrefixTokens != len(fresh) {
		t.Errorf("after two calibrations the restarted engine's blocks: %s", describe(m))
	}
}
