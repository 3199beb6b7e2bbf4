package kvdir

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// Options are the directory's collaborators.
type Options struct {
	Logger *slog.Logger
	// Registerer receives the directory's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Directory is the set of streams and the query view over them.
type Directory struct {
	lim     Limits
	log     *slog.Logger
	tctx    *kvtransport.Context
	metrics *metrics // nil without a Registerer

	// set is replaced whole on every change so queries read it without a
	// lock (copy on write; changes are rare, queries are constant).
	set atomic.Pointer[streamSet]

	// exclusions counts the instances discovery excludes, by kind.
	exclusions atomic.Pointer[map[string]int]

	// discovered is closed after the first discovery pass over a
	// registry snapshot that reflects etcd (see Discovered).
	discovered     chan struct{}
	discoveredOnce sync.Once

	mu     sync.Mutex // serialises SetStreams and Close
	closed bool
	// hubs are the bound subscribers in use, under mu.
	hubs map[hubKey]*hub
	// tables are the shared key tables by key group, under mu.
	tables map[keyGroup]*keyTable
	// lockedWalks counts the walks of every table, past ones included,
	// that fell back to the table's lock.
	lockedWalks atomic.Uint64
	// makers counts the goroutines making the tables' grown arrays,
	// those of tables since dropped included.
	makers sync.WaitGroup

	scratch sync.Pool // *queryScratch
	// batches is the decode storage the streams gave back.
	batches batchPool
}

// streamSet is an immutable list of streams sorted by instance then DP
// rank, with the distinct (block size, seed) pairs their keys need.
type streamSet struct {
	streams []*stream
	groups  []keyGroup
	// tables[i] is the shared key table of groups[i].
	tables []*keyTable
	// groupOf[i] indexes groups for streams[i]; it lives in the set, not
	// in the stream, because a kept stream may change group index from
	// one set to the next while queries still read the old set.
	groupOf []int
	// slotOf[i] is streams[i]'s slot in its group's table and layout the
	// streams as routers see them, for Hits.
	slotOf []int32
	layout *Layout
}

type keyGroup struct {
	blockSize int
	seed      uint64
}

// queryScratch holds one query's walk over each key group's table,
// reused across queries so the request path does not allocate.
type queryScratch struct {
	walks []walkResult
}

// New creates an empty directory. Streams are added with SetStreams.
func New(lim Limits, opts Options) (*Directory, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	tctx, err := kvtransport.NewContext()
	if err != nil {
		return nil, fmt.Errorf("kvdir: %w", err)
	}
	if err := tctx.IOThreadsYield(); err != nil {
		opts.Logger.Info("KV event I/O may preempt request handling", "err", err)
	}
	d := &Directory{lim: lim, log: opts.Logger, tctx: tctx, discovered: make(chan struct{}), hubs: map[hubKey]*hub{}, tables: map[keyGroup]*keyTable{}}
	d.set.Store((&streamSet{}).index())
	if opts.Registerer != nil {
		d.metrics = newMetrics(opts.Registerer, d)
	}
	d.scratch.New = func() any { return &queryScratch{} }
	return d, nil
}

// SetStreams makes specs the directory's streams: new ones start, missing
// ones stop, and a spec that changed in any field replaces its stream,
// which then serves no hits until its own snapshot (R-DISC-5).
func (d *Directory) SetStreams(specs []StreamSpec) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("kvdir: directory closed")
	}
	old := d.set.Load()
	byKey := make(map[StreamKey]*stream, len(old.streams))
	for _, s := range old.streams {
		byKey[s.spec.Key()] = s
	}
	seen := make(map[StreamKey]bool, len(specs))
	next := &streamSet{streams: make([]*stream, 0, len(specs))}
	var retired []*stream
	for _, spec := range specs {
		k := spec.Key()
		if seen[k] {
			return fmt.Errorf("kvdir: duplicate stream %s", spec)
		}
		seen[k] = true
		if s, ok := byKey[k]; ok && s.spec == spec {
			next.streams = append(next.streams, s)
			continue
		}
		next.streams = append(next.streams, newStream(spec))
	}
	kept := make(map[*stream]bool, len(next.streams))
	for _, s := range next.streams {
		kept[s] = true
	}
	for _, s := range old.streams {
		if !kept[s] {
			retired = append(retired, s)
		}
	}
	slices.SortFunc(next.streams, func(a, b *stream) int {
		return cmp.Or(cmp.Compare(a.spec.InstanceName, b.spec.InstanceName), cmp.Compare(a.spec.DPRank, b.spec.DPRank))
	})
	next.groupOf = make([]int, len(next.streams))
	for si, s := range next.streams {
		g := keyGroup{s.spec.BlockSize, s.spec.HashSeed}
		i := slices.Index(next.groups, g)
		if i < 0 {
			i = len(next.groups)
			next.groups = append(next.groups, g)
		}
		next.groupOf[si] = i
	}
	// Bound subscribers the new streams need are bound first: a port
	// that cannot be bound fails the change before anything moved.
	var started []*hub
	for _, s := range next.streams {
		if byKey[s.spec.Key()] == s || s.spec.Bind == "" {
			continue
		}
		h, ok := d.hubs[s.spec.hubKey()]
		if !ok {
			var err error
			if h, err = d.startHub(s.spec.hubKey()); err != nil {
				for _, sh := range started {
					delete(d.hubs, sh.key)
					sh.close()
				}
				return err
			}
			d.hubs[h.key] = h
			started = append(started, h)
		}
		h.refs++
		s.relay = h.relay
	}
	for _, s := range next.streams {
		if byKey[s.spec.Key()] != s {
			g := keyGroup{s.spec.BlockSize, s.spec.HashSeed}
			t, ok := d.tables[g]
			if !ok {
				t = newKeyTable(g.blockSize, g.seed)
				t.lockedWalks = &d.lockedWalks
				t.makers = &d.makers
				d.tables[g] = t
			}
			s.attach(t)
		}
	}
	next.tables = make([]*keyTable, len(next.groups))
	for i, g := range next.groups {
		next.tables[i] = d.tables[g]
	}
	// Publish the new set before stopping retired streams so no query
	// sees a stream that is going away.
	d.set.Store(next.index())
	stopAll(retired)
	// A retired stream's slot is reused only once its view is withdrawn
	// from the shared table; a query still reading an older set then
	// finds the stream unsynchronised and reports nothing for it.
	for _, s := range retired {
		s.invalidate("stream removed")
		s.keys.freeSlot(s.slot)
	}
	for g, t := range d.tables {
		if t.slots() == 0 {
			delete(d.tables, g)
		}
	}
	for _, s := range retired {
		if s.spec.Bind != "" {
			d.releaseHub(s.spec.hubKey())
		}
	}
	// Series of retired streams go before their replacements start, so a
	// replacement of the same instance and rank starts from zero.
	for _, s := range retired {
		d.metrics.forget(s.spec)
	}
	for _, s := range next.streams {
		if byKey[s.spec.Key()] != s {
			d.start(s)
		}
	}
	return nil
}

func (d *Directory) start(s *stream) {
	s.obs = d.metrics.observers(s.spec)
	if w, err := d.tctx.NewWaker(); err != nil {
		d.log.Warn("stream stops more slowly: no waker", "stream", s.spec.String(), "err", err)
	} else {
		s.waker = w
	}
	y := &syncer{
		s:       s,
		lim:     d.lim,
		log:     d.log,
		tctx:    d.tctx,
		dec:     kvevent.NewDecoder(d.lim.MaxMessageBytes),
		batches: &d.batches,
		// The first synchronisation is logged like a recovery.
		lastReason: s.reason,
	}
	go y.run()
}

// releaseHub drops one stream's reference and closes an unused hub.
func (d *Directory) releaseHub(k hubKey) {
	h, ok := d.hubs[k]
	if !ok {
		return
	}
	if h.refs--; h.refs <= 0 {
		delete(d.hubs, k)
		h.close()
	}
}

func stopAll(streams []*stream) {
	for _, s := range streams {
		close(s.stop)
		if s.waker != nil {
			// Waking a waker its goroutine already closed does nothing.
			_ = s.waker.Wake()
		}
	}
	for _, s := range streams {
		<-s.done
	}
}

// Close stops every stream goroutine and releases the sockets.
func (d *Directory) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	stopAll(d.set.Load().streams)
	// The key tables' growths may still be making an array.
	d.makers.Wait()
	d.set.Store((&streamSet{}).index())
	for k, h := range d.hubs {
		h.close()
		delete(d.hubs, k)
	}
	if err := d.tctx.Close(); err != nil {
		return fmt.Errorf("kvdir: %w", err)
	}
	return nil
}

// Query appends one Match per stream to dst, sorted by instance then DP
// rank: the contiguous prefix of tokenIDs each stream holds, or, for
// empty tokenIDs, just its status and resident counts (R-API-3/4). It
// reads in-process state only and does not allocate when dst has room.
func (d *Directory) Query(tokenIDs []uint32, dst []Match) []Match {
	set := d.set.Load()
	qs := d.walkAll(set, tokenIDs)
	// match writes every field of its Match, so the slots are taken
	// without append's zeroing of each.
	n := len(dst)
	dst = slices.Grow(dst, len(set.streams))[:n+len(set.streams)]
	for si, s := range set.streams {
		var wr *walkResult
		if qs != nil {
			wr = &qs.walks[set.groupOf[si]]
		}
		s.match(&set.layout.Streams[si], int(set.slotOf[si]), wr, &dst[n+si])
	}
	d.putScratch(qs)
	return dst
}

// Len returns the number of streams.
func (d *Directory) Len() int { return len(d.set.Load().streams) }
