package kvdir

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// snapshot is one replay attempt: a fresh index being filled from the
// engine's full state while live deltas queue beside it (R-REC-2).
type snapshot struct {
	rep      *kvtransport.Replayer
	deadline time.Time
	started  time.Time
	// firstReply is when the first reply batch arrived.
	firstReply time.Time
	idx        *kvindex.Index
	// calibrate is true for a periodic resync of a synchronised stream,
	// which keeps serving its current view until the new one is ready.
	calibrate bool

	// requested is false until the request has gone out: it is sent
	// once the connection is up, within the snapshot's deadline.
	requested bool

	haveWatermark bool
	watermark     uint64
	batches       int

	buffered      []bufferedBatch
	bufferedBytes int
}

type bufferedBatch struct {
	seq   uint64
	batch *kvevent.Batch
}

func (y *syncer) startSnapshot(calibrate bool) {
	rep, err := y.tctx.DialReplay(y.s.spec.ReplayEndpoint, kvtransport.ReplayOptions{
		MaxMessageBytes: int64(y.lim.MaxMessageBytes),
		ReceiveHWM:      y.lim.receiveHWM(),
	})
	requested := false
	if err == nil {
		requested, err = sendReplayRequest(rep)
		if err != nil {
			rep.Close()
		}
	}
	now := time.Now()
	if err != nil {
		y.s.counters.snapshotsFailed.Add(1)
		if !calibrate {
			y.fail(fmt.Sprintf("snapshot request: %v", err))
		}
		y.pause(now)
		y.nextResync = time.Time{}
		return
	}
	y.s.counters.snapshotsStarted.Add(1)
	y.snap = &snapshot{
		rep:       rep,
		started:   now,
		deadline:  now.Add(y.lim.ReplayTimeout),
		calibrate: calibrate,
		idx:       y.newIndex(),
		requested: requested,
	}
	y.retryAt = time.Time{}
	// The snapshot's end sets the next calibration (synchronised, or
	// snapshotFailed for a calibration). Left in the past meanwhile, it
	// would make every wait of the snapshot return at once.
	y.nextResync = time.Time{}
	if !calibrate {
		y.setReason("snapshot in progress")
	}
}

// sendReplayRequest asks for the engine's full state; sent is false while
// the connection is not up yet. The engine answers with its current full
// state whatever the start sequence (R-WIRE-3); 0 asks for everything.
func sendReplayRequest(rep *kvtransport.Replayer) (sent bool, err error) {
	err = rep.Send(kvevent.ReplayRequest(0))
	if errors.Is(err, kvtransport.ErrNotConnected) {
		return false, nil
	}
	return err == nil, err
}

// retryRequest sends the request of a snapshot whose connection was not
// up when it started.
func (y *syncer) retryRequest() {
	if y.snap == nil || y.snap.requested {
		return
	}
	sent, err := sendReplayRequest(y.snap.rep)
	if err != nil {
		y.snapshotFailed(fmt.Sprintf("snapshot request: %v", err))
		return
	}
	y.snap.requested = sent
}

// newIndex returns an empty index for a new view, with room for what the
// stream's view holds or last held (kvindex.Reserve): an engine's state
// changes little between two snapshots of it.
func (y *syncer) newIndex() *kvindex.Index {
	ix := kvindex.New(kvindex.Config{
		BlockSize: y.s.spec.BlockSize,
		HashSeed:  y.s.spec.HashSeed,
		MaxBlocks: y.lim.MaxBlocksPerStream,
	})
	ix.Reserve(y.s.viewSize())
	return ix
}

// setReason updates the reason of an unsynchronised stream without
// touching its view.
func (y *syncer) setReason(reason string) {
	y.s.mu.Lock()
	if !y.s.synced {
		y.s.reason = reason
		y.s.syncView()
	}
	y.s.mu.Unlock()
}

// drainReplay takes the replay socket's replies, up to drainMax, and
// gives large decode storage back to the pool unless more replies wait.
func (y *syncer) drainReplay() {
	if y.replayDrained() {
		y.releaseBatch()
	}
}

// replayDrained reports whether the drain stopped because no reply is
// left: none queued, or the snapshot or catch-up ended or failed.
func (y *syncer) replayDrained() bool {
	if y.s.spec.ordered() {
		for range drainMax {
			if y.ord.cu == nil {
				return true
			}
			frames, err := y.ord.cu.rep.Recv()
			if err != nil {
				y.catchUpFailedNow(fmt.Sprintf("replay receive: %v", err))
				return true
			}
			if frames == nil {
				return true
			}
			y.orderedReplay(frames)
			y.trimBatch()
		}
		return y.ord.cu == nil
	}
	for range drainMax {
		if y.snap == nil {
			return true
		}
		frames, err := y.snap.rep.Recv()
		if err != nil {
			y.snapshotFailed(fmt.Sprintf("snapshot receive: %v", err))
			return true
		}
		if frames == nil {
			return true
		}
		y.onReplay(frames)
		y.trimBatch()
	}
	return y.snap == nil
}

func (y *syncer) onReplay(frames [][]byte) {
	sn := y.snap
	seq, payload, end, err := kvevent.ParseReplay(frames)
	if err != nil {
		y.s.counters.decodeErrors.Add(1)
		y.snapshotFailed(fmt.Sprintf("bad snapshot frame: %v", err))
		return
	}
	if end {
		y.finishSnapshot()
		return
	}
	// Every batch of one snapshot carries its watermark; an engine that
	// numbers its batches must number them consecutively. Anything else
	// means a reply was dropped on the way (the ROUTER drops past HWM).
	if sn.haveWatermark && seq != sn.watermark && seq != sn.watermark+1 {
		y.snapshotFailed(fmt.Sprintf("snapshot sequence jumped from %d to %d", sn.watermark, seq))
		return
	}
	sn.haveWatermark, sn.watermark = true, seq
	if sn.batches == 0 {
		sn.firstReply = time.Now()
	}
	sn.batches++
	if err := y.decodeBatch(payload); err != nil {
		y.s.counters.decodeErrors.Add(1)
		y.snapshotFailed(fmt.Sprintf("snapshot batch %d: decode: %v", sn.batches, err))
		return
	}
	if err := checkRank(&y.batch, y.s.spec); err != nil {
		y.snapshotFailed(fmt.Sprintf("snapshot batch %d: %v", sn.batches, err))
		return
	}
	if i, err := applyEvents(sn.idx, y.batch.Events, kvindex.Snapshot); err != nil {
		y.snapshotFailed(fmt.Sprintf("snapshot batch %d event %d: %v", sn.batches, i, y.limitErr(err)))
		return
	}
	y.s.counters.countEvents(&y.batch)
}

// bufferLive queues the live delta in y.batch, which arrived during a
// snapshot, within max_buffered_bytes counted as wire bytes plus decoded
// size (R-REC-2).
func (y *syncer) bufferLive(seq uint64, wireBytes int) {
	sn := y.snap
	cost := wireBytes + y.batch.DecodedBytes()
	if sn.bufferedBytes+cost > y.lim.MaxBufferedBytes {
		y.snapshotFailed(fmt.Sprintf("live deltas during snapshot exceeded max_buffered_bytes (%d)", y.lim.MaxBufferedBytes))
		return
	}
	sn.bufferedBytes += cost
	y.s.counters.bufferedBytes.Add(int64(cost))
	sn.buffered = append(sn.buffered, bufferedBatch{seq: seq, batch: y.batch.Clone()})
	y.s.counters.bufferedBatches.Add(1)
}

// finishSnapshot merges the buffered deltas after the watermark into the
// new index and publishes it in one step.
func (y *syncer) finishSnapshot() {
	sn := y.snap
	// Without a watermark the engine had published nothing, so its next
	// message is sequence 0; only an engine seen breaking that rule
	// repeatedly gets any next sequence accepted.
	next, any := uint64(0), !sn.haveWatermark && y.emptyGaps >= emptySnapshotTolerance
	if sn.haveWatermark {
		next = sn.watermark + 1
	}
	applied := sn.haveWatermark
	for _, bb := range sn.buffered {
		if sn.haveWatermark && bb.seq <= sn.watermark {
			y.s.counters.coveredBatches.Add(1)
			continue // already reflected in the snapshot
		}
		if !any && bb.seq != next {
			y.s.counters.gaps.Add(1)
			if !sn.haveWatermark {
				y.emptyGaps++
			}
			y.snapshotFailed(fmt.Sprintf("live deltas after snapshot watermark %d: %s", sn.watermark, seqFault(next, bb.seq)))
			return
		}
		any = false
		if _, err := applyEvents(sn.idx, bb.batch.Events, kvindex.Delta); err != nil {
			y.snapshotFailed(fmt.Sprintf("merging live delta %d: %v", bb.seq, y.limitErr(err)))
			return
		}
		y.s.counters.countEvents(bb.batch)
		y.s.counters.lastApplied.Store(time.Now().UnixNano())
		y.s.counters.batchesApplied.Add(1)
		next, applied = bb.seq+1, true
	}
	published := uint64(0)
	if applied {
		published = next - 1
	}
	if sn.calibrate {
		y.s.obs.observeDrift(drift(y.s.idx, sn.idx))
	}
	y.adoptKeys(sn.idx)
	y.releaseSnapshot()
	y.s.counters.snapshotsOK.Add(1)
	y.s.counters.lastSnapshot.Store(int64(time.Since(sn.started)))
	y.s.obs.observeSnapshot(time.Since(sn.started))
	if sn.batches > 0 {
		y.s.counters.lastSnapshotReceive.Store(int64(time.Since(sn.firstReply)))
	}
	y.synchronised(sn.idx, published, applied, next, any, fmt.Sprintf("snapshot of %d batches in %v", sn.batches, time.Since(sn.started).Round(time.Millisecond)))
}

// adoptKeys gives the orphans of ix, a full state about to be served,
// the keys the view it replaces knew: the served one, or the one the
// fault it recovers from withdrew. A block whose parent is evicted is an
// orphan in a full state, and needs its key the moment the parent is
// stored again, which does not announce the block anew. An engine hash
// names the content however stale the view.
func (y *syncer) adoptKeys(ix *kvindex.Index) {
	known := y.s.idx
	if known == nil {
		known = y.withdrawn
	}
	ix.AdoptKeys(known)
}

// emptySnapshotTolerance is how many times an empty snapshot may be
// followed by a first sequence other than 0 before the stream stops
// expecting 0 after one: an engine that answers without a watermark
// although it has published would otherwise resynchronise forever.
const emptySnapshotTolerance = 2

// synchronised publishes ix as the stream's view and resets the live
// sequence tracking. seq is the last sequence the view reflects when
// hasSeq; next is the sequence expected next, or any when expectAny.
func (y *syncer) synchronised(ix *kvindex.Index, seq uint64, hasSeq bool, next uint64, expectAny bool, how string) {
	y.s.publish(ix, seq, hasSeq, true)
	y.withdrawn = nil // a view is served again: at most two indexes
	y.expected, y.expectAny = next, expectAny
	y.dedupUpTo, y.dedupActive = seq, hasSeq
	y.emptySnapshot = !hasSeq
	if hasSeq {
		y.emptyGaps = 0
	}
	y.backoff = 0
	y.retryAt = time.Time{}
	y.nextResync = time.Time{}
	if y.lim.ResyncInterval > 0 {
		y.nextResync = y.resyncAt(time.Now())
	}
	if y.lastReason != "" {
		d, h := ix.Counts()
		y.log.Info("stream synchronised", "stream", y.s.spec.String(), "sequence", seq,
			"device_blocks", d, "host_blocks", h, "by", how)
		y.lastReason = ""
	}
}

// snapshotFailed abandons the attempt and schedules a retry with backoff.
// A failed calibration leaves the served view alone.
func (y *syncer) snapshotFailed(reason string) {
	calibrate := y.snap != nil && y.snap.calibrate
	y.abortSnapshot()
	y.s.counters.snapshotsFailed.Add(1)
	now := time.Now()
	if calibrate {
		y.log.Warn("calibration snapshot failed; keeping the current view", "stream", y.s.spec.String(), "reason", reason)
		y.nextResync = y.resyncAt(now)
		return
	}
	y.invalidate(reason)
	y.pause(now)
}

func (y *syncer) abortSnapshot() {
	if y.snap == nil {
		return
	}
	y.releaseSnapshot()
}

func (y *syncer) releaseSnapshot() {
	sn := y.snap
	y.snap = nil
	y.s.counters.bufferedBytes.Add(-int64(sn.bufferedBytes))
	if sn.rep == nil {
		return
	}
	if err := sn.rep.Close(); err != nil {
		y.log.Debug("close replay socket", "stream", y.s.spec.String(), "err", err)
	}
}

// drift counts the block replicas the calibrated index holds that the
// served one lacks (added) and the reverse (removed). Both reflect the
// same sequence, so any difference is an event the live channel lost
// (R-REC-4). The served index is only written by this goroutine, so it
// is read here without its lock.
func drift(served, calibrated *kvindex.Index) (added, removed int) {
	if served == nil {
		return 0, 0
	}
	diff := func(from, to *kvindex.Index) (n int) {
		from.ForEach(func(h kvevent.EngineHash, _ kvindex.Key, dev, host bool) {
			tdev, thost, _ := to.Lookup(h)
			if dev && !tdev {
				n++
			}
			if host && !thost {
				n++
			}
		})
		return n
	}
	return diff(calibrated, served), diff(served, calibrated)
}
