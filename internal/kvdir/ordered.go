package kvdir

import (
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// ordered is the state of a stream in history or live mode. Such an
// engine never sends its whole state: its replay endpoint, if it has
// one, sends the batches it still buffers. The view is therefore built
// by applying batches in sequence order, from the live channel and from
// replays alike, to an index that starts empty wherever the sequence
// could be picked up:
//
//   - from the engine's sequence 0 (a history that reaches back to it, or
//     a live stream that saw it), or past an AllBlocksCleared, the view
//     is complete;
//   - from any later batch it is partial: blocks stored before are
//     missing, and their children are orphans (kvindex.History), so the
//     view under-reports and never over-reports.
//
// Every batch is applied exactly once, in order. A live message past the
// next expected sequence is a gap: history mode withdraws the view and
// asks the replay endpoint for the missing batches, keeping the view as
// the base; when the history no longer holds them (its first batch is
// past the one needed), or in live mode, the view restarts empty at the
// first batch there is. A live sequence at or below the last live
// sequence received is a restarted publisher: the view restarts too; so,
// in history mode, is a first live message below a view built from the
// history alone, which may be one.
type ordered struct {
	// idx is the view, nil before one started; when serving it is also
	// the stream's published index and is written under the stream lock.
	idx      *kvindex.Index
	expected uint64 // next sequence the view needs
	complete bool
	serving  bool
	// trusted is true once the view reflects something the engine sent:
	// a batch applied, or a replay that ended.
	trusted bool

	// lastLive is the last live sequence received since the subscription
	// was made; a live message at or below it is a restarted publisher.
	lastLive     uint64
	haveLastLive bool

	cu *catchUp
	// buffered holds live messages past expected while a replay fills
	// the hole, within max_buffered_bytes.
	buffered      []bufferedBatch
	bufferedBytes int
	// replayFailed is set when a replay that was to fill a hole failed;
	// until one succeeds, holes restart the view instead of waiting.
	replayFailed bool
}

// catchUp is one history replay in flight.
type catchUp struct {
	rep       *kvtransport.Replayer
	start     uint64
	requested bool
	started   time.Time
	deadline  time.Time
	// tail is a calibration: the view keeps being served meanwhile and
	// the replay only adds batches the live channel lost.
	tail    bool
	batches int
}

func (y *syncer) isHistory() bool { return y.s.spec.SyncMode() == config.SyncHistory }

// orderedFresh starts an empty view that needs sequence next next.
// complete says whether nothing the engine holds can predate it (next is
// 0); a partial start is counted.
func (y *syncer) orderedFresh(next uint64, complete bool) {
	h := &y.ord
	if h.serving {
		// The old view leaves service; the new one is published once it
		// reflects something.
		h.serving = false
		y.s.invalidate("view restarting")
	}
	h.idx = y.newIndex()
	h.expected, h.complete, h.trusted = next, complete, false
	if !complete {
		y.s.counters.partialStarts.Add(1)
	}
}

// orderedReset drops the view and everything in flight: after a lost
// link or when the engine is deaf to this stream's topic.
func (y *syncer) orderedReset() {
	h := &y.ord
	y.abortCatchUp()
	y.dropBuffered()
	h.idx, h.serving, h.trusted, h.complete = nil, false, false, false
	h.haveLastLive = false
	h.replayFailed = false
}

func (y *syncer) dropBuffered() {
	h := &y.ord
	y.s.counters.bufferedBytes.Add(-int64(h.bufferedBytes))
	clear(h.buffered)
	h.buffered, h.bufferedBytes = h.buffered[:0], 0
}

// orderedLive handles a decoded live message (in y.batch) in history or
// live mode.
func (y *syncer) orderedLive(seq uint64, wireBytes int) {
	h := &y.ord
	restarted := h.haveLastLive && seq <= h.lastLive
	// The first live message of a view built from history alone, below
	// what the view holds, is either a batch the replay also carried or
	// a publisher that restarted since (on a bound subscriber a restart
	// shows only so). Taken for the first it would keep the old
	// process's blocks, which the calibrations, replaying from the old
	// sequence on, never take back: history mode replays from 0 instead,
	// as for a restart, which costs a replay when it was the first.
	maybe := !h.haveLastLive && h.idx != nil && seq < h.expected && y.isHistory()
	h.lastLive, h.haveLastLive = seq, true
	switch {
	case h.idx == nil && !y.isHistory():
		// Live mode: the view starts at the first message there is.
		y.orderedFresh(seq, seq == 0)
		y.orderedApply(seq, &y.batch, false)
		y.orderedMaybePublish("first live message")
		return
	case h.idx == nil:
		// History mode without a view: ask for everything the engine
		// still holds, and keep this message for after it.
		y.orderedFresh(0, true)
		y.bufferOrdered(seq, wireBytes)
		y.ensureCatchUp()
		return
	case restarted || maybe:
		if restarted {
			y.s.counters.gaps.Add(1)
			y.log.Warn("publisher restarted", "stream", y.s.spec.String(), "last_sequence", h.expected, "sequence", seq)
		} else {
			y.log.Info("first live message below the view built from history: replaying from 0, as for a restart",
				"stream", y.s.spec.String(), "next_sequence", h.expected, "sequence", seq)
		}
		y.abortCatchUp()
		y.dropBuffered()
		if y.isHistory() && !h.replayFailed {
			y.orderedFresh(0, true)
			y.setReasonAfter("publisher restarted; replaying its history")
			y.bufferOrdered(seq, wireBytes)
			y.ensureCatchUp()
			return
		}
		y.orderedFresh(seq, seq == 0)
		y.orderedApply(seq, &y.batch, false)
		y.orderedMaybePublish("restarted publisher")
		return
	case seq < h.expected:
		// Already applied from a replay.
		y.s.counters.duplicates.Add(1)
		return
	case seq == h.expected && len(h.buffered) == 0 && (h.cu == nil || h.cu.tail):
		y.orderedApply(seq, &y.batch, false)
		y.orderedMaybePublish("live message")
		return
	case seq == h.expected:
		// A replay is filling the view: this message waits its turn.
		y.bufferOrdered(seq, wireBytes)
		return
	}
	// seq > expected (or the hole before earlier buffered messages).
	if len(h.buffered) == 0 {
		y.s.counters.gaps.Add(1)
	}
	if !y.isHistory() || h.replayFailed {
		// No history to fill the hole from: start again here.
		y.log.Warn("sequence gap; restarting the view", "stream", y.s.spec.String(), "expected", h.expected, "sequence", seq)
		y.dropBuffered()
		y.abortCatchUp()
		y.orderedFresh(seq, false)
		y.orderedApply(seq, &y.batch, false)
		y.orderedMaybePublish("live message after a gap")
		return
	}
	if h.serving {
		// R-REC-1: a hole may hide removals; serve nothing until it is
		// filled.
		h.serving = false
		y.s.invalidate(seqFault(h.expected, seq) + "; replaying history")
	}
	if h.cu != nil && h.cu.tail {
		h.cu.tail = false
	}
	if !y.bufferOrdered(seq, wireBytes) {
		return
	}
	y.ensureCatchUp()
}

// bufferOrdered keeps the live message in y.batch for after a replay,
// within max_buffered_bytes. Past the budget the replay is abandoned and
// the view restarts at this message; it reports false then.
func (y *syncer) bufferOrdered(seq uint64, wireBytes int) bool {
	h := &y.ord
	cost := wireBytes + y.batch.DecodedBytes()
	if h.bufferedBytes+cost > y.lim.MaxBufferedBytes {
		y.log.Warn("live messages during a history replay exceeded max_buffered_bytes; restarting the view",
			"stream", y.s.spec.String(), "max_buffered_bytes", y.lim.MaxBufferedBytes)
		y.abortCatchUp()
		y.dropBuffered()
		y.orderedFresh(seq, false)
		y.orderedApply(seq, &y.batch, false)
		y.orderedMaybePublish("live message past the buffer budget")
		return false
	}
	h.bufferedBytes += cost
	y.s.counters.bufferedBytes.Add(int64(cost))
	h.buffered = append(h.buffered, bufferedBatch{seq: seq, batch: y.batch.Clone()})
	y.s.counters.bufferedBatches.Add(1)
	return true
}

// orderedApply applies batch b at sequence seq to the view. A batch that
// cannot be applied (block size, capacity, rank) leaves the view without
// knowing what it did: the view restarts empty after it.
func (y *syncer) orderedApply(seq uint64, b *kvevent.Batch, fromReplay bool) {
	h := &y.ord
	err := checkRank(b, y.s.spec)
	if err == nil {
		err = y.applyOrdered(b)
	}
	if err != nil {
		y.orderedBadBatch(seq, err.Error())
		return
	}
	h.expected, h.trusted = seq+1, true
	for i := range b.Events {
		if b.Events[i].Kind == kvevent.AllBlocksCleared {
			// Everything after a clear is known: the view is whole.
			h.complete = true
		}
	}
	now := time.Now()
	y.s.counters.countEvents(b)
	y.s.counters.lastApplied.Store(now.UnixNano())
	y.s.counters.batchesApplied.Add(1)
	if h.serving {
		y.s.mu.Lock()
		y.s.seq, y.s.hasSeq, y.s.complete = seq, true, h.complete
		y.s.syncView()
		y.s.mu.Unlock()
	}
	if fromReplay && h.cu != nil && h.cu.tail {
		y.s.counters.tailRepairs.Add(1)
	}
	if !fromReplay {
		y.s.obs.observeLag(b.Timestamp, now)
	}
}

// applyOrdered applies the events of b to the view, under the stream lock
// when the view is published.
func (y *syncer) applyOrdered(b *kvevent.Batch) error {
	h := &y.ord
	defer y.s.flushKeys()
	for i := 0; i < len(b.Events); {
		var n int
		var err error
		if h.serving {
			n, err = y.s.applyPublished(h.idx, b.Events[i:], kvindex.History)
		} else {
			n, err = h.idx.ApplyRun(b.Events[i:], kvindex.History, runBlocks)
		}
		if err != nil {
			return fmt.Errorf("event %d (%v): %w", i+n, b.Events[i+n].Kind, y.limitErr(err))
		}
		i += n
	}
	return nil
}

// orderedBadBatch restarts the view after a batch that could not be
// decoded or applied: its effects are unknown, so nothing before it can
// be trusted, and nothing after it depends on it.
func (y *syncer) orderedBadBatch(seq uint64, reason string) {
	if y.lastReason != reason {
		y.log.Warn("batch not applied; the view restarts after it", "stream", y.s.spec.String(), "sequence", seq, "reason", reason)
	}
	y.orderedFresh(seq+1, false)
	y.setReasonAfter(reason)
}

// setReasonAfter records why an unpublished ordered view is not serving.
func (y *syncer) setReasonAfter(reason string) {
	y.lastReason = reason
	y.setReason(reason)
}

// orderedMaybePublish publishes the view once it reflects something the
// engine sent and no replay is filling a hole in it.
func (y *syncer) orderedMaybePublish(how string) {
	h := &y.ord
	if h.serving || h.idx == nil || !h.trusted || h.cu != nil || len(h.buffered) > 0 {
		return
	}
	h.serving = true
	seq, hasSeq := uint64(0), h.expected > 0
	if hasSeq {
		seq = h.expected - 1
	}
	y.s.publish(h.idx, seq, hasSeq, h.complete)
	y.backoff = 0
	y.retryAt = time.Time{}
	y.nextResync = time.Time{}
	if y.isHistory() && y.lim.ResyncInterval > 0 {
		y.nextResync = y.resyncAt(time.Now())
	}
	if y.lastReason != "" {
		d, hb := h.idx.Counts()
		y.log.Info("stream synchronised", "stream", y.s.spec.String(), "mode", y.s.spec.SyncMode(),
			"complete", h.complete, "sequence", seq, "device_blocks", d, "host_blocks", hb, "by", how)
		y.lastReason = ""
	}
}

// ensureCatchUp starts a history replay from the next needed sequence
// unless one is in flight or waiting for its backoff.
func (y *syncer) ensureCatchUp() {
	h := &y.ord
	if h.cu != nil || !y.linkUp || (!y.retryAt.IsZero() && time.Now().Before(y.retryAt)) {
		if y.retryAt.IsZero() {
			y.retryAt = time.Now()
		}
		return
	}
	y.startCatchUp(false)
}

func (y *syncer) startCatchUp(tail bool) {
	h := &y.ord
	rep, err := y.tctx.DialReplay(y.s.spec.ReplayEndpoint, kvtransport.ReplayOptions{
		MaxMessageBytes: int64(y.lim.MaxMessageBytes),
		ReceiveHWM:      y.lim.receiveHWM(),
	})
	now := time.Now()
	if err != nil {
		y.s.counters.snapshotsFailed.Add(1)
		y.catchUpFailed(tail, fmt.Sprintf("replay socket: %v", err))
		return
	}
	y.s.counters.snapshotsStarted.Add(1)
	h.cu = &catchUp{rep: rep, start: h.expected, started: now, deadline: now.Add(y.lim.ReplayTimeout), tail: tail}
	y.retryAt = time.Time{}
	if !tail {
		y.setReason("replaying history")
	}
	y.sendCatchUpRequest()
}

func (y *syncer) sendCatchUpRequest() {
	cu := y.ord.cu
	if cu == nil || cu.requested {
		return
	}
	err := cu.rep.Send(kvevent.ReplayRequest(cu.start))
	switch {
	case err == nil:
		cu.requested = true
	case err != kvtransport.ErrNotConnected:
		y.catchUpFailedNow(fmt.Sprintf("replay request: %v", err))
	}
}

func (y *syncer) abortCatchUp() {
	h := &y.ord
	if h.cu == nil {
		return
	}
	if err := h.cu.rep.Close(); err != nil {
		y.log.Debug("close replay socket", "stream", y.s.spec.String(), "err", err)
	}
	h.cu = nil
}

// catchUpFailedNow abandons the replay in flight.
func (y *syncer) catchUpFailedNow(reason string) {
	tail := y.ord.cu != nil && y.ord.cu.tail
	y.abortCatchUp()
	y.s.counters.snapshotsFailed.Add(1)
	y.catchUpFailed(tail, reason)
}

// catchUpFailed decides what follows a failed replay. A calibration just
// tries again later. A replay that was to fill a hole gives up on the
// history: the view restarts at the first live message kept meanwhile,
// partial, rather than wait on an endpoint that does not answer; without
// one, the attempt is retried with backoff.
func (y *syncer) catchUpFailed(tail bool, reason string) {
	h := &y.ord
	now := time.Now()
	if tail {
		y.log.Warn("history calibration failed; keeping the view", "stream", y.s.spec.String(), "reason", reason)
		y.nextResync = y.resyncAt(now)
		return
	}
	y.log.Warn("history replay failed", "stream", y.s.spec.String(), "reason", reason)
	h.replayFailed = true
	if len(h.buffered) > 0 {
		first := h.buffered[0].seq
		y.orderedFresh(first, false)
		y.drainOrderedBuffer()
		y.orderedMaybePublish("live messages after a failed replay")
		return
	}
	y.setReasonAfter(reason)
	y.pause(now)
}

// drainOrderedBuffer applies the buffered live messages that continue the
// view; a hole before one restarts the view there (the replay had nothing
// for it).
func (y *syncer) drainOrderedBuffer() {
	h := &y.ord
	for _, bb := range h.buffered {
		switch {
		case bb.seq < h.expected:
			y.s.counters.coveredBatches.Add(1)
			continue
		case bb.seq > h.expected:
			y.s.counters.gaps.Add(1)
			y.log.Warn("history did not cover a gap; restarting the view", "stream", y.s.spec.String(),
				"expected", h.expected, "sequence", bb.seq)
			y.orderedFresh(bb.seq, false)
		}
		y.orderedApply(bb.seq, bb.batch, false)
	}
	y.dropBuffered()
}

// orderedReplay handles one replay frame in history mode.
func (y *syncer) orderedReplay(frames [][]byte) {
	h := &y.ord
	cu := h.cu
	seq, payload, end, err := kvevent.ParseReplay(frames)
	if err != nil {
		y.s.counters.decodeErrors.Add(1)
		y.catchUpFailedNow(fmt.Sprintf("bad replay frame: %v", err))
		return
	}
	if topic, ok := kvevent.ReplayTopic(frames); ok && !end && y.s.spec.Topic != "" && string(topic) != y.s.spec.Topic {
		y.catchUpFailedNow(fmt.Sprintf("replay carries topic %q, this stream expects %q", topic, y.s.spec.Topic))
		return
	}
	if end {
		y.finishCatchUp()
		return
	}
	cu.batches++
	if err := y.decodeBatch(payload); err != nil {
		y.s.counters.decodeErrors.Add(1)
		if seq >= h.expected {
			y.orderedBadBatch(seq, fmt.Sprintf("decode: %v", err))
		}
		return
	}
	switch {
	case seq < h.expected:
		y.s.counters.duplicates.Add(1)
		return
	case seq > h.expected:
		// The history no longer holds what the view needs.
		if h.expected > 0 || h.trusted {
			y.s.counters.gaps.Add(1)
		}
		y.log.Info("history starts after the sequence needed; the view restarts partial", "stream", y.s.spec.String(),
			"needed", h.expected, "history_from", seq)
		y.orderedFresh(seq, false)
	}
	// A calibration that finds a lost batch applies it to the view it
	// keeps serving.
	y.orderedApply(seq, &y.batch, true)
}

// finishCatchUp completes a replay at its end marker: the live messages
// kept meanwhile follow, and the view is published.
func (y *syncer) finishCatchUp() {
	h := &y.ord
	cu := h.cu
	y.abortCatchUp()
	h.trusted = true
	h.replayFailed = false
	y.s.counters.snapshotsOK.Add(1)
	y.s.counters.lastSnapshot.Store(int64(time.Since(cu.started)))
	y.s.obs.observeSnapshot(time.Since(cu.started))
	y.drainOrderedBuffer()
	if h.serving {
		if cu.tail && y.lim.ResyncInterval > 0 {
			y.nextResync = y.resyncAt(time.Now())
		}
		return
	}
	y.orderedMaybePublish(fmt.Sprintf("history replay of %d batches in %v", cu.batches, time.Since(cu.started).Round(time.Millisecond)))
}

// orderedTimers runs the ordered modes' timers: a replay request waiting
// for its connection, a replay past its deadline, a retry after backoff
// and the periodic calibration of a history view.
func (y *syncer) orderedTimers(now time.Time) {
	h := &y.ord
	if !y.isHistory() {
		return
	}
	if h.cu != nil {
		if now.After(h.cu.deadline) {
			y.catchUpFailedNow(fmt.Sprintf("history replay timed out after %v without end marker", y.lim.ReplayTimeout))
			return
		}
		y.sendCatchUpRequest()
		return
	}
	switch {
	case y.deaf || !y.linkUp:
	case !h.serving && !y.retryAt.IsZero() && !now.Before(y.retryAt):
		if h.idx == nil {
			y.orderedFresh(0, true)
		}
		y.startCatchUp(false)
	case h.serving && !y.nextResync.IsZero() && !now.Before(y.nextResync):
		// R-REC-4 for history: ask for what follows the view. The
		// engine sends only batches the live channel should already
		// have delivered, so anything applied is a lost tail; blocks
		// stored before the history window are never taken as gone.
		y.nextResync = time.Time{}
		y.startCatchUp(true)
	}
}

func (y *syncer) orderedReplayer() *kvtransport.Replayer {
	if y.ord.cu == nil {
		return nil
	}
	return y.ord.cu.rep
}

func (y *syncer) orderedSnapDeadline() time.Time {
	if y.ord.cu == nil {
		return time.Time{}
	}
	return y.ord.cu.deadline
}
