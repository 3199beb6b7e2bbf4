package enginesim

import (
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
)

// ReplayKind selects what a rank's replay endpoint answers.
type ReplayKind int

const (
	// ReplayState answers with the rank's current full state (R-WIRE-3).
	ReplayState ReplayKind = iota
	// ReplayHistory answers with the buffered live messages from the
	// requested sequence on, at most Config.HistoryBatches of them, each
	// under its own sequence: what vLLM and SGLang send.
	ReplayHistory
	// ReplayNone binds no replay endpoint.
	ReplayNone
)

func (k ReplayKind) String() string {
	switch k {
	case ReplayState:
		return "state"
	case ReplayHistory:
		return "history"
	case ReplayNone:
		return "none"
	}
	return fmt.Sprintf("ReplayKind(%d)", int(k))
}

// histEntry is one live message a ReplayHistory rank keeps for replay.
type histEntry struct {
	seq     uint64
	payload []byte
}

// remember keeps a copy of a live message for history replay, dropping
// the oldest past HistoryBatches.
func (r *rank) remember(seq uint64, payload []byte) {
	if r.cfg.Replay != ReplayHistory {
		return
	}
	if len(r.history) >= r.cfg.HistoryBatches {
		n := len(r.history) - r.cfg.HistoryBatches + 1
		clear(r.history[:n])
		r.history = append(r.history[:0], r.history[n:]...)
	}
	r.history = append(r.history, histEntry{seq: seq, payload: append([]byte(nil), payload...)})
}

// ReplayMode selects how a rank answers snapshot requests.
type ReplayMode int

const (
	// ReplayNormal sends the snapshot batches and the end marker at once.
	ReplayNormal ReplayMode = iota
	// ReplayNeverEnd sends the batches but never the end marker.
	ReplayNeverEnd
	// ReplayGapInMiddle leaves out the middle batch of the snapshot, as a
	// ROUTER past its send HWM does; the rest, end marker included, goes
	// out normally, so the snapshot is silently incomplete.
	ReplayGapInMiddle
	// ReplaySlow waits the rank's replay delay before each reply,
	// the end marker included, while live messages keep flowing.
	ReplaySlow
	// ReplayIgnore never answers.
	ReplayIgnore
)

func (m ReplayMode) String() string {
	switch m {
	case ReplayNormal:
		return "normal"
	case ReplayNeverEnd:
		return "never-end"
	case ReplayGapInMiddle:
		return "gap-in-middle"
	case ReplaySlow:
		return "slow"
	case ReplayIgnore:
		return "ignore"
	}
	return fmt.Sprintf("ReplayMode(%d)", int(m))
}

// replayJob is a snapshot being sent to one peer. Its replies are encoded
// when the request arrives, so the snapshot reflects exactly the live
// messages up to its watermark whatever happens while it is sent.
type replayJob struct {
	id      []byte
	replies [][][]byte
	due     time.Time
	delay   time.Duration
}

// request answers one replay request. With ReplayState the start
// sequence is read for validation only: the engine always answers with
// its current full snapshot (R-WIRE-3). With ReplayHistory it answers
// with every buffered message from the start sequence on.
func (r *rank) request(id []byte, frames [][]byte) {
	start, err := kvevent.ParseReplayRequest(frames)
	if err != nil {
		r.log.Warn("bad replay request", "err", err)
		return
	}
	r.log.Debug("replay request", "start_seq", start, "mode", r.replayMode)
	if r.replayMode == ReplayIgnore {
		return
	}
	var replies []histEntry
	if r.cfg.Replay == ReplayHistory {
		for _, h := range r.history {
			if h.seq >= start {
				replies = append(replies, h)
			}
		}
	} else {
		for _, p := range r.snapshotPayloads() {
			replies = append(replies, histEntry{seq: r.last, payload: p})
		}
	}
	if r.replayMode == ReplayGapInMiddle && len(replies) > 0 {
		mid := len(replies) / 2
		replies = append(replies[:mid:mid], replies[mid+1:]...)
	}
	job := &replayJob{id: append([]byte(nil), id...)}
	for _, h := range replies {
		if r.cfg.ReplayTopicFrames {
			job.replies = append(job.replies, kvevent.ReplayFramesTopic(r.cfg.Topic, h.seq, h.payload))
		} else {
			job.replies = append(job.replies, kvevent.ReplayFrames(h.seq, h.payload))
		}
	}
	if r.replayMode != ReplayNeverEnd {
		if r.cfg.ReplayTopicFrames {
			job.replies = append(job.replies, kvevent.ReplayEndTopic())
		} else {
			job.replies = append(job.replies, kvevent.ReplayEnd())
		}
	}
	now := time.Now()
	job.due = now
	if r.replayMode == ReplaySlow {
		job.delay = r.replayDelay
		job.due = now.Add(job.delay)
	}
	r.jobs = append(r.jobs, job)
	r.sendDueReplies(now)
}

// snapshotPayloads encodes the full state parent first in batches of at
// most SnapshotBatchBlocks blocks. Before the first live message there
// is no watermark to give, so the snapshot is then only the end marker.
func (r *rank) snapshotPayloads() [][]byte {
	if !r.sent {
		return nil
	}
	blocks := r.cache.ordered()
	var out [][]byte
	var b kvevent.Batch
	for len(blocks) > 0 {
		n := min(len(blocks), r.cfg.SnapshotBatchBlocks)
		b.Reset()
		r.stampBatch(&b)
		r.appendState(&b, blocks[:n])
		out = append(out, kvevent.AppendBatch(nil, &b, r.cfg.Shape))
		blocks = blocks[n:]
	}
	return out
}

// sendDueReplies sends every reply whose time has come. Replies to a peer
// that is gone, or past the send HWM, are dropped by the ROUTER.
func (r *rank) sendDueReplies(now time.Time) {
	kept := r.jobs[:0]
	for _, j := range r.jobs {
		for len(j.replies) > 0 && !now.Before(j.due) {
			if err := r.rs.Reply(j.id, j.replies[0]); err != nil {
				r.log.Warn("replay reply failed", "err", err)
			}
			j.replies = j.replies[1:]
			if j.delay > 0 {
				j.due = now.Add(j.delay)
			}
		}
		if len(j.replies) > 0 {
			kept = append(kept, j)
		}
	}
	clear(r.jobs[len(kept):])
	r.jobs = kept
}
