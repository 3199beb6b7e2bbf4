package kvdir

import (
	"sync"
	"sync/atomic"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvindex"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// stream is one instance/DP event stream. The fields under mu form the
// published view that queries read; everything else about the stream's
// progress lives in its syncer, owned by the stream goroutine.
type stream struct {
	spec StreamSpec
	// relay is the loopback endpoint of the hub of a bound stream, set
	// before the goroutine starts.
	relay string
	// keys is the shared key table of the stream's key group and slot
	// its place in the table's bitsets, set before the goroutine starts;
	// keys is nil for a stream outside a directory. pending holds the
	// published index's key changes not yet written to keys, and dropped
	// whether one of them may take a tier away; both belong to the
	// goroutine that applies events, like the index.
	keys      *keyTable
	slot      int
	pending   []keyChange
	dropped   bool
	observeFn func(kvindex.Key, bool, bool, bool)
	// lastResident is what the view withdrawn last held (see viewSize);
	// it belongs to the goroutine that applies events.
	lastResident int

	mu sync.RWMutex
	// idx is nil whenever the stream is not synchronised, so a stale view
	// can never be served (R-REC-1).
	idx    *kvindex.Index
	synced bool
	seq    uint64
	// hasSeq is false while the view reflects no live message at all (an
	// empty snapshot of an engine that has published nothing).
	hasSeq bool
	// complete is false while the view may lack blocks the engine stored
	// before the view began (history and live modes).
	complete bool
	reason   string

	// qv mirrors the view fields under mu for queries, which read it
	// without taking mu (see queryView).
	qv queryView

	counters streamCounters
	obs      *streamObservers // nil without metrics; set before the goroutine starts
	// decodeHeld is the decode storage the goroutine kept after its
	// last message (trimBatch) or drain (releaseBatch).
	decodeHeld atomic.Int64

	stop chan struct{}
	done chan struct{}
	// waker ends the goroutine's wait on its sockets when stop closes;
	// nil if it could not be made, and the wait then ends by pollInterval.
	waker *kvtransport.Waker
}

// queryView is the part of a stream's view a query reports, readable
// without the stream lock: 128 lock round trips were a third of a query
// that misses. It is a sequence lock over atomic fields: writers, who
// hold the stream lock, make gen odd, store the fields and make it even
// again; a reader that sees the same even gen before and after its loads
// read one consistent state, and otherwise retries or takes the lock.
type queryView struct {
	gen       atomic.Uint64
	flags     atomic.Uint32 // qvSynced, qvComplete
	seq       atomic.Uint64
	dev, host atomic.Int64
	reason    atomic.Pointer[string]
}

const (
	qvSynced uint32 = 1 << iota
	qvComplete
)

// syncView copies the view fields to qv. The caller holds s.mu.
func (s *stream) syncView() {
	v := &s.qv
	v.gen.Add(1)
	var fl uint32
	if s.synced {
		fl |= qvSynced
		if s.complete {
			fl |= qvComplete
		}
	}
	v.flags.Store(fl)
	v.seq.Store(s.seq)
	var d, h int
	if s.synced && s.idx != nil {
		d, h = s.idx.Counts()
	}
	v.dev.Store(int64(d))
	v.host.Store(int64(h))
	if r := v.reason.Load(); r == nil || *r != s.reason {
		reason := s.reason
		v.reason.Store(&reason)
	}
	v.gen.Add(1)
}

// streamCounters are monotonic totals, readable without the lock.
type streamCounters struct {
	batchesApplied atomic.Uint64
	eventsApplied  atomic.Uint64
	// eventsByKind counts applied events by kvevent.Kind (index 0 unused).
	eventsByKind     [4]atomic.Uint64
	decodeErrors     atomic.Uint64
	gaps             atomic.Uint64
	disconnects      atomic.Uint64
	snapshotsStarted atomic.Uint64
	snapshotsOK      atomic.Uint64
	snapshotsFailed  atomic.Uint64
	topicMismatches  atomic.Uint64
	// otherRank counts a bound stream's batches of another DP rank.
	otherRank atomic.Uint64
	// waits counts the stream goroutine's waits on its sockets, so that
	// a test can tell an idle stream from a spinning one.
	waits      atomic.Uint64
	duplicates atomic.Uint64
	// bufferedBatches counts live deltas queued during snapshots and
	// coveredBatches those of them the snapshot already reflected.
	bufferedBatches atomic.Uint64
	coveredBatches  atomic.Uint64
	fullStateSyncs  atomic.Uint64
	// partialStarts counts views (re)started without the engine's whole
	// state: a history window that does not reach back far enough, a
	// live stream joining late, a gap nothing could repair.
	partialStarts atomic.Uint64
	// tailRepairs counts batches a history calibration found that the
	// live channel had not delivered.
	tailRepairs   atomic.Uint64
	bufferedBytes atomic.Int64
	// lastSnapshot is how long the last successful snapshot took from
	// request to publish, in nanoseconds.
	lastSnapshot atomic.Int64
	// lastSnapshotReceive is the part of it from the first reply batch
	// to publish: kvcar's own receive, decode and apply work.
	lastSnapshotReceive atomic.Int64
	// lastApplied is when the last live batch was applied, UnixNano.
	lastApplied atomic.Int64
}

// countEvents adds the events of an applied batch to the totals.
func (c *streamCounters) countEvents(b *kvevent.Batch) {
	c.eventsApplied.Add(uint64(len(b.Events)))
	for i := range b.Events {
		if k := b.Events[i].Kind; int(k) < len(c.eventsByKind) {
			c.eventsByKind[k].Add(1)
		}
	}
}

func newStream(spec StreamSpec) *stream {
	s := &stream{
		spec:   spec,
		reason: "waiting for first snapshot",
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	s.syncView()
	return s
}

// attach gives the stream its slot in the shared key table of its group.
func (s *stream) attach(t *keyTable) {
	s.keys, s.slot = t, t.allocSlot()
	s.observeFn = s.observe
}

// observe queues a key change of the published index for the shared
// table; a full queue is written at once, so a large event (a clear of
// the whole index) holds a bounded queue.
func (s *stream) observe(k kvindex.Key, dev, host, dropped bool) {
	s.dropped = s.dropped || dropped
	s.keys.push(s.slot, &s.pending, k, dev, host)
}

// flushKeys writes the queued key changes to the shared table. Whoever
// applies events to the published index calls it once they are applied,
// whether they applied or one failed part way (applyPublished does it
// for drops at once).
func (s *stream) flushKeys() {
	if s.keys != nil {
		s.keys.flush(s.slot, &s.pending)
	}
	s.dropped = false
}

// applyPublished applies the first events of evs to ix, the stream's
// published index, under one hold of the stream lock, and returns how
// many it applied; on failure n is the failing event's position. A
// hold ends after the event that brings its blocks to runBlocks: a batch
// of many small events (engines' decode steps, a block each) then costs
// one lock round and one update of the query view per run, not per
// event; the index stores a prefill sent as a chain of such events (an
// event a page, as SGLang sends it) together (ApplyRun). A hold covers
// fewer than runBlocks blocks and one event more, so it lasts little
// longer than one large event's alone.
//
// A change that may take a tier away from a key is written to the
// shared table before the next event applies: a query must not find a
// block once its removal is applied. A run of removals on one medium
// counts as one event, as one removal naming all its blocks would.
// Additions wait in pending, so that they reach the table in chunks whose
// cache misses overlap, not one change at a time; the caller flushes them
// after its batch, also when an event failed.
func (s *stream) applyPublished(ix *kvindex.Index, evs []kvevent.Event, mode kvindex.Mode) (n int, err error) {
	s.mu.Lock()
	for blocks := 0; n < len(evs) && blocks < runBlocks; {
		var k int
		k, err = ix.ApplyRun(evs[n:], mode, runBlocks-blocks)
		for i := n; i < n+k; i++ {
			blocks += max(1, len(evs[i].BlockHashes))
		}
		if n += k; err != nil {
			break
		}
		// ApplyRun ends a run of stores after an event that dropped a
		// tier; a run of removals is all drops, written here at once.
		if s.dropped {
			s.flushKeys()
		}
	}
	s.syncView()
	s.mu.Unlock()
	return n, err
}

// runBlocks bounds the blocks of the events applyPublished applies under
// one hold of the stream lock, and of a run of events the index stores
// together (kvindex.ApplyRun).
const runBlocks = 64

// applyEvents applies evs to ix, a view no query reads, a run of events
// at a time, and returns how many it applied; on failure evs[n] is the
// failing event and the events before it are applied.
func applyEvents(ix *kvindex.Index, evs []kvevent.Event, mode kvindex.Mode) (n int, err error) {
	for n < len(evs) {
		var k int
		k, err = ix.ApplyRun(evs[n:], mode, runBlocks)
		if n += k; err != nil {
			break
		}
	}
	return n, err
}

// match fills m with the stream's view, with the prefix found for it by
// the walk over its key group's shared table (nil for a status query).
// id and slot are the stream's identity and slot as its set lists them
// (streamSet.layout and slotOf): a query over 128 streams reads them in
// a row rather than from 128 stream structures.
func (s *stream) match(id *StreamInfo, slot int, wr *walkResult, m *Match) {
	// Every field is written: callers reuse one Match across streams.
	// m is zeroed in place and the identity stored field by field: a
	// composite literal is built on the stack with 8-byte stores and
	// copied with 16-byte loads, which cannot be forwarded from those
	// stores, and that stall was about half of each stream's share of a
	// query (the performance log's "A Match written in place").
	*m = Match{}
	m.InstanceName, m.DPRank, m.Incarnation, m.Discovered = id.InstanceName, id.DPRank, id.Incarnation, id.Discovered
	v := &s.qv
	for range 4 {
		g := v.gen.Load()
		if g&1 != 0 {
			continue
		}
		fl, seq, dev, host, reason := v.flags.Load(), v.seq.Load(), v.dev.Load(), v.host.Load(), v.reason.Load()
		if v.gen.Load() != g {
			continue
		}
		m.Synchronized, m.Complete, m.Sequence = fl&qvSynced != 0, fl&qvComplete != 0, seq
		if reason != nil {
			m.Error = *reason
		}
		if m.Synchronized && fillHits(wr, slot, m) {
			m.DeviceBlocks, m.HostBlocks = int(dev), int(host)
		}
		return
	}
	s.mu.RLock()
	m.Synchronized = s.synced
	m.Complete = s.synced && s.complete
	m.Sequence = s.seq
	m.Error = s.reason
	if s.synced && s.idx != nil && fillHits(wr, slot, m) {
		m.DeviceBlocks, m.HostBlocks = s.idx.Counts()
	}
	s.mu.RUnlock()
}

// viewChanging is the reason of a synchronised stream whose slot did not
// count in the walk: its view was being published or withdrawn.
const viewChanging = "view being published or withdrawn"

// fillHits sets m's hit tokens from slot's answer in the walk. A view
// withdrawn after the walk reads unsynchronised and gets none (R-REC-1). A
// stream said synchronised whose slot the walk did not count is between
// its view and the table (publish counts the slot before it says
// synchronised, invalidate stops counting it just before it says
// unsynchronised): it reads unsynchronised too, rather than synchronised
// with no hits, an answer a router would take for an engine holding
// nothing. fillHits reports whether m stays synchronised; without a walk
// (a prompt shorter than a block, a status query) it does.
func fillHits(wr *walkResult, slot int, m *Match) bool {
	dev, hostOnly, ok := wr.tokensOf(slot)
	if !ok {
		if wr != nil && wr.walked {
			m.Synchronized, m.Complete, m.Error = false, false, viewChanging
			return false
		}
		return true
	}
	m.DeviceHitTokens, m.HostOnlyHitTokens = dev, hostOnly
	m.ReusablePrefixTokens = dev + hostOnly
	return true
}

// publish makes idx the stream's view at sequence seq (R-REC-2: the whole
// snapshot becomes visible at once); complete says whether it may lack
// blocks stored before it began.
//
// The shared table follows: a stream with no view writes the new view's
// keys while its slot is unpublished, then publishes the slot, then the
// view; a stream replacing a served view (a calibration) swaps the keys
// in place, never showing more than one of the two views
// (keyTable.replace). Only the goroutine that owns the stream's index
// calls publish and invalidate, so s.idx is read here without the lock.
func (s *stream) publish(idx *kvindex.Index, seq uint64, hasSeq, complete bool) {
	old := s.idx
	if s.keys != nil && idx != old {
		if old != nil {
			old.SetObserver(nil)
			s.flushKeys()
			s.keys.replace(s.slot, old, idx, &s.pending)
		} else {
			s.keys.fill(s.slot, idx, &s.pending)
		}
		idx.SetObserver(s.observeFn)
	}
	if s.keys != nil {
		// The slot counts before the stream says synchronised, so that
		// no answer says synchronised without the view's hits.
		s.keys.setPublished(s.slot, true)
	}
	s.mu.Lock()
	s.idx, s.synced, s.seq, s.hasSeq, s.complete, s.reason = idx, true, seq, hasSeq, complete, ""
	s.syncView()
	s.mu.Unlock()
}

// invalidate withdraws the view: queries report zero hits and reason.
// The slot leaves the shared table's published mask before anything else,
// so no query counts its bits from then on (R-REC-1); the bits are
// cleared after, for the next view to start from none.
func (s *stream) invalidate(reason string) {
	if s.keys != nil {
		s.keys.setPublished(s.slot, false)
	}
	s.mu.Lock()
	old := s.idx
	s.idx, s.synced, s.reason = nil, false, reason
	s.syncView()
	s.mu.Unlock()
	if old != nil {
		s.lastResident = old.Resident()
	}
	if old != nil && s.keys != nil {
		old.SetObserver(nil)
		s.flushKeys()
		s.keys.withdraw(s.slot, old, &s.pending)
	}
}

// viewSize is the number of blocks the stream's view holds, or, without
// one, the view withdrawn last held: what a new view is expected to hold.
func (s *stream) viewSize() int {
	if s.idx != nil {
		return s.idx.Resident()
	}
	return s.lastResident
}

// status returns the published state for logs and tests.
func (s *stream) status() (synced bool, seq uint64, reason string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.synced, s.seq, s.reason
}
