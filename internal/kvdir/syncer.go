package kvdir

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

const (
	// pollInterval bounds how long the stream goroutine waits on its
	// sockets. Its timers set shorter waits and stopping wakes it, so
	// this only paces an idle stream: every wait is a cgo call, which at
	// 128 streams was most of kvcar's CPU when it was 50 ms.
	pollInterval = time.Second
	// requestRetryInterval paces a snapshot request waiting for its
	// connection.
	requestRetryInterval = time.Millisecond
	backoffMin           = 100 * time.Millisecond
	backoffMax           = 5 * time.Second
)

// syncer is the stream goroutine's private state: sockets, decoder,
// sequence tracking and the snapshot in progress.
type syncer struct {
	s     *stream
	lim   Limits
	log   *slog.Logger
	tctx  *kvtransport.Context
	sub   *kvtransport.Subscriber
	dec   *kvevent.Decoder
	batch kvevent.Batch
	// batches is the directory's pool of decode storage (batchpool.go).
	batches *batchPool
	linkUp  bool

	// Live sequence tracking while synchronised.
	expected uint64
	// expectAny accepts any next sequence: only after an empty snapshot
	// from an engine that broke the empty-snapshot rule (see
	// emptySnapshotTolerance).
	expectAny bool
	// emptySnapshot is true while the view comes from a snapshot without
	// a watermark and no live message has been applied on it;
	// emptyGaps counts such snapshots followed by a first sequence other
	// than 0.
	emptySnapshot bool
	emptyGaps     int
	// dedupUpTo drops live messages at or below the last snapshot's
	// watermark that were still queued when the snapshot was published.
	dedupUpTo   uint64
	dedupActive bool

	snap *snapshot
	// ord is the state of a history or live stream (ordered.go).
	ord ordered
	// topicSeen is true once a message of the stream's own topic arrived
	// on the current subscription; deaf is true while only messages of
	// other topics did, so the stream serves nothing (item 4).
	topicSeen bool
	deaf      bool

	retryAt    time.Time
	backoff    time.Duration
	nextResync time.Time
	// withdrawn is the view a fault withdrew, kept until the recovery
	// snapshot ends so that the snapshot's orphans can take the keys it
	// knew (kvindex.AdoptKeys); nil once a view is served again or the
	// link dropped. With the snapshot's index it is the two indexes a stream
	// may hold (MemoryBound).
	withdrawn *kvindex.Index
	// lastReason avoids logging the same state change once per message.
	lastReason string
}

// run is the stream goroutine. It returns when s.stop is closed.
func (y *syncer) run() {
	defer close(y.s.done)
	if w := y.s.waker; w != nil {
		defer func() {
			if err := w.Close(); err != nil {
				y.log.Debug("close waker", "stream", y.s.spec.String(), "err", err)
			}
		}()
	}
	defer y.closeSockets()

	y.retryAt = time.Now()
	if err := y.subscribe(); err != nil {
		y.fail(err.Error())
		y.pause(time.Now())
	}

	for {
		select {
		case <-y.s.stop:
			return
		default:
		}
		now := time.Now()
		if y.sub == nil {
			y.resubscribeLater(now)
			continue
		}
		y.onTimers(now)
		y.s.counters.waits.Add(1)
		rd, err := y.sub.Wait(y.replayer(), y.waitFor(now))
		if err != nil {
			y.fail(fmt.Sprintf("poll: %v", err))
			y.pause(time.Now())
			continue
		}
		if rd.Link {
			y.drainLink()
		}
		if rd.Replay {
			y.drainReplay()
		}
		if rd.Live {
			y.drainLive()
		}
	}
}

// subscribe (re)creates the SUB socket. libzmq never reconnects a link it
// dropped for a protocol error, such as a frame over max_message_bytes,
// so every disconnect gets a fresh socket rather than trusting the old
// one to come back.
func (y *syncer) subscribe() error {
	if y.sub != nil {
		if err := y.sub.Close(); err != nil {
			y.log.Debug("close subscriber", "stream", y.s.spec.String(), "err", err)
		}
		y.sub = nil
	}
	// Every topic is received and filtered here, so that a publisher
	// sending another topic is noticed rather than silently unheard. A
	// bound stream shares its hub with other engines and takes only its
	// own topic.
	endpoint, filter := y.s.spec.Endpoint, ""
	if y.s.relay != "" {
		endpoint, filter = y.s.relay, y.s.spec.Topic
	}
	sub, err := y.tctx.Subscribe(endpoint, filter, kvtransport.SubscriberOptions{
		MaxMessageBytes: int64(y.lim.MaxMessageBytes),
		ReceiveHWM:      y.lim.receiveHWM(),
		Waker:           y.s.waker,
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	y.sub = sub
	y.linkUp = false
	y.topicSeen = false
	y.ord.haveLastLive = false
	return nil
}

// resubscribeLater retries a failed socket creation when its backoff is
// due, waiting on the stop channel meanwhile.
func (y *syncer) resubscribeLater(now time.Time) {
	select {
	case <-y.s.stop:
		return
	case <-time.After(max(y.retryAt.Sub(now), 0)):
	}
	if err := y.subscribe(); err != nil {
		y.fail(err.Error())
		y.pause(time.Now())
	}
}

func (y *syncer) replayer() *kvtransport.Replayer {
	if y.s.spec.ordered() {
		return y.orderedReplayer()
	}
	if y.snap == nil {
		return nil
	}
	return y.snap.rep
}

// waitFor returns how long the next poll may block.
func (y *syncer) waitFor(now time.Time) time.Duration {
	d := pollInterval
	if (y.snap != nil && !y.snap.requested) || (y.ord.cu != nil && !y.ord.cu.requested) {
		// A loopback connection is up within a millisecond or so; the
		// request goes out as soon as it is.
		d = requestRetryInterval
	}
	// A retry can only start once the link is up and the stream hears its
	// topic; until then the link monitor or a message wakes the wait, and
	// a due retry time must not turn the wait into a spin.
	retry := y.retryAt
	if !y.linkUp || y.deaf || (y.s.spec.ordered() && (!y.isHistory() || y.ord.serving || y.ord.cu != nil)) {
		retry = time.Time{}
	}
	for _, t := range []time.Time{retry, y.nextResync, y.snapDeadline(), y.orderedSnapDeadline()} {
		if !t.IsZero() {
			if until := t.Sub(now); until < d {
				d = max(until, 0)
			}
		}
	}
	return d
}

func (y *syncer) snapDeadline() time.Time {
	if y.snap == nil {
		return time.Time{}
	}
	return y.snap.deadline
}

// onTimers starts snapshots that are due, sends a request still waiting
// for its connection, and expires a snapshot that is late.
func (y *syncer) onTimers(now time.Time) {
	if y.s.spec.ordered() {
		y.orderedTimers(now)
		return
	}
	if y.snap != nil {
		if now.After(y.snap.deadline) {
			y.snapshotFailed(fmt.Sprintf("snapshot timed out after %v without end marker", y.lim.ReplayTimeout))
			return
		}
		y.retryRequest()
		return
	}
	synced, _, _ := y.s.status()
	switch {
	case !synced && y.linkUp && !y.deaf && !y.retryAt.IsZero() && !now.Before(y.retryAt):
		y.startSnapshot(false)
	case synced && !y.nextResync.IsZero() && !now.Before(y.nextResync):
		// R-REC-4: calibrate against the engine's full state to find
		// silently lost tail events; keep serving meanwhile.
		y.startSnapshot(true)
	}
}

func (y *syncer) drainLink() {
	for {
		ev, ok, err := y.sub.RecvLink()
		if err != nil {
			y.log.Warn("link monitor failed", "stream", y.s.spec.String(), "err", err)
			return
		}
		if !ok {
			return
		}
		switch ev {
		case kvtransport.LinkConnected:
			y.linkUp = true
			if y.retryAt.IsZero() && (!y.s.spec.ordered() || y.ord.idx == nil) {
				y.retryAt = time.Now()
			}
		case kvtransport.LinkDisconnected:
			// R-REC-3: subscription loss. Whatever was published while
			// down is gone, so the view and any snapshot in progress are
			// void; a new snapshot starts once the link is back.
			y.s.counters.disconnects.Add(1)
			y.abortSnapshot()
			y.orderedReset()
			y.invalidate("publisher disconnected")
			// A link may stay down for long: its view is not kept.
			y.withdrawn = nil
			y.retryAt = time.Now()
			if err := y.subscribe(); err != nil {
				y.fail(err.Error())
				y.pause(time.Now())
			}
			return
		}
	}
}

// drainMax bounds the messages one drain takes in a row, so that under a
// flood the stream goroutine still looks at its stop channel, its link
// and its timers (snapshot deadline, calibration) between batches.
const drainMax = 64

func (y *syncer) drainLive() {
	for range drainMax {
		frames, err := y.sub.RecvLive()
		if err != nil {
			y.fault(fmt.Sprintf("receive: %v", err))
			return
		}
		if frames == nil {
			y.releaseBatch()
			return
		}
		y.onLive(frames)
		y.trimBatch()
	}
}

// batchRetainBytes is how much decode storage a stream keeps between
// messages. Steady traffic fits and decodes without allocating; storage
// grown by a rare large message (up to kvevent.MaxStorageBytes of
// max_message_bytes) is dropped after it, so it is not held per stream
// for good.
const batchRetainBytes = 1 << 20

func (y *syncer) trimBatch() {
	if y.batch.StorageBytes() > batchRetainBytes {
		y.batch = kvevent.Batch{}
	}
	y.s.decodeHeld.Store(int64(y.batch.StorageBytes()))
}

// decodeBatch decodes payload into y.batch, with storage from the pool
// when the payload needs much and y.batch has little.
func (y *syncer) decodeBatch(payload []byte) error {
	if y.batches != nil && len(payload) >= batchPoolMinBytes/8 && y.batch.StorageBytes() < batchPoolMinBytes {
		if b, ok := y.batches.get(); ok {
			y.batch = b
		}
	}
	return y.dec.DecodeBatch(payload, &y.batch)
}

// releaseBatch gives large decode storage back to the pool; a drain
// calls it when it finds no message left, when nothing refers to the
// storage any more (a batch kept for later is a clone).
func (y *syncer) releaseBatch() {
	if y.batches != nil && y.batch.StorageBytes() >= batchPoolMinBytes {
		y.batches.put(y.batch)
		y.batch = kvevent.Batch{}
	}
	y.s.decodeHeld.Store(int64(y.batch.StorageBytes()))
}

func (y *syncer) onLive(frames [][]byte) {
	topic, seq, payload, err := kvevent.ParseLive(frames)
	if err != nil {
		y.s.counters.decodeErrors.Add(1)
		y.fault(fmt.Sprintf("bad live envelope: %v", err))
		return
	}
	if want := y.s.spec.Topic; want != "" && string(topic) != want {
		// The topic must match exactly (R-CFG-4); an empty one takes all.
		if y.s.counters.topicMismatches.Add(1) == 1 {
			y.log.Warn("ignoring messages of another topic", "stream", y.s.spec.String(),
				"topic", string(topic), "want", want)
		}
		if !y.topicSeen && y.s.spec.Bind == "" {
			y.beDeaf(topic)
		}
		return
	}
	y.topicSeen = true
	if y.deaf {
		y.deaf = false
		y.retryAt = time.Now()
		y.log.Info("publisher sends this stream's topic", "stream", y.s.spec.String(), "topic", string(topic))
	}
	if y.s.spec.ordered() {
		if err := y.decodeBatch(payload); err != nil {
			y.s.counters.decodeErrors.Add(1)
			if y.ord.idx != nil {
				y.ord.lastLive, y.ord.haveLastLive = seq, true
				y.orderedBadBatch(seq, fmt.Sprintf("decode: %v", err))
			}
			return
		}
		if y.otherRank(&y.batch) {
			return
		}
		y.orderedLive(seq, len(payload))
		return
	}
	synced, _, _ := y.s.status()
	if err := y.decode(payload); errors.Is(err, errOtherRank) {
		return
	} else if err != nil {
		if synced || y.snap != nil {
			// During a snapshot the message is not buffered: if the
			// snapshot does not cover seq, the merge finds the hole.
			y.fault(err.Error())
		}
		return
	}
	if isFullState(&y.batch) {
		y.recoverFromLive(seq)
		return
	}
	switch {
	case y.snap != nil:
		if synced {
			// Calibration: keep the served view current as well.
			y.applyLive(seq)
		}
		if y.snap != nil {
			y.bufferLive(seq, len(payload))
		}
	case synced:
		y.applyLive(seq)
	default:
		// Unsynchronised and between attempts: the next snapshot covers
		// whatever this message carried.
	}
}

// isFullState reports a batch that starts with AllBlocksCleared: what
// follows it is the engine's whole state (R-WIRE-4).
func isFullState(b *kvevent.Batch) bool {
	return len(b.Events) > 0 && b.Events[0].Kind == kvevent.AllBlocksCleared
}

// recoverFromLive replaces the view with the full-state batch in y.batch,
// whatever came before it: it (re)synchronises the stream at seq without
// a snapshot, and is published in one step like one.
func (y *syncer) recoverFromLive(seq uint64) {
	ix := y.newIndex()
	if i, err := applyEvents(ix, y.batch.Events, kvindex.Snapshot); err != nil {
		y.fault(fmt.Sprintf("full-state batch %d event %d: %v", seq, i, y.limitErr(err)))
		return
	}
	y.adoptKeys(ix)
	y.abortSnapshot()
	y.s.counters.countEvents(&y.batch)
	y.s.counters.lastApplied.Store(time.Now().UnixNano())
	y.s.counters.batchesApplied.Add(1)
	y.s.counters.fullStateSyncs.Add(1)
	y.synchronised(ix, seq, true, seq+1, false, "full-state batch")
}

// applyLive applies the live message in y.batch to the published view.
func (y *syncer) applyLive(seq uint64) {
	if y.dedupActive && seq <= y.dedupUpTo {
		y.s.counters.duplicates.Add(1)
		return
	}
	y.dedupActive = false
	if !y.expectAny && seq != y.expected {
		y.s.counters.gaps.Add(1)
		if y.emptySnapshot {
			y.emptyGaps++
		}
		y.fault(seqFault(y.expected, seq))
		return
	}
	if err := y.applyBatch(y.s, &y.batch); err != nil {
		y.fault(err.Error())
		return
	}
	y.expectAny, y.emptySnapshot, y.emptyGaps = false, false, 0
	y.expected = seq + 1
	y.s.mu.Lock()
	y.s.seq, y.s.hasSeq = seq, true
	y.s.syncView()
	y.s.mu.Unlock()
	// lastApplied before the count, so a reader that sees the count sees
	// the time too.
	now := time.Now()
	y.s.counters.lastApplied.Store(now.UnixNano())
	y.s.counters.batchesApplied.Add(1)
	y.s.obs.observeLag(y.batch.Timestamp, now)
}

func seqFault(expected, got uint64) string {
	if got < expected {
		return fmt.Sprintf("sequence went back from %d to %d (publisher restarted)", expected, got)
	}
	return fmt.Sprintf("sequence gap: expected %d, got %d", expected, got)
}

// decode parses payload into y.batch and checks it belongs to this DP.
// A bound stream's batch of another rank is errOtherRank.
func (y *syncer) decode(payload []byte) error {
	if err := y.decodeBatch(payload); err != nil {
		y.s.counters.decodeErrors.Add(1)
		return fmt.Errorf("decode: %w", err)
	}
	if y.otherRank(&y.batch) {
		return errOtherRank
	}
	return checkRank(&y.batch, y.s.spec)
}

// errOtherRank marks a batch of another DP rank of the same engine on a
// bound subscriber: not this stream's, not a fault.
var errOtherRank = errors.New("batch of another DP rank")

// otherRank reports a bound stream's batch that belongs to another DP
// rank: the ranks of one engine dialing one subscriber share a topic
// unless its template has {dp_rank}, and are told apart by the rank each
// batch carries. A batch without a rank is taken when the instance has
// one rank.
func (y *syncer) otherRank(b *kvevent.Batch) bool {
	sp := &y.s.spec
	if sp.Bind == "" || sp.AnyRank {
		return false
	}
	if !b.HasDPRank || b.DPRank != sp.DPRank {
		y.s.counters.otherRank.Add(1)
		return true
	}
	return false
}

func checkRank(b *kvevent.Batch, spec StreamSpec) error {
	if b.HasDPRank && b.DPRank != spec.DPRank && !spec.AnyRank {
		return fmt.Errorf("batch dp_rank %d on the stream of dp_rank %d", b.DPRank, spec.DPRank)
	}
	return nil
}

// applyBatch applies b to the published index of s in runs of events
// that end once they reach runBlocks blocks, one lock hold each, so that
// a large batch never stalls queries for long.
func (y *syncer) applyBatch(s *stream, b *kvevent.Batch) error {
	ix := s.idx // only this goroutine changes it
	defer s.flushKeys()
	for i := 0; i < len(b.Events) && ix != nil; {
		n, err := s.applyPublished(ix, b.Events[i:], kvindex.Delta)
		if i += n; err != nil {
			return fmt.Errorf("event %d (%v): %w", i, b.Events[i].Kind, y.limitErr(err))
		}
	}
	s.counters.countEvents(b)
	return nil
}

// limitErr names the config key behind a capacity error so the reason a
// stream reports tells the operator what to raise.
func (y *syncer) limitErr(err error) error {
	if errors.Is(err, kvindex.ErrCapacity) {
		return fmt.Errorf("max_blocks_per_stream (%d) reached: %w", y.lim.MaxBlocksPerStream, err)
	}
	return err
}

// beDeaf withdraws the view of a stream whose publisher sends only
// other topics: it would otherwise report synchronised while it hears
// nothing (item 4). The stream waits for its own topic.
func (y *syncer) beDeaf(topic []byte) {
	if y.deaf {
		return
	}
	y.deaf = true
	y.abortSnapshot()
	y.orderedReset()
	y.retryAt = time.Time{}
	y.invalidate(fmt.Sprintf("publisher sends topic %q, this stream expects %q; nothing of its own topic received", topic, y.s.spec.Topic))
}

// fault invalidates the stream and schedules recovery (R-REC-3). A
// calibration in progress turns into the recovery snapshot. A history or
// live stream drops its view and starts a new one.
func (y *syncer) fault(reason string) {
	if y.s.spec.ordered() {
		y.orderedReset()
		y.invalidate(reason)
		y.retryAt = time.Now()
		return
	}
	y.invalidate(reason)
	if y.snap != nil {
		if y.snap.calibrate {
			y.snap.calibrate = false
		}
		return
	}
	y.retryAt = time.Now()
}

// fail invalidates with a reason and no retry scheduling change.
func (y *syncer) fail(reason string) { y.invalidate(reason) }

func (y *syncer) invalidate(reason string) {
	if y.s.idx != nil && !y.s.spec.ordered() {
		y.withdrawn = y.s.idx
	}
	y.s.invalidate(reason)
	y.dedupActive = false
	y.nextResync = time.Time{}
	if reason != y.lastReason {
		y.log.Warn("stream unsynchronised", "stream", y.s.spec.String(), "reason", reason)
		y.lastReason = reason
	}
}

// pause delays the next attempt with jittered exponential backoff
// (R-REC-5).
func (y *syncer) pause(now time.Time) {
	if y.backoff == 0 {
		y.backoff = backoffMin
	} else {
		y.backoff = min(2*y.backoff, backoffMax)
	}
	jitter := time.Duration(rand.Int64N(int64(y.backoff)/5 + 1))
	y.retryAt = now.Add(y.backoff + jitter)
}

// resyncAt returns when a stream synchronised or calibrated at now takes
// its next calibration: at a random point of the last quarter of
// ResyncInterval, never later than the interval (R-REC-4). Streams
// synchronised together, as at start-up or after their engines came
// back, would otherwise ask for their snapshots in the same instant every
// interval: 128 at once overran a host of emulated engines past the
// replay timeout and starved its etcd of CPU for long enough to end
// kvcar's lease.
func (y *syncer) resyncAt(now time.Time) time.Time {
	return now.Add(resyncJitter(y.lim.ResyncInterval))
}

func resyncJitter(d time.Duration) time.Duration {
	return d*3/4 + time.Duration(rand.Int64N(int64(d/4)+1))
}

func (y *syncer) closeSockets() {
	y.abortSnapshot()
	y.abortCatchUp()
	if y.sub != nil {
		if err := y.sub.Close(); err != nil {
			y.log.Debug("close subscriber", "stream", y.s.spec.String(), "err", err)
		}
		y.sub = nil
	}
}
