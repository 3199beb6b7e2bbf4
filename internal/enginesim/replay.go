package enginesim

import (
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
)

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

// request answers one replay request. The start sequence is read for
// validation only: the engine always answers with its current full
// snapshot (R-WIRE-3).
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
	payloads := r.snapshotPayloads()
	if r.replayMode == ReplayGapInMiddle && len(payloads) > 0 {
		mid := len(payloads) / 2
		payloads = append(payloads[:mid:mid], payloads[mid+1:]...)
	}
	job := &replayJob{id: append([]byte(nil), id...)}
	for _, p := range payloads {
		job.replies = append(job.replies, kvevent.ReplayFrames(r.last, p))
	}
	if r.replayMode != ReplayNeverEnd {
		job.replies = append(job.replies, kvevent.ReplayEnd())
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
