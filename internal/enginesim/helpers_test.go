package enginesim

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	zmq "github.com/pebbe/zmq4"
)

const (
	testTopic   = "xllm-kv"
	testBS      = 4
	recvTimeout = 5 * time.Second
	// quietWait is how long a test listens to show that nothing arrives.
	quietWait = 250 * time.Millisecond
)

func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	if cfg.Topic == "" {
		cfg.Topic = testTopic
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = testBS
	}
	if cfg.Name == "" && cfg.HTTPAddr == "" && cfg.DiscoveryOffsets == nil {
		cfg.Name = "127.0.0.1:8000"
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close engine: %v", err)
		}
	})
	return e
}

// peer is a plain libzmq client of one rank: a SUB on the live endpoint
// and a DEALER on the replay endpoint, as kvcar connects them.
type peer struct {
	t      *testing.T
	e      *Engine
	dp     int
	sub    *zmq.Socket
	dealer *zmq.Socket
	dec    *kvevent.Decoder
}

type liveMsg struct {
	topic   string
	seq     uint64
	payload []byte
	batch   *kvevent.Batch
	err     error
}

type replayMsg struct {
	seq   uint64
	batch *kvevent.Batch
}

func newPeer(t *testing.T, e *Engine, dp int) *peer {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, e: e, dp: dp, dec: kvevent.NewDecoder(0)}
	mk := func(typ zmq.Type, ep string) *zmq.Socket {
		s, err := zctx.NewSocket(typ)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetLinger(0); err != nil {
			t.Fatal(err)
		}
		if err := s.Connect(ep); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := e.Subscriptions(dp)
	p.sub = mk(zmq.SUB, e.EventEndpoint(dp))
	p.dealer = mk(zmq.DEALER, e.ReplayEndpoint(dp))
	t.Cleanup(func() {
		p.sub.Close()
		p.dealer.Close()
		if err := zctx.Term(); err != nil {
			t.Errorf("terminate client context: %v", err)
		}
	})
	if err := p.sub.SetSubscribe(testTopic); err != nil {
		t.Fatal(err)
	}
	p.waitSubscribed(before + 1)
	return p
}

// waitSubscribed waits until the rank has seen n subscribe requests. It
// keeps polling the SUB meanwhile: libzmq resends a SUB's subscriptions
// after a reconnect only when the owning thread touches the socket, as
// kvcar's subscriber loop always does.
func (p *peer) waitSubscribed(n uint64) {
	p.t.Helper()
	deadline := time.Now().Add(recvTimeout)
	for p.e.Subscriptions(p.dp) < n {
		if time.Now().After(deadline) {
			p.t.Fatalf("dp %d: %d subscriptions after %v, want %d", p.dp, p.e.Subscriptions(p.dp), recvTimeout, n)
		}
		if frames, ok := recvOn(p.t, p.sub, time.Millisecond); ok {
			p.t.Fatalf("live message %x before the subscription was seen", frames)
		}
	}
}

func recvOn(t *testing.T, s *zmq.Socket, timeout time.Duration) ([][]byte, bool) {
	t.Helper()
	poller := zmq.NewPoller()
	poller.Add(s, zmq.POLLIN)
	ready, err := poller.Poll(timeout)
	if err != nil {
		t.Fatal(err)
	}
	if len(ready) == 0 {
		return nil, false
	}
	msg, err := s.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	return msg, true
}

// live returns the next live message, decoded when it decodes.
func (p *peer) live() liveMsg {
	p.t.Helper()
	frames, ok := recvOn(p.t, p.sub, recvTimeout)
	if !ok {
		p.t.Fatalf("dp %d: no live message within %v", p.dp, recvTimeout)
	}
	topic, seq, payload, err := kvevent.ParseLive(frames)
	if err != nil {
		p.t.Fatal(err)
	}
	m := liveMsg{topic: string(topic), seq: seq, payload: payload}
	var b kvevent.Batch
	if m.err = p.dec.DecodeBatch(payload, &b); m.err == nil {
		m.batch = b.Clone()
	}
	return m
}

// liveOK is live for messages that must decode.
func (p *peer) liveOK() liveMsg {
	p.t.Helper()
	m := p.live()
	if m.err != nil {
		p.t.Fatalf("live seq %d does not decode: %v", m.seq, m.err)
	}
	return m
}

func (p *peer) noLive() {
	p.t.Helper()
	if frames, ok := recvOn(p.t, p.sub, quietWait); ok {
		p.t.Fatalf("unexpected live message %x", frames)
	}
}

// snapshot sends a replay request and collects replies until the end
// marker or until nothing arrives for wait.
func (p *peer) snapshot(start uint64, wait time.Duration) (batches []replayMsg, ended bool) {
	p.t.Helper()
	if _, err := p.dealer.SendMessage(kvevent.ReplayRequest(start)); err != nil {
		p.t.Fatal(err)
	}
	for {
		frames, ok := recvOn(p.t, p.dealer, wait)
		if !ok {
			return batches, false
		}
		seq, payload, end, err := kvevent.ParseReplay(frames)
		if err != nil {
			p.t.Fatal(err)
		}
		if end {
			return batches, true
		}
		var b kvevent.Batch
		if err := p.dec.DecodeBatch(payload, &b); err != nil {
			p.t.Fatalf("snapshot batch does not decode: %v", err)
		}
		batches = append(batches, replayMsg{seq: seq, batch: b.Clone()})
	}
}

// mirror is a subscriber-side model of one rank's tiers built from events
// only, used to check that what the engine says equals what it holds.
type mirror struct {
	blocks map[kvevent.EngineHash]*BlockState
	order  []kvevent.EngineHash
}

func newMirror() *mirror { return &mirror{blocks: map[kvevent.EngineHash]*BlockState{}} }

func (m *mirror) apply(t *testing.T, b *kvevent.Batch, bs int) {
	t.Helper()
	for _, ev := range b.Events {
		switch ev.Kind {
		case kvevent.AllBlocksCleared:
			clear(m.blocks)
			m.order = nil
		case kvevent.BlockRemoved:
			for _, h := range ev.BlockHashes {
				s := m.blocks[h]
				if s == nil {
					t.Fatalf("removal of unknown block %x", h)
				}
				if ev.Medium == kvevent.Host {
					s.Host = false
				} else {
					s.Device = false
				}
				if !s.Host && !s.Device {
					delete(m.blocks, h)
					m.order = slices.DeleteFunc(m.order, func(x kvevent.EngineHash) bool { return x == h })
				}
			}
		case kvevent.BlockStored:
			parent, hasParent := ev.ParentHash, ev.HasParent
			for i, h := range ev.BlockHashes {
				s := m.blocks[h]
				if s == nil {
					if len(ev.TokenIDs) == 0 {
						t.Fatalf("tokenless store of unknown block %x", h)
					}
					s = &BlockState{Hash: h}
					m.blocks[h] = s
					m.order = append(m.order, h)
				}
				if len(ev.TokenIDs) > 0 {
					if ev.BlockSize != bs {
						t.Fatalf("block size %d, want %d", ev.BlockSize, bs)
					}
					s.Tokens = slices.Clone(ev.TokenIDs[i*bs : (i+1)*bs])
					s.Parent, s.HasParent = parent, hasParent
				}
				if ev.Medium == kvevent.Host {
					s.Host = true
				} else {
					s.Device = true
				}
				parent, hasParent = h, true
			}
		}
	}
}

// equal compares the mirror with the engine's true state, ignoring order.
func (m *mirror) equal(t *testing.T, state []BlockState) {
	t.Helper()
	if len(state) != len(m.blocks) {
		t.Fatalf("engine holds %d blocks, events describe %d", len(state), len(m.blocks))
	}
	for _, s := range state {
		got := m.blocks[s.Hash]
		if got == nil {
			t.Fatalf("block %x resident but never announced", s.Hash)
		}
		if got.Device != s.Device || got.Host != s.Host || got.HasParent != s.HasParent ||
			got.Parent != s.Parent || !slices.Equal(got.Tokens, s.Tokens) {
			t.Fatalf("block %x: events say %+v, engine holds %+v", s.Hash, *got, s)
		}
	}
}

func tokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func isNotRunning(err error) bool { return errors.Is(err, ErrNotRunning) }
