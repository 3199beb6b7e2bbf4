package enginesim

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// R-REC-3: SkipSeq leaves a gap on the wire.
func TestSkipSeqMakesGapRREC3(t *testing.T) {
	e := startEngine(t, Config{})
	p := newPeer(t, e, 0)
	_, _, err := e.Prefill(0, tokens(0, testBS))
	must(t, err)
	first := p.liveOK().seq
	must(t, e.SkipSeq(0, 5))
	_, _, err = e.Prefill(0, tokens(100, testBS))
	must(t, err)
	if got := p.liveOK().seq; got != first+6 {
		t.Fatalf("seq after skip %d, want %d", got, first+6)
	}
	// The snapshot watermark is the last seq really sent.
	batches, ended := p.snapshot(0, recvTimeout)
	if !ended || len(batches) == 0 || batches[0].seq != first+6 {
		t.Fatalf("snapshot after skip: %d batches, ended=%v", len(batches), ended)
	}
}

// R-REC-3: PrefillLost changes the cache and uses a sequence number but
// delivers nothing, so the next message shows a gap, and the snapshot's
// watermark covers the lost message and its blocks.
func TestPrefillLostIsARealLossRREC3(t *testing.T) {
	e := startEngine(t, Config{})
	p := newPeer(t, e, 0)
	_, _, err := e.Prefill(0, tokens(0, testBS))
	must(t, err)
	first := p.liveOK().seq
	lost := tokens(1000, 2*testBS)
	_, _, err = e.PrefillLost(0, lost)
	must(t, err)
	p.noLive()
	if dev, _ := e.Oracle(0, lost); dev != len(lost) {
		t.Fatalf("the lost prefill left %d device tokens of %d cached", dev, len(lost))
	}
	_, _, err = e.Prefill(0, tokens(2000, testBS))
	must(t, err)
	if got := p.liveOK().seq; got != first+2 {
		t.Fatalf("seq after a lost message %d, want %d", got, first+2)
	}
	batches, ended := p.snapshot(0, recvTimeout)
	if !ended || len(batches) == 0 || batches[0].seq != first+2 {
		t.Fatalf("snapshot after the loss: %d batches, ended=%v", len(batches), ended)
	}
	m := newMirror()
	for _, b := range batches {
		m.apply(t, b.batch, testBS)
	}
	if len(m.blocks) != 4 {
		t.Fatalf("snapshot holds %d blocks, want the 4 stored, lost ones included", len(m.blocks))
	}
	// A prompt that changes nothing loses nothing.
	_, _, err = e.PrefillLost(0, lost)
	must(t, err)
	_, _, err = e.Prefill(0, tokens(3000, testBS))
	must(t, err)
	if got := p.liveOK().seq; got != first+3 {
		t.Fatalf("seq after a lost no-op %d, want %d", got, first+3)
	}
}

// R-REC-3: a corrupt payload goes out verbatim under the next seq and
// fails to decode; an oversize one is well formed but over the limit.
func TestRawAndOversizePayloadsRREC3(t *testing.T) {
	e := startEngine(t, Config{})
	p := newPeer(t, e, 0)
	junk := []byte{0xc1, 0xff, 0x00}
	must(t, e.SendRaw(0, junk))
	m := p.live()
	if m.seq != 0 || !bytes.Equal(m.payload, junk) || !errors.Is(m.err, kvevent.ErrMalformed) {
		t.Fatalf("raw message seq %d payload %x err %v", m.seq, m.payload, m.err)
	}

	const size = 64 << 10
	must(t, e.SendOversize(0, size))
	m = p.liveOK()
	if m.seq != 1 || len(m.payload) < size {
		t.Fatalf("oversize message seq %d is %d bytes, want >= %d", m.seq, len(m.payload), size)
	}
	var b kvevent.Batch
	if err := kvevent.NewDecoder(size/2).DecodeBatch(m.payload, &b); !errors.Is(err, kvevent.ErrTooLarge) {
		t.Fatalf("bounded decoder accepted the oversize batch: %v", err)
	}
	if len(e.State(0)) != 0 {
		t.Fatal("phantom messages changed the cache")
	}
}

// R-CFG-4: wrong rank and wrong block size are visible in the batch, and
// reverting the fault restores the true values.
func TestWrongRankAndBlockSizeRCFG4(t *testing.T) {
	e := startEngine(t, Config{DPSize: 2})
	p := newPeer(t, e, 1)
	must(t, e.SetWrongDPRank(1, true))
	must(t, e.SetWrongBlockSize(1, true))
	prompt := tokens(0, 2*testBS)
	_, _, err := e.Prefill(1, prompt)
	must(t, err)
	m := p.liveOK()
	ev := m.batch.Events[0]
	if m.batch.DPRank != 2 || ev.BlockSize != 2*testBS || len(ev.TokenIDs) != 2*len(prompt) || len(ev.BlockHashes) != 2 {
		t.Fatalf("faulty batch rank %d block size %d with %d tokens", m.batch.DPRank, ev.BlockSize, len(ev.TokenIDs))
	}
	batches, _ := p.snapshot(0, recvTimeout)
	if len(batches) != 1 || batches[0].batch.DPRank != 2 || batches[0].batch.Events[0].BlockSize != 2*testBS {
		t.Fatal("snapshot does not carry the faults")
	}

	must(t, e.SetWrongDPRank(1, false))
	must(t, e.SetWrongBlockSize(1, false))
	_, _, err = e.Prefill(1, tokens(50, testBS))
	must(t, err)
	m = p.liveOK()
	if m.batch.DPRank != 1 || m.batch.Events[0].BlockSize != testBS {
		t.Fatalf("after revert rank %d block size %d", m.batch.DPRank, m.batch.Events[0].BlockSize)
	}
}

// R-IDX-5: SendUnknownParent announces a block whose parent was never
// stored.
func TestUnknownParentRIDX5(t *testing.T) {
	e := startEngine(t, Config{})
	p := newPeer(t, e, 0)
	m := newMirror()
	_, _, err := e.Prefill(0, tokens(0, 2*testBS))
	must(t, err)
	m.apply(t, p.liveOK().batch, testBS)
	must(t, e.SendUnknownParent(0))
	msg := p.liveOK()
	ev := msg.batch.Events[0]
	if msg.seq != 1 || ev.Kind != kvevent.BlockStored || !ev.HasParent || len(ev.TokenIDs) != testBS {
		t.Fatalf("unknown-parent message seq %d event %+v", msg.seq, ev)
	}
	if m.blocks[ev.ParentHash] != nil {
		t.Fatalf("parent %x is known", ev.ParentHash)
	}
	m.equal(t, e.State(0)) // the cache itself is unchanged
}

// R-REC-4: with drop-tail the cache changes, nothing is published and the
// seq stays; the snapshot holds the new blocks under the old watermark.
func TestDropTailOnlySnapshotShowsItRREC4(t *testing.T) {
	e := startEngine(t, Config{})
	p := newPeer(t, e, 0)
	m := newMirror()
	_, _, err := e.Prefill(0, tokens(0, testBS))
	must(t, err)
	m.apply(t, p.liveOK().batch, testBS)

	must(t, e.SetDropTail(0, true))
	_, _, err = e.Prefill(0, tokens(1000, 2*testBS))
	must(t, err)
	p.noLive()
	if s := e.Seq(0); s != 1 {
		t.Fatalf("seq moved to %d while dropping", s)
	}
	if len(e.State(0)) != 3 {
		t.Fatalf("cache holds %d blocks, want 3", len(e.State(0)))
	}

	batches, ended := p.snapshot(0, recvTimeout)
	if !ended {
		t.Fatal("snapshot did not end")
	}
	snap := newMirror()
	for _, b := range batches {
		if b.seq != 0 {
			t.Fatalf("watermark %d, want 0", b.seq)
		}
		snap.apply(t, b.batch, testBS)
	}
	snap.equal(t, e.State(0))
	if len(m.blocks) == len(snap.blocks) {
		t.Fatal("live view already equals the snapshot")
	}
}

// R-WIRE-3, R-REC-5: each replay fault shows on the wire.
func TestReplayModesRREC5(t *testing.T) {
	e := startEngine(t, Config{SnapshotBatchBlocks: 1})
	p := newPeer(t, e, 0)
	_, _, err := e.Prefill(0, tokens(0, 3*testBS))
	must(t, err)
	p.liveOK()

	full, ended := p.snapshot(0, recvTimeout)
	if !ended || len(full) != 3 {
		t.Fatalf("normal snapshot: %d batches, ended=%v", len(full), ended)
	}

	must(t, e.SetReplayMode(0, ReplayNeverEnd))
	got, ended := p.snapshot(0, quietWait)
	if ended || len(got) != 3 {
		t.Fatalf("never-end: %d batches, ended=%v", len(got), ended)
	}

	must(t, e.SetReplayMode(0, ReplayGapInMiddle))
	got, ended = p.snapshot(0, recvTimeout)
	if !ended || len(got) != 2 || got[0].batch.Events[0].BlockHashes[0] != full[0].batch.Events[0].BlockHashes[0] ||
		got[1].batch.Events[0].BlockHashes[0] != full[2].batch.Events[0].BlockHashes[0] {
		t.Fatalf("gap-in-middle: %d batches, ended=%v", len(got), ended)
	}

	must(t, e.SetReplayMode(0, ReplayIgnore))
	got, ended = p.snapshot(0, quietWait)
	if ended || len(got) != 0 {
		t.Fatalf("ignore: %d batches, ended=%v", len(got), ended)
	}
}

// R-REC-2: a slow snapshot keeps its watermark while live messages flow
// past it, and ends after one delay per reply.
func TestSlowReplayInterleavesLiveRREC2(t *testing.T) {
	const delay = 40 * time.Millisecond
	e := startEngine(t, Config{SnapshotBatchBlocks: 1})
	p := newPeer(t, e, 0)
	_, _, err := e.Prefill(0, tokens(0, 2*testBS))
	must(t, err)
	p.liveOK()
	must(t, e.SetReplayMode(0, ReplaySlow))
	must(t, e.SetReplayDelay(0, delay))

	start := time.Now()
	if _, err := p.dealer.SendMessage(kvevent.ReplayRequest(0)); err != nil {
		t.Fatal(err)
	}
	var replies int
	for {
		frames, ok := recvOn(t, p.dealer, recvTimeout)
		if !ok {
			t.Fatal("slow snapshot stalled")
		}
		seq, _, end, err := kvevent.ParseReplay(frames)
		must(t, err)
		replies++
		if end {
			break
		}
		if seq != 0 {
			t.Fatalf("slow snapshot batch has seq %d, want watermark 0", seq)
		}
		if replies == 1 {
			// The request has been taken: a Prefill now is served while
			// the rest of the snapshot is still pending.
			_, _, err = e.Prefill(0, tokens(900, testBS))
			must(t, err)
			if m := p.liveOK(); m.seq != 1 {
				t.Fatalf("live seq %d during snapshot, want 1", m.seq)
			}
		}
	}
	if replies != 3 {
		t.Fatalf("%d replies, want 2 batches and the end marker", replies)
	}
	if d := time.Since(start); d < 3*delay {
		t.Fatalf("slow snapshot took %v, want >= %v", d, 3*delay)
	}
}

// R-REC-1: a live AllBlocksCleared + full state batch rebuilds a view.
func TestSendFullStateRWIRE4(t *testing.T) {
	e := startEngine(t, Config{DeviceBlocks: 3, HostBlocks: 3})
	for i := 0; i < 3; i++ {
		_, _, err := e.Prefill(0, tokens(uint32(100*i), 2*testBS))
		must(t, err)
	}
	p := newPeer(t, e, 0) // joins late: saw none of the above
	must(t, e.SendFullState(0))
	msg := p.liveOK()
	if msg.seq != 3 || msg.batch.Events[0].Kind != kvevent.AllBlocksCleared {
		t.Fatalf("full state seq %d first event %v", msg.seq, msg.batch.Events[0].Kind)
	}
	m := newMirror()
	m.apply(t, msg.batch, testBS)
	m.equal(t, e.State(0))
}
