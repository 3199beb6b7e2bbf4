package enginesim

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// R-WIRE-1, R-WIRE-2: one Prefill is one live message topic|seq|batch with
// one BlockStored of the new full blocks, parent = the last cached block;
// the reused prefix matches the Oracle and the events match State.
func TestPrefillPublishesOneBatchRWIRE2(t *testing.T) {
	e := startEngine(t, Config{DeviceBlocks: 16})
	p := newPeer(t, e, 0)
	m := newMirror()

	prompt := tokens(100, 2*testBS+3) // two full blocks and a partial one
	dev, host, err := e.Prefill(0, prompt)
	must(t, err)
	if dev != 0 || host != 0 {
		t.Fatalf("cold prefill reused %d/%d tokens", dev, host)
	}
	msg := p.liveOK()
	if msg.topic != testTopic || msg.seq != 0 {
		t.Fatalf("topic %q seq %d, want %q 0", msg.topic, msg.seq, testTopic)
	}
	b := msg.batch
	if !b.HasDPRank || b.DPRank != 0 || len(b.Events) != 1 {
		t.Fatalf("batch rank %v/%d with %d events", b.HasDPRank, b.DPRank, len(b.Events))
	}
	ev := b.Events[0]
	if ev.Kind != kvevent.BlockStored || ev.Medium != kvevent.Device || ev.HasParent ||
		len(ev.BlockHashes) != 2 || ev.BlockSize != testBS || !slices.Equal(ev.TokenIDs, prompt[:2*testBS]) {
		t.Fatalf("first store = %+v", ev)
	}
	m.apply(t, b, testBS)

	// Same first block, new second and third blocks.
	next := append(slices.Clone(prompt[:testBS]), tokens(900, 2*testBS)...)
	wantDev, wantHost := e.Oracle(0, next)
	if wantDev != testBS || wantHost != 0 {
		t.Fatalf("oracle = %d/%d, want %d/0", wantDev, wantHost, testBS)
	}
	dev, host, err = e.Prefill(0, next)
	must(t, err)
	if dev != wantDev || host != wantHost {
		t.Fatalf("prefill reused %d/%d, oracle said %d/%d", dev, host, wantDev, wantHost)
	}
	msg = p.liveOK()
	if msg.seq != 1 {
		t.Fatalf("second message seq %d, want 1", msg.seq)
	}
	ev = msg.batch.Events[0]
	if !ev.HasParent || ev.ParentHash != b.Events[0].BlockHashes[0] || len(ev.BlockHashes) != 2 {
		t.Fatalf("second store = %+v, want parent %x", ev, b.Events[0].BlockHashes[0])
	}
	m.apply(t, msg.batch, testBS)
	m.equal(t, e.State(0))

	// A fully cached prompt changes nothing and sends nothing.
	dev, _, err = e.Prefill(0, next)
	must(t, err)
	if dev != 3*testBS {
		t.Fatalf("repeat prefill reused %d device tokens, want %d", dev, 3*testBS)
	}
	p.noLive()
	if s := e.Seq(0); s != 2 {
		t.Fatalf("Seq = %d, want 2", s)
	}
}

// R-IDX-2, R-IDX-3: Device eviction offloads to Host (tokenless cpu store
// before the gpu removal), Host-only blocks come back as Host hits and are
// reloaded, and blocks of the prompt in progress are never evicted.
func TestEvictionWithHostOffloadRIDX2(t *testing.T) {
	e := startEngine(t, Config{DeviceBlocks: 2, HostBlocks: 2})
	p := newPeer(t, e, 0)
	m := newMirror()

	a := tokens(1, 2*testBS)
	b := tokens(500, 2*testBS)
	_, _, err := e.Prefill(0, a)
	must(t, err)
	m.apply(t, p.liveOK().batch, testBS)
	aHashes := []kvevent.EngineHash{e.State(0)[0].Hash, e.State(0)[1].Hash}

	_, _, err = e.Prefill(0, b)
	must(t, err)
	msg := p.liveOK()
	m.apply(t, msg.batch, testBS)
	// Leaf first: a[1] then a[0] go to Host, then b is stored.
	var kinds []string
	for _, ev := range msg.batch.Events {
		kinds = append(kinds, ev.Kind.String()+"/"+ev.Medium.String())
	}
	want := []string{"BlockStored/cpu", "BlockRemoved/gpu", "BlockStored/cpu", "BlockRemoved/gpu", "BlockStored/gpu"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("eviction events %v, want %v", kinds, want)
	}
	off := msg.batch.Events[0]
	if off.BlockHashes[0] != aHashes[1] || len(off.TokenIDs) != 0 || off.HasParent || off.BlockSize != 0 {
		t.Fatalf("offload event %+v, want tokenless store of leaf %x", off, aHashes[1])
	}
	m.equal(t, e.State(0))

	// a is now Host-only: Host hits, reloaded to Device with tokens; b is
	// evicted from Device but Host is full of a's blocks, which belong to
	// the prompt and stay, so b is dropped without a Host copy.
	od, oh := e.Oracle(0, a)
	if od != 0 || oh != 2*testBS {
		t.Fatalf("oracle for a = %d/%d, want 0/%d", od, oh, 2*testBS)
	}
	dev, host, err := e.Prefill(0, a)
	must(t, err)
	if dev != 0 || host != 2*testBS {
		t.Fatalf("prefill a reused %d/%d, want 0/%d", dev, host, 2*testBS)
	}
	msg = p.liveOK()
	m.apply(t, msg.batch, testBS)
	for _, ev := range msg.batch.Events {
		if ev.Kind == kvevent.BlockStored && ev.Medium == kvevent.Host {
			t.Fatalf("b was offloaded although Host holds only pinned blocks: %+v", ev)
		}
		if ev.Kind == kvevent.BlockStored && len(ev.TokenIDs) == 0 {
			t.Fatalf("reload announced without tokens: %+v", ev)
		}
	}
	m.equal(t, e.State(0))
	for _, s := range e.State(0) {
		if !(s.Device && s.Host) {
			t.Fatalf("after reload block %x device=%v host=%v, want both", s.Hash, s.Device, s.Host)
		}
	}

	// A new prompt evicts a to Device-less, keeping the Host copies; the
	// Host LRU then evicts with a cpu removal when a third chain arrives.
	_, _, err = e.Prefill(0, b)
	must(t, err)
	m.apply(t, p.liveOK().batch, testBS)
	_, err = e.StoreChain(0, tokens(7000, 2*testBS), kvevent.Host)
	must(t, err)
	msg = p.liveOK()
	removedCPU := 0
	for _, ev := range msg.batch.Events {
		if ev.Kind == kvevent.BlockRemoved && ev.Medium == kvevent.Host {
			removedCPU += len(ev.BlockHashes)
		}
	}
	if removedCPU != 2 {
		t.Fatalf("host store evicted %d host blocks, want 2", removedCPU)
	}
	m.apply(t, msg.batch, testBS)
	m.equal(t, e.State(0))
}

// R-WIRE-3, R-IDX-5: the snapshot is the full state parent first, split
// into batches, every batch under the watermark seq, then the end marker;
// a block whose parent left both tiers is sent as an orphan.
func TestSnapshotEqualsStateRWIRE3(t *testing.T) {
	e := startEngine(t, Config{DeviceBlocks: 4, HostBlocks: 4, SnapshotBatchBlocks: 2})
	p := newPeer(t, e, 0)

	for i := 0; i < 4; i++ {
		_, _, err := e.Prefill(0, tokens(uint32(1000*i), 2*testBS))
		must(t, err)
	}
	chain, err := e.StoreChain(0, tokens(50000, 3*testBS), kvevent.Host)
	must(t, err)
	// Orphan: drop the root of the Host chain, keep its children.
	must(t, e.Remove(0, chain[:1], kvevent.Host))
	state := e.State(0)
	watermark := e.Seq(0) - 1

	batches, ended := p.snapshot(12345, recvTimeout)
	if !ended {
		t.Fatal("snapshot did not end")
	}
	if want := (len(state) + 1) / 2; len(batches) != want {
		t.Fatalf("%d batches for %d blocks, want %d", len(batches), len(state), want)
	}
	m := newMirror()
	seen := map[kvevent.EngineHash]bool{}
	orphans := 0
	for _, rb := range batches {
		if rb.seq != watermark {
			t.Fatalf("batch seq %d, want watermark %d", rb.seq, watermark)
		}
		if rb.batch.Blocks() > 3 { // 2 blocks plus their tokenless Host replicas at most
			t.Fatalf("batch with %d hashes exceeds SnapshotBatchBlocks", rb.batch.Blocks())
		}
		for _, ev := range rb.batch.Events {
			if ev.Kind != kvevent.BlockStored {
				t.Fatalf("snapshot carries %v", ev.Kind)
			}
			if len(ev.TokenIDs) > 0 && ev.HasParent && !seen[ev.ParentHash] {
				if ev.ParentHash != chain[0] {
					t.Fatalf("block %x arrives before its parent %x", ev.BlockHashes[0], ev.ParentHash)
				}
				orphans++
			}
			for _, h := range ev.BlockHashes {
				seen[h] = true
			}
		}
		m.apply(t, rb.batch, testBS)
	}
	if orphans != 1 {
		t.Fatalf("%d orphan chains in the snapshot, want 1", orphans)
	}
	m.equal(t, state)
	if !slices.EqualFunc(m.order, state, func(h kvevent.EngineHash, s BlockState) bool { return h == s.Hash }) {
		t.Fatal("snapshot order differs from State order")
	}
}

// R-WIRE-3: before any live message there is no watermark: the reply is
// the end marker alone.
func TestEmptySnapshotIsEndMarkerOnlyRWIRE3(t *testing.T) {
	e := startEngine(t, Config{})
	p := newPeer(t, e, 0)
	batches, ended := p.snapshot(0, recvTimeout)
	if !ended || len(batches) != 0 {
		t.Fatalf("fresh engine answered %d batches, ended=%v", len(batches), ended)
	}
	// Cleared state after a message still has a watermark and no blocks.
	must(t, e.Clear(0))
	if m := p.liveOK(); m.batch.Events[0].Kind != kvevent.AllBlocksCleared {
		t.Fatalf("clear sent %v", m.batch.Events[0].Kind)
	}
	batches, ended = p.snapshot(0, recvTimeout)
	if !ended || len(batches) != 0 {
		t.Fatalf("empty engine answered %d batches, ended=%v", len(batches), ended)
	}
}

// R-REC-1, R-DISC-5: a restart keeps both ports, forgets the cache and
// starts the sequence at 0 again; the subscriber's socket reconnects.
func TestRestartResetsSeqKeepsPortsRREC1(t *testing.T) {
	e := startEngine(t, Config{DPSize: 2})
	p := newPeer(t, e, 1)
	evEP, rpEP := e.EventEndpoint(1), e.ReplayEndpoint(1)
	if strings.HasSuffix(evEP, ":0") || strings.HasSuffix(rpEP, ":0") {
		t.Fatalf("endpoints %s %s keep port 0", evEP, rpEP)
	}
	for i := 0; i < 3; i++ {
		_, _, err := e.Prefill(1, tokens(uint32(10*i), testBS))
		must(t, err)
		if m := p.liveOK(); m.seq != uint64(i) || m.batch.DPRank != 1 {
			t.Fatalf("seq %d rank %d, want %d 1", m.seq, m.batch.DPRank, i)
		}
	}

	must(t, e.Restart())
	if e.EventEndpoint(1) != evEP || e.ReplayEndpoint(1) != rpEP {
		t.Fatalf("endpoints moved: %s %s -> %s %s", evEP, rpEP, e.EventEndpoint(1), e.ReplayEndpoint(1))
	}
	if s := e.Seq(1); s != 0 || len(e.State(1)) != 0 {
		t.Fatalf("after restart seq %d with %d blocks", s, len(e.State(1)))
	}
	p.waitSubscribed(1)
	prompt := tokens(0, testBS)
	dev, _, err := e.Prefill(1, prompt)
	must(t, err)
	if dev != 0 {
		t.Fatalf("restarted engine reused %d tokens", dev)
	}
	if m := p.liveOK(); m.seq != 0 {
		t.Fatalf("first message after restart has seq %d", m.seq)
	}
	batches, ended := p.snapshot(0, recvTimeout)
	if !ended || len(batches) != 1 || batches[0].seq != 0 {
		t.Fatalf("snapshot after restart: %d batches, ended=%v", len(batches), ended)
	}
}

// R-IDX-4: each DP rank has its own cache, sockets, sequence and rank tag.
func TestDPRanksIsolatedRIDX4(t *testing.T) {
	e := startEngine(t, Config{DPSize: 2})
	p0, p1 := newPeer(t, e, 0), newPeer(t, e, 1)
	if e.EventEndpoint(0) == e.EventEndpoint(1) {
		t.Fatal("ranks share an endpoint")
	}
	_, _, err := e.Prefill(1, tokens(0, 2*testBS))
	must(t, err)
	if m := p1.liveOK(); m.seq != 0 || m.batch.DPRank != 1 {
		t.Fatalf("rank 1 message seq %d rank %d", m.seq, m.batch.DPRank)
	}
	p0.noLive()
	if d, h := e.Oracle(0, tokens(0, 2*testBS)); d != 0 || h != 0 || len(e.State(0)) != 0 {
		t.Fatalf("rank 0 sees rank 1's blocks: %d/%d", d, h)
	}
	if _, _, err := e.Prefill(2, nil); err == nil {
		t.Fatal("prefill on rank 2 of 2 succeeded")
	}
}

// R-DISC-2: bind addresses derive from the HTTP port plus offsets and dp.
func TestDiscoveryEndpointsRDISC2(t *testing.T) {
	ev, rp, err := DiscoveryEndpoints("127.0.0.1:8000", 2, DefaultEventPortOffset, DefaultReplayPortOffset)
	must(t, err)
	if !slices.Equal(ev, []string{"tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001"}) ||
		!slices.Equal(rp, []string{"tcp://127.0.0.1:38000", "tcp://127.0.0.1:38001"}) {
		t.Fatalf("events %v replay %v", ev, rp)
	}
	if _, _, err := DiscoveryEndpoints("127.0.0.1:35535", 2, 0, 30000); err == nil {
		t.Fatal("port 65536 accepted (R-DISC-6)")
	}
	if _, _, err := DiscoveryEndpoints("no-port", 1, 0, 0); err == nil {
		t.Fatal("address without port accepted")
	}
}

// R-WIRE-2: the other field shapes carry the same events.
func TestShapesDecodeAlikeRWIRE2(t *testing.T) {
	shapes := []kvevent.Shape{
		{},
		{BatchAsMap: true, EventsAsArrays: true, Hashes: kvevent.HashInt64, UpperMedium: true},
		{Hashes: kvevent.HashBytes8, OmitDPRank: true},
	}
	var first []kvevent.EngineHash
	for i, s := range shapes {
		e := startEngine(t, Config{Shape: s, HashSeed: 7})
		p := newPeer(t, e, 0)
		_, _, err := e.Prefill(0, tokens(3, 3*testBS))
		must(t, err)
		ev := p.liveOK().batch.Events[0]
		if i == 0 {
			first = ev.BlockHashes
		} else if !slices.Equal(ev.BlockHashes, first) {
			t.Fatalf("shape %+v: hashes %x, want %x", s, ev.BlockHashes, first)
		}
	}
}

// Engines are deterministic: the same seed and prompts give the same
// hashes and payload bytes, a different seed different hashes.
func TestDeterministicHashes(t *testing.T) {
	fixed := time.Unix(1700000000, 0)
	clock := func() time.Time { return fixed }
	var payloads [][]byte
	var hashes [][]kvevent.EngineHash
	for _, seed := range []uint64{1, 1, 2} {
		e := startEngine(t, Config{HashSeed: seed, Clock: clock})
		p := newPeer(t, e, 0)
		_, _, err := e.Prefill(0, tokens(42, 2*testBS))
		must(t, err)
		m := p.liveOK()
		payloads = append(payloads, m.payload)
		hashes = append(hashes, m.batch.Events[0].BlockHashes)
	}
	if !bytes.Equal(payloads[0], payloads[1]) {
		t.Fatal("same inputs gave different payloads")
	}
	if slices.Equal(hashes[0], hashes[2]) {
		t.Fatal("different seeds gave the same hashes")
	}
}

// Operations on a closed engine fail cleanly; Close is idempotent.
func TestClosedEngine(t *testing.T) {
	e, err := New(Config{})
	must(t, err)
	if _, _, err := e.Prefill(0, nil); !isNotRunning(err) {
		t.Fatalf("prefill before start: %v", err)
	}
	must(t, e.Start())
	must(t, e.Close())
	must(t, e.Close())
	if err := e.SkipSeq(0, 1); !isNotRunning(err) {
		t.Fatalf("skip after close: %v", err)
	}
	if _, err := New(Config{DPSize: 2, EventEndpoints: []string{AnyPort}}); err == nil {
		t.Fatal("one endpoint for two ranks accepted")
	}
}

// R-REC-1: an engine started again after Close comes back on the same
// ports with a fresh sequence.
func TestStartAfterCloseKeepsPortsRREC1(t *testing.T) {
	e := startEngine(t, Config{})
	evEP := e.EventEndpoint(0)
	_, _, err := e.Prefill(0, tokens(0, testBS))
	must(t, err)
	must(t, e.Close())
	must(t, e.Start())
	if e.EventEndpoint(0) != evEP {
		t.Fatalf("endpoint moved from %s to %s", evEP, e.EventEndpoint(0))
	}
	p := newPeer(t, e, 0)
	_, _, err = e.Prefill(0, tokens(0, testBS))
	must(t, err)
	if m := p.liveOK(); m.seq != 0 {
		t.Fatalf("seq %d after start, want 0", m.seq)
	}
}
