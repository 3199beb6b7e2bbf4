package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults of Options, those of xllm-service.
const (
	DefaultLeaseLostGrace   = 3000 * time.Millisecond
	DefaultSuspectTimeout   = 15 * time.Second
	DefaultProbeTimeout     = time.Second
	DefaultProbeAttempts    = 2
	DefaultMasterLeaseTTL   = 3 * time.Second
	DefaultLoadSyncInterval = 3 * time.Second
	// A watch silent for a second asks for progress, and one that has
	// not answered within three is stalled: a black-holed connection is
	// found in seconds, long before gRPC's keepalive (10 s + 3 s) would
	// close it, while etcd answers a progress request in milliseconds.
	DefaultWatchProgressInterval = time.Second
	DefaultWatchStallTimeout     = 3 * time.Second
	// Engines report once a second, so a load is up to a second old
	// when it arrives; 100 ms more bounds the snapshots heartbeats cause
	// to ten a second however many engines there are.
	DefaultLoadPublishDelay = 100 * time.Millisecond
)

// Options configures a Registry. Zero durations and counts select the
// defaults.
type Options struct {
	// Client is the etcd client; required. The caller closes it after Run
	// has returned.
	Client *clientv3.Client
	// Namespace is the optional key namespace, normalized as
	// NormalizeNamespace does.
	Namespace string
	// SelfAddr is this service's address ("ip:rpc_port"), the value of
	// XLLM:SERVICE:MASTER and the name of XLLM:SERVICE:<SelfAddr>.
	// Empty: the registry only watches, never registers or becomes
	// master.
	SelfAddr string
	// Logger receives state changes and problems; nil discards them.
	Logger *slog.Logger
	// HTTPClient sends the health probes; nil means a client of its own
	// that opens a new connection for every probe and uses no proxy.
	HTTPClient *http.Client

	// LeaseLostGrace: LEASE_LOST without a heartbeat for this long
	// becomes SUSPECT.
	LeaseLostGrace time.Duration
	// SuspectTimeout: SUSPECT for this long is removed.
	SuspectTimeout time.Duration
	// ProbeTimeout bounds one health probe attempt.
	ProbeTimeout time.Duration
	// ProbeAttempts is the number of health probe attempts after a
	// DELETE.
	ProbeAttempts int
	// MasterLeaseTTL is the TTL of this service's lease, rounded up to
	// whole seconds as etcd grants them.
	MasterLeaseTTL time.Duration
	// LoadSyncInterval is how often the master writes XLLM:LOADMETRICS.
	LoadSyncInterval time.Duration
	// WatchProgressInterval: a watch that has brought nothing for this
	// long asks etcd for a progress notification, and asks again as long
	// as it stays silent.
	WatchProgressInterval time.Duration
	// LoadPublishDelay: a heartbeat that changes only load or latency
	// values, or nothing but its time, is published with the next
	// snapshot, at most this much later. One that changes an instance's
	// state, whether its load is usable or where the load came from is
	// published at once.
	LoadPublishDelay time.Duration
	// WatchStallTimeout: a watch that has brought nothing for this long,
	// not even the progress notifications it asked for, is stalled; the
	// registry abandons it and lists again. It must exceed
	// WatchProgressInterval.
	WatchStallTimeout time.Duration
}

// Registry is the local instance registry. Its methods are safe for
// concurrent use.
type Registry struct {
	cli           *clientv3.Client
	keys          keyspace
	self          string
	log           *slog.Logger
	http          *http.Client
	ownHTTP       bool
	grace         time.Duration
	suspectAfter  time.Duration
	probeTimeout  time.Duration
	probeAttempts int
	leaseTTL      int64 // seconds
	syncEvery     time.Duration
	progressEvery time.Duration
	stallAfter    time.Duration
	publishDelay  time.Duration

	snap        atomic.Pointer[Snapshot]
	master      atomic.Bool
	leaseUntil  atomic.Int64 // Unix nanoseconds until which the service lease is known alive
	callTimeout time.Duration
	running     atomic.Bool
	kick        chan struct{} // wakes the state timer after a deadline moved
	probes      sync.WaitGroup

	// How current the view is, for WatchState and the metrics.
	live        atomic.Bool  // listed, and the watch since has not failed or stalled
	lastContact atomic.Int64 // Unix nanoseconds of etcd's last answer to the listing or watch
	listings    atomic.Uint64
	stalls      atomic.Uint64

	mu      sync.Mutex
	runCtx  context.Context // for probes started by the watch
	entries map[string]*entry
	synced  map[string]syncedLoad // XLLM:LOADMETRICS entries, by name
	warned  map[string]int64      // key -> mod revision of a bad value already logged
	listed  bool
	dirty   bool // a change to publish before the lock is released
	// deferredSince is when the oldest change a heartbeat left for the
	// next snapshot was made; zero when there is none.
	deferredSince time.Time
	// order is every entry sorted by name, the snapshot's order, kept
	// across publications until an entry is added or removed.
	order      []*entry
	orderStale bool
	version    uint64
	lastEpoch  uint64
	// lastMetaGen is the last Instance.MetaGen given. It starts at
	// random, so that two registries in one process do not give the
	// same numbers to different Metas.
	lastMetaGen uint64
}

// entry is an instance with the bookkeeping the state machine needs.
type entry struct {
	inst    Instance
	key     string // the etcd key it is registered under
	value   []byte // of the last applied PUT
	incRev  int64  // revision of the PUT that registered this incarnation
	keyGone bool   // the key was deleted; a probe or LEASE_LOST/SUSPECT follows
	// epoch changes with every PUT and DELETE applied, so that a probe
	// answers only the DELETE that started it.
	epoch     uint64
	graceFrom time.Time // LEASE_LOST entered (a heartbeat also extends it)
	syncRev   int64     // mod revision of the last XLLM:LOADMETRICS value applied
}

type syncedLoad struct {
	load  Load
	rev   int64
	valid bool // parsed; an unparsable value still marks the key present
}

// New validates opts and creates a registry; Run starts it.
func New(opts Options) (*Registry, error) {
	if opts.Client == nil {
		return nil, errors.New("instance: Options.Client is required")
	}
	if opts.SelfAddr == masterName || strings.ContainsAny(opts.SelfAddr, " \t\r\n") {
		return nil, fmt.Errorf("instance: SelfAddr %q cannot name a service key", opts.SelfAddr)
	}
	r := &Registry{
		cli:           opts.Client,
		keys:          newKeyspace(opts.Namespace, opts.SelfAddr),
		self:          opts.SelfAddr,
		log:           opts.Logger,
		http:          opts.HTTPClient,
		grace:         orDefault(opts.LeaseLostGrace, DefaultLeaseLostGrace),
		suspectAfter:  orDefault(opts.SuspectTimeout, DefaultSuspectTimeout),
		probeTimeout:  orDefault(opts.ProbeTimeout, DefaultProbeTimeout),
		probeAttempts: opts.ProbeAttempts,
		syncEvery:     orDefault(opts.LoadSyncInterval, DefaultLoadSyncInterval),
		progressEvery: orDefault(opts.WatchProgressInterval, DefaultWatchProgressInterval),
		stallAfter:    orDefault(opts.WatchStallTimeout, DefaultWatchStallTimeout),
		publishDelay:  orDefault(opts.LoadPublishDelay, DefaultLoadPublishDelay),
		kick:          make(chan struct{}, 1),
		entries:       make(map[string]*entry),
		synced:        make(map[string]syncedLoad),
		warned:        make(map[string]int64),
		lastMetaGen:   rand.Uint64() >> 1, // room to count up
	}
	if r.stallAfter <= r.progressEvery {
		return nil, fmt.Errorf("instance: WatchStallTimeout %v must exceed WatchProgressInterval %v", r.stallAfter, r.progressEvery)
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.probeAttempts <= 0 {
		r.probeAttempts = DefaultProbeAttempts
	}
	ttl := orDefault(opts.MasterLeaseTTL, DefaultMasterLeaseTTL)
	r.leaseTTL = max(1, int64(math.Ceil(ttl.Seconds())))
	// A lease or election call slower than the lease TTL outlives the lease anyway.
	r.callTimeout = max(2*time.Second, time.Duration(r.leaseTTL)*time.Second)
	if r.http == nil {
		r.http = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		r.ownHTTP = true
	}
	r.snap.Store(&Snapshot{next: make(chan struct{})})
	return r, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Run lists and watches etcd, runs the state machine's timers and
// probes, and, with a SelfAddr, registers the service and takes part in
// the master election. It blocks until ctx ends, then stops everything
// it started (revoking its lease) and returns nil. A registry runs once.
func (r *Registry) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("instance: Run called twice")
	}
	r.mu.Lock()
	r.runCtx = ctx
	r.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { r.watchLoop(ctx) })
	wg.Go(func() { r.timerLoop(ctx) })
	if r.self != "" {
		wg.Go(func() { r.leaseLoop(ctx) })
	}
	<-ctx.Done()
	wg.Wait()
	r.probes.Wait()
	if r.ownHTTP {
		r.http.CloseIdleConnections()
	}
	return nil
}

// Snapshot returns the current view. It never blocks.
func (r *Registry) Snapshot() *Snapshot { return r.snap.Load() }

// Lookup returns the instance called name in the current view.
func (r *Registry) Lookup(name string) (Instance, bool) { return r.snap.Load().Lookup(name) }

// Changes returns a channel closed when a snapshot newer than the
// current one is published; ask again after it fires.
func (r *Registry) Changes() <-chan struct{} { return r.snap.Load().next }

// WaitFor waits until pred holds for the current snapshot or ctx ends.
func (r *Registry) WaitFor(ctx context.Context, pred func(*Snapshot) bool) error {
	for {
		s := r.snap.Load()
		if pred(s) {
			return nil
		}
		select {
		case <-s.next:
		case <-ctx.Done():
			return fmt.Errorf("instance: waiting for the registry: %w", ctx.Err())
		}
	}
}

// WatchState says how current the view is. It never blocks.
func (r *Registry) WatchState() WatchState {
	ws := WatchState{
		Live:     r.live.Load(),
		Listings: r.listings.Load(),
		Stalls:   r.stalls.Load(),
	}
	if ns := r.lastContact.Load(); ns != 0 {
		ws.LastContact = time.Unix(0, ns)
	}
	return ws
}

// IsMaster reports whether this replica holds XLLM:SERVICE:MASTER with
// a lease it knows to be alive: a master cut off from etcd stops
// reporting itself master when its lease may have expired, before
// another replica can have taken over.
func (r *Registry) IsMaster() bool {
	return r.master.Load() && time.Now().UnixNano() < r.leaseUntil.Load()
}

// Heartbeat applies an engine heartbeat: it keeps a LEASE_LOST instance
// schedulable, brings a SUSPECT one back to LEASE_LOST, and makes its
// load the freshest (R-CAR-10). The heartbeat's incarnation_id must be
// the registered one. A heartbeat that changes what routing may do with
// the instance (its state, whether its load is usable, where the load
// came from) is in the snapshot when Heartbeat returns; one that only
// moves the values is published within LoadPublishDelay, together with
// the heartbeats of other engines meanwhile. A heartbeat that fails
// Validate is refused whole (ErrInvalidHeartbeat): it changes nothing.
func (r *Registry) Heartbeat(hb Heartbeat) error {
	if err := hb.Validate(); err != nil {
		return fmt.Errorf("instance: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[hb.Name]
	if e == nil {
		return fmt.Errorf("instance: heartbeat from %q: %w", hb.Name, ErrUnknownInstance)
	}
	if hb.IncarnationID != e.inst.Meta.IncarnationID {
		return fmt.Errorf("instance: heartbeat from %q with incarnation_id %q, registered %q: %w",
			hb.Name, hb.IncarnationID, e.inst.Meta.IncarnationID, ErrStaleIncarnation)
	}
	was := e.inst.routing()
	now := time.Now()
	e.inst.LastHeartbeat = now
	if e.inst.State == Suspect {
		r.setState(e, LeaseLost, now, "heartbeat while suspect")
		e.graceFrom = now
		r.kickTimer() // the grace may end before the suspect timeout would have
	}
	if hb.Load != nil {
		r.setLoad(e, *hb.Load, LoadHeartbeat, now)
	}
	if hb.Latency != nil {
		e.inst.Latency = *hb.Latency
		e.inst.HasLatency = true
	}
	if e.inst.routing() != was {
		r.dirty = true
		r.flushLocked()
		return nil
	}
	// Every holder of the lock publishes before it lets go, so nothing
	// else is waiting to be published: only this heartbeat's values,
	// which can wait for the next snapshot.
	r.dirty = false
	if r.deferredSince.IsZero() {
		r.deferredSince = now
		r.kickTimer()
	}
	return nil
}

// SetRole makes a MIX instance play role (Prefill or Decode), as the
// SLO_AWARE policy flips them.
func (r *Registry) SetRole(name string, role Type) error {
	if role != Prefill && role != Decode {
		return fmt.Errorf("instance: role %v is neither PREFILL nor DECODE", role)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[name]
	if e == nil {
		return fmt.Errorf("instance: set role of %q: %w", name, ErrUnknownInstance)
	}
	if e.inst.Type != Mix {
		return fmt.Errorf("instance: set role of %q: a %v instance has a fixed role", name, e.inst.Type)
	}
	if e.inst.Role != role {
		e.inst.Role = role
		r.log.Info("instance role changed", "instance", name, "role", role)
		r.dirty = true
		r.flushLocked()
	}
	return nil
}

// flushLocked publishes a new snapshot if anything changed, with every
// change made so far, deferred ones included.
func (r *Registry) flushLocked() {
	if !r.dirty {
		return
	}
	r.dirty = false
	r.deferredSince = time.Time{}
	r.version++
	if r.orderStale {
		r.order = r.order[:0]
		for _, e := range r.entries {
			r.order = append(r.order, e)
		}
		slices.SortFunc(r.order, func(a, b *entry) int { return strings.Compare(a.inst.Meta.Name, b.inst.Meta.Name) })
		clear(r.order[len(r.order):cap(r.order)]) // removed entries are not kept alive
		r.orderStale = false
	}
	s := &Snapshot{
		Instances: make([]Instance, len(r.order)),
		Version:   r.version,
		Synced:    r.listed,
		next:      make(chan struct{}),
	}
	for i, e := range r.order {
		s.Instances[i] = e.inst
	}
	s.makeBriefs()
	old := r.snap.Swap(s)
	close(old.next)
}

// removeEntry forgets the instance called name.
func (r *Registry) removeEntry(name string) {
	delete(r.entries, name)
	r.orderStale = true
}

func (r *Registry) kickTimer() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// wait waits for d or until ctx ends, and reports whether ctx is live.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
