package enginesim

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/zeebo/xxh3"
)

// SkipSeq makes the next live message of rank dp jump n sequence numbers
// ahead, a gap as a subscriber sees one after lost messages.
func (e *Engine) SkipSeq(dp int, n uint64) error {
	return e.do(dp, func(r *rank) error {
		r.next += n
		return nil
	})
}

// SendRaw sends payload, whatever it holds, as the next live message of
// rank dp. The cache is not changed.
func (e *Engine) SendRaw(dp int, payload []byte) error {
	return e.do(dp, func(r *rank) error {
		return r.sendLive(payload)
	})
}

// SendOversize sends a well-formed live batch of at least n bytes: one
// BlockStored of blocks that are never resident, so only its size is
// wrong for a subscriber bounded by max_message_bytes.
func (e *Engine) SendOversize(dp int, n int) error {
	if n < 0 {
		return fmt.Errorf("enginesim: oversize message of %d bytes", n)
	}
	return e.do(dp, func(r *rank) error {
		bs := r.cfg.BlockSize
		blocks := n/bs + 1
		tokens := make([]uint32, blocks*bs)
		for i := range tokens {
			tokens[i] = 1
		}
		hashes := make([]kvevent.EngineHash, blocks)
		for i := range hashes {
			hashes[i] = phantomHash(r, uint64(i))
		}
		b := r.startBatch()
		r.cache.addStored(b, hashes, kvevent.EngineHash{}, false, tokens, kvevent.Device)
		r.buf = kvevent.AppendBatch(r.buf[:0], b, r.cfg.Shape)
		return r.sendLive(r.buf)
	})
}

// SendUnknownParent sends a live BlockStored of one block whose parent the
// engine never announced, which must make a subscriber resynchronise
// (R-IDX-5). The cache is not changed.
func (e *Engine) SendUnknownParent(dp int) error {
	return e.do(dp, func(r *rank) error {
		parent := phantomHash(r, 1<<62)
		block := phantomHash(r, 1<<62+1)
		tokens := make([]uint32, r.cfg.BlockSize)
		for i := range tokens {
			tokens[i] = uint32(i)
		}
		b := r.startBatch()
		r.cache.addStored(b, []kvevent.EngineHash{block}, parent, true, tokens, kvevent.Device)
		r.buf = kvevent.AppendBatch(r.buf[:0], b, r.cfg.Shape)
		return r.sendLive(r.buf)
	})
}

// phantomHash derives a hash for a block that is never resident, distinct
// per sequence number and index and never equal to a resident block.
func phantomHash(r *rank, i uint64) kvevent.EngineHash {
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], r.next)
	binary.BigEndian.PutUint64(buf[8:], i)
	for salt := r.cfg.HashSeed ^ 0x9e3779b97f4a7c15; ; salt++ {
		h := kvevent.IntHash(xxh3.HashSeed(buf[:], salt))
		if _, taken := r.cache.blocks[h]; !taken {
			return h
		}
	}
}

// SetWrongDPRank makes the batches of rank dp, live and replay, claim
// rank dp+1.
func (e *Engine) SetWrongDPRank(dp int, on bool) error {
	return e.do(dp, func(r *rank) error {
		r.wrongDP = on
		return nil
	})
}

// SetWrongBlockSize makes every BlockStored with tokens of rank dp, live
// and replay, claim twice the real block size; the events stay well
// formed, each block's tokens sent twice.
func (e *Engine) SetWrongBlockSize(dp int, on bool) error {
	return e.do(dp, func(r *rank) error {
		r.cache.wrongBlock = on
		return nil
	})
}

// SetDropTail makes rank dp change its cache without publishing: the
// sequence does not advance, so only a later snapshot, whose watermark
// stays at the last message sent, reveals the difference (R-REC-4).
func (e *Engine) SetDropTail(dp int, on bool) error {
	return e.do(dp, func(r *rank) error {
		r.dropTail = on
		return nil
	})
}

// SetDropLive makes rank dp publish into its history without sending on
// the live channel: each message uses its sequence number and can be
// replayed by a ReplayHistory rank, as when the publisher's queue drops
// it for one subscriber.
func (e *Engine) SetDropLive(dp int, on bool) error {
	return e.do(dp, func(r *rank) error {
		r.dropLive = on
		return nil
	})
}

// SetReplayMode selects how rank dp answers later snapshot requests.
func (e *Engine) SetReplayMode(dp int, mode ReplayMode) error {
	if mode < ReplayNormal || mode > ReplayIgnore {
		return fmt.Errorf("enginesim: unknown replay mode %d", int(mode))
	}
	return e.do(dp, func(r *rank) error {
		r.replayMode = mode
		return nil
	})
}

// SetReplayDelay sets the pause before each reply in ReplaySlow mode.
func (e *Engine) SetReplayDelay(dp int, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("enginesim: negative replay delay %v", d)
	}
	return e.do(dp, func(r *rank) error {
		r.replayDelay = d
		return nil
	})
}

// PrefillLost serves a prompt like Prefill, but its live message is lost
// on the way, as a publisher past its send HWM loses it: the cache
// changes, the sequence number is used and counted as sent (a later
// snapshot's watermark covers it), and nothing is delivered. A subscriber
// sees the loss only as a gap at the next message (R-REC-3). Nothing is
// lost when the prompt changes nothing.
func (e *Engine) PrefillLost(dp int, tokens []uint32) (deviceHitTokens, hostHitTokens int, err error) {
	err = e.do(dp, func(r *rank) error {
		b := r.startBatch()
		deviceHitTokens, hostHitTokens = r.cache.prefill(tokens, b)
		if len(b.Events) > 0 && !r.dropTail {
			r.sent, r.last = true, r.next
			r.next++
		}
		return nil
	})
	return deviceHitTokens, hostHitTokens, err
}
