package enginesim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// ErrNotRunning is returned by operations on an engine that has not been
// started or has been closed.
var ErrNotRunning = errors.New("enginesim: engine is not running")

// rebindTimeout bounds how long Restart retries binding a port that the
// previous sockets are still releasing in the background.
const rebindTimeout = 3 * time.Second

// BlockState is one block resident in the engine, on one or both tiers.
type BlockState struct {
	Hash      kvevent.EngineHash
	Parent    kvevent.EngineHash
	HasParent bool
	// Tokens are this block's own tokens.
	Tokens []uint32
	Device bool
	Host   bool
}

// Engine emulates the KV event side of one xLLM instance: per DP rank a
// block cache, a live XPUB and a replay ROUTER. All methods are safe for
// concurrent use; those that change the cache return once the resulting
// live message has been handed to the socket.
type Engine struct {
	cfg Config

	// life serialises Start, Close and the restarts. Locks are taken in
	// the order life, regMu, mu, and nothing waits for a goroutine that
	// may need a lock the waiter holds.
	life sync.Mutex

	// mu is held shared by every operation on a rank and exclusively
	// while ranks come and go, so that a rank never goes away under a
	// caller. It also guards cfg.Name and cfg.DPSize, which change only
	// then.
	mu      sync.RWMutex
	tctx    *kvtransport.Context
	ranks   []*rank
	running bool
	// stopped is set once the engine has been closed: its ports are then
	// concrete and may still be held by the old sockets for a moment.
	stopped  bool
	events   []string
	replays  []string
	httpAddr string
	http     *httpServer

	// regMu serialises everything that changes the registration: the
	// registrar (present while running with Etcd), the identity and the
	// reconciler's repairs. The pointers are atomic for the readers.
	regMu      sync.Mutex
	reg        atomic.Pointer[registrar]
	ident      atomic.Pointer[identity]
	mixRole    atomic.Int32
	reconciler *reconciler  // under life
	beater     *heartbeater // under life

	// Knobs and reported load, read by the HTTP and heartbeat goroutines.
	unhealthy atomic.Bool
	hbPaused  atomic.Bool
	waiting   atomic.Uint64
	ttftMs    atomic.Int64
	tbtMs     atomic.Int64
	hb        heartbeatState

	// The inference request path: queues, slots and counters, and the
	// status SetFailRequests forces.
	serve      serving
	failStatus atomic.Int32
	// served is the reports of the requests served over baidu_std.
	served servedLog
}

// New validates cfg and fills in defaults. It binds nothing (see Start);
// with DiscoveryOffsets and HTTP port 0 it only probes for free ports.
func New(cfg Config) (*Engine, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Engine{
		cfg:     c,
		events:  append([]string(nil), c.EventEndpoints...),
		replays: append([]string(nil), c.ReplayEndpoints...),
	}, nil
}

// Name returns the instance name: the configured one, else the HTTP
// address, known once the engine has bound it.
func (e *Engine) Name() string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.cfg.Name
}

// DPSize returns the number of DP ranks.
func (e *Engine) DPSize() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.cfg.DPSize
}

// BlockSize returns the number of tokens per block.
func (e *Engine) BlockSize() int { return e.cfg.BlockSize }

// Start binds the HTTP server and every rank's sockets and starts their
// goroutines; with Etcd it then registers the instance and, with
// Heartbeat, starts reporting. Ports picked for port-0 addresses are kept
// from then on, also when the engine is started again after Close. A
// failed Start leaves the engine stopped.
func (e *Engine) Start() error {
	e.life.Lock()
	defer e.life.Unlock()
	if err := e.startCore(); err != nil {
		return err
	}
	if e.cfg.Etcd == nil {
		return nil
	}
	if err := e.startRegistration(); err != nil {
		return errors.Join(err, e.stopCore())
	}
	return nil
}

func (e *Engine) startCore() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running {
		return errors.New("enginesim: engine already started")
	}
	var bindWait time.Duration
	if e.stopped {
		bindWait = rebindTimeout
	}
	var hs *httpServer
	if e.cfg.HTTPAddr != "" {
		addr := e.httpAddr
		if addr == "" {
			addr = e.cfg.HTTPAddr
		}
		var err error
		if hs, err = e.startHTTP(addr, time.Now().Add(bindWait)); err != nil {
			return err
		}
		e.httpAddr = hs.addr
		if e.cfg.Name == "" {
			e.cfg.Name = hs.addr
		}
	}
	tctx, err := kvtransport.NewContext()
	if err != nil {
		return errors.Join(fmt.Errorf("enginesim: %s: %w", e.cfg.Name, err), stopHTTP(hs))
	}
	ranks, err := e.startRanks(tctx, e.events, e.replays, bindWait)
	if err != nil {
		return errors.Join(err, tctx.Close(), stopHTTP(hs))
	}
	e.tctx, e.ranks, e.running, e.http = tctx, ranks, true, hs
	e.startServing()
	return nil
}

// startServing opens the request queues of a new process.
func (e *Engine) startServing() {
	e.serve.start(e.cfg.DPSize, e.cfg.BatchSlots, e.cfg.MaxQueue)
}

// startRanks starts one goroutine per endpoint pair and waits until all
// have bound; on any failure it stops them all. It records the concrete
// endpoints in e.events and e.replays. The caller holds mu.
func (e *Engine) startRanks(tctx *kvtransport.Context, events, replays []string, bindWait time.Duration) ([]*rank, error) {
	ranks := make([]*rank, len(events))
	results := make(chan error, len(events))
	for dp := range ranks {
		ranks[dp] = newRank(dp, &e.cfg, tctx, events[dp], replays[dp])
		go ranks[dp].run(bindWait, results)
	}
	var errs []error
	for range ranks {
		if err := <-results; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		stopRanks(ranks)
		return nil, fmt.Errorf("enginesim: start %s: %w", e.cfg.Name, errors.Join(errs...))
	}
	e.events, e.replays = make([]string, len(ranks)), make([]string, len(ranks))
	for dp, r := range ranks {
		e.events[dp], e.replays[dp] = r.eventEP, r.replayEP
	}
	return ranks, nil
}

func stopHTTP(hs *httpServer) error {
	if hs == nil {
		return nil
	}
	return hs.stop()
}

// startRegistration registers a new process start and starts the
// heartbeats and the reconciler. The caller holds life.
func (e *Engine) startRegistration() error {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	id, err := e.nextIdentity()
	if err != nil {
		return err
	}
	r, err := newRegistrar(e.cfg.Etcd, e.cfg.Logger.With("engine", e.Name()))
	if err != nil {
		return fmt.Errorf("enginesim: %s: %w", e.Name(), err)
	}
	if err := e.register(r, id); err != nil {
		return errors.Join(err, r.close())
	}
	e.ident.Store(&id)
	e.reg.Store(r)
	if e.cfg.Heartbeat != nil {
		e.beater = e.startHeartbeat(r.cli)
	}
	if e.cfg.Etcd.ReconcileInterval > 0 {
		e.reconciler = e.startReconciler(r, e.cfg.Etcd.ReconcileInterval)
	}
	return nil
}

// Close deregisters the instance (its etcd key disappears), stops the
// heartbeats, the HTTP server and every rank goroutine, closes the sockets
// and waits for all of it. Closing an engine that is not running does
// nothing.
func (e *Engine) Close() error {
	e.life.Lock()
	defer e.life.Unlock()
	return e.closeLocked()
}

func (e *Engine) closeLocked() error {
	var errs []error
	if e.beater != nil {
		e.beater.stop()
		e.beater = nil
	}
	if e.reconciler != nil {
		e.reconciler.stop()
		e.reconciler = nil
	}
	e.regMu.Lock()
	if r := e.reg.Swap(nil); r != nil {
		if err := r.close(); err != nil {
			errs = append(errs, err)
		}
	}
	e.regMu.Unlock()
	if err := e.stopCore(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("enginesim: close %s: %w", e.Name(), errors.Join(errs...))
	}
	return nil
}

// stopCore ends the requests in flight and stops the HTTP server before
// it takes mu: a request handler may be waiting for a rank, under mu
// shared, and the server's shutdown waits for the handlers. The caller
// holds life, so nothing starts meanwhile.
func (e *Engine) stopCore() error {
	e.mu.RLock()
	running, hs := e.running, e.http
	e.mu.RUnlock()
	if !running {
		return nil
	}
	e.serve.stop()
	httpErr := stopHTTP(hs)
	e.mu.Lock()
	defer e.mu.Unlock()
	stopRanks(e.ranks)
	e.ranks, e.running, e.stopped = nil, false, true
	err := errors.Join(e.tctx.Close(), httpErr)
	e.tctx, e.http = nil, nil
	if err != nil {
		return fmt.Errorf("enginesim: stop %s: %w", e.cfg.Name, err)
	}
	return nil
}

func stopRanks(ranks []*rank) {
	for _, r := range ranks {
		close(r.quit)
		if r.waker != nil {
			_ = r.waker.Wake() // a closed waker has already stopped waiting
		}
	}
	for _, r := range ranks {
		<-r.done
	}
}

// EventEndpoint returns the live endpoint of rank dp, with the real port
// once the engine has started.
func (e *Engine) EventEndpoint(dp int) string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if dp < 0 || dp >= len(e.events) {
		return ""
	}
	return e.events[dp]
}

// ReplayEndpoint returns the replay endpoint of rank dp, with the real
// port once the engine has started.
func (e *Engine) ReplayEndpoint(dp int) string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if dp < 0 || dp >= len(e.replays) {
		return ""
	}
	return e.replays[dp]
}

// do runs fn on the goroutine that owns rank dp and waits for it.
func (e *Engine) do(dp int, fn func(r *rank) error) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if !e.running {
		return ErrNotRunning
	}
	if dp < 0 || dp >= len(e.ranks) {
		return fmt.Errorf("enginesim: %s: dp rank %d out of range [0,%d)", e.cfg.Name, dp, len(e.ranks))
	}
	r := e.ranks[dp]
	done := make(chan error, 1)
	select {
	case r.cmds <- func() { done <- fn(r) }:
	case <-r.done:
		return ErrNotRunning
	}
	// After the command is queued, so that the wait it ends is not
	// followed by another before the command is taken.
	if err := r.waker.Wake(); err != nil {
		return fmt.Errorf("enginesim: %s: wake dp rank %d: %w", e.cfg.Name, dp, err)
	}
	select {
	case err := <-done:
		return err
	case <-r.done:
		return ErrNotRunning
	}
}

// Prefill serves a prompt on rank dp: it reuses the contiguous cached
// prefix of full blocks, loads Host-only blocks of it back to Device,
// computes and stores the rest, evicts as needed and publishes everything
// that changed as one live batch. It reports the tokens reused from each
// tier. A partial last block is never cached. When every Device block
// belongs to the prompt itself the remaining blocks are not cached.
func (e *Engine) Prefill(dp int, tokens []uint32) (deviceHitTokens, hostHitTokens int, err error) {
	err = e.do(dp, func(r *rank) error {
		b := r.startBatch()
		deviceHitTokens, hostHitTokens = r.cache.prefill(tokens, b)
		return r.publish(b)
	})
	return deviceHitTokens, hostHitTokens, err
}

// PrefillBatch serves prompts on rank dp in one scheduler step: each as
// Prefill serves it, in order, and everything that changed goes out as
// one live batch. A decode step has this shape when every prompt is a
// running request's, one block longer than at its last step: each
// request that filled a block adds a BlockStored of that block alone,
// with removals among them when the cache is full.
func (e *Engine) PrefillBatch(dp int, prompts [][]uint32) error {
	return e.do(dp, func(r *rank) error {
		b := r.startBatch()
		for _, p := range prompts {
			r.cache.prefill(p, b)
		}
		return r.publish(b)
	})
}

// StoreChain stores the full blocks of tokens on tier m as one chain from
// the root, as one BlockStored with tokens, and returns the chain's
// hashes. Storing on Host needs HostBlocks > 0.
func (e *Engine) StoreChain(dp int, tokens []uint32, m kvevent.Medium) ([]kvevent.EngineHash, error) {
	if m == kvevent.Host && e.cfg.HostBlocks == 0 {
		return nil, fmt.Errorf("enginesim: %s: store on host: host offload is disabled", e.Name())
	}
	var hashes []kvevent.EngineHash
	err := e.do(dp, func(r *rank) error {
		b := r.startBatch()
		hashes = r.cache.storeChain(tokens, m, b)
		return r.publish(b)
	})
	return hashes, err
}

// Remove drops the tier-m copies of hashes and announces those that were
// resident; nothing is published when none was.
func (e *Engine) Remove(dp int, hashes []kvevent.EngineHash, m kvevent.Medium) error {
	return e.do(dp, func(r *rank) error {
		b := r.startBatch()
		r.cache.remove(hashes, m, b)
		return r.publish(b)
	})
}

// Clear drops every block of rank dp and announces AllBlocksCleared.
func (e *Engine) Clear(dp int) error {
	return e.do(dp, func(r *rank) error {
		b := r.startBatch()
		r.cache.clear(b)
		return r.publish(b)
	})
}

// SendFullState publishes the whole state of rank dp as one live batch,
// AllBlocksCleared followed by every block parent first, which by itself
// resynchronises a subscriber (R-WIRE-4).
func (e *Engine) SendFullState(dp int) error {
	return e.do(dp, func(r *rank) error {
		b := r.startBatch()
		b.AddCleared()
		r.appendState(b, r.cache.ordered())
		return r.publish(b)
	})
}

// State returns the blocks resident on rank dp, parent first. It is nil
// when the engine is not running or dp is out of range.
func (e *Engine) State(dp int) []BlockState {
	var out []BlockState
	_ = e.do(dp, func(r *rank) error {
		for _, b := range r.cache.ordered() {
			out = append(out, BlockState{
				Hash:      b.hash,
				Parent:    b.parent,
				HasParent: b.hasParent,
				Tokens:    append([]uint32(nil), b.tokens...),
				Device:    b.dev != nil,
				Host:      b.host != nil,
			})
		}
		return nil
	})
	return out
}

// Oracle reports what rank dp would reuse for tokens right now, without
// changing anything: Device tokens, and tokens found only on Host, of the
// contiguous prefix of full blocks (R-IDX-3).
func (e *Engine) Oracle(dp int, tokens []uint32) (deviceHitTokens, hostOnlyHitTokens int) {
	_ = e.do(dp, func(r *rank) error {
		deviceHitTokens, hostOnlyHitTokens = r.cache.oracle(tokens)
		return nil
	})
	return deviceHitTokens, hostOnlyHitTokens
}

// Seq returns the sequence number the next live message of rank dp gets.
func (e *Engine) Seq(dp int) uint64 {
	var s uint64
	_ = e.do(dp, func(r *rank) error {
		s = r.next
		return nil
	})
	return s
}

// Subscriptions returns how many subscribe requests rank dp's XPUB has
// seen since it was last bound.
func (e *Engine) Subscriptions(dp int) uint64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if !e.running || dp < 0 || dp >= len(e.ranks) {
		return 0
	}
	return e.ranks[dp].subs.Load()
}

// WaitSubscribed waits until rank dp's XPUB has seen at least n subscribe
// requests, so that a caller publishes only once its subscriber listens.
// After a Restart a SUB sends its subscription again only once its owner
// polls or reads it, so the subscriber must keep doing so meanwhile.
func (e *Engine) WaitSubscribed(ctx context.Context, dp int, n uint64) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		if e.Subscriptions(dp) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("enginesim: %s dp %d: waiting for %d subscriptions (have %d): %w",
				e.Name(), dp, n, e.Subscriptions(dp), ctx.Err())
		case <-t.C:
		}
	}
}

// Restart emulates a process restart: every rank closes its sockets,
// forgets its cache, starts its sequence again at 0 and binds the same
// ports again; the waiting queue empties. A registered engine registers
// the new process with a new incarnation_id and register_ts_ms under a
// new lease, overwriting its key without deleting it. The HTTP server
// keeps serving on the same address throughout; the inference requests
// in flight are cut off, their connections dropped, and the new process
// answers new ones. Fault settings are harness configuration and are
// kept.
func (e *Engine) Restart() error {
	e.life.Lock()
	defer e.life.Unlock()
	if !e.isRunning() {
		return fmt.Errorf("enginesim: restart %s: %w", e.Name(), ErrNotRunning)
	}
	e.serve.stop()
	var errs []error
	for dp := range e.DPSize() {
		if err := e.do(dp, (*rank).restart); err != nil {
			errs = append(errs, err)
		}
	}
	e.startServing()
	if len(errs) > 0 {
		return fmt.Errorf("enginesim: restart %s: %w", e.Name(), errors.Join(errs...))
	}
	e.waiting.Store(0)
	return e.registerNewProcess()
}

// RestartWithDPSize is Restart into a process with n DP ranks: all ranks
// are replaced by n new ones and a registered engine announces the new
// dp_size with its new identity. With DiscoveryOffsets the endpoints
// follow the discovery rule for n ranks; otherwise ranks that remain keep
// their ports and new ones bind any free port. When the new ranks cannot
// bind, the engine is closed.
func (e *Engine) RestartWithDPSize(n int) error {
	if n <= 0 {
		return fmt.Errorf("enginesim: dp size %d is not positive", n)
	}
	e.life.Lock()
	defer e.life.Unlock()
	if !e.isRunning() {
		return ErrNotRunning
	}
	e.serve.stop()
	if ranksGone, err := e.replaceRanks(n); err != nil {
		if ranksGone {
			return errors.Join(err, e.closeLocked())
		}
		e.startServing()
		return err
	}
	e.startServing()
	e.waiting.Store(0)
	return e.registerNewProcess()
}

// replaceRanks swaps the ranks for n new ones; ranksGone reports a failure
// after the old ones were stopped.
func (e *Engine) replaceRanks(n int) (ranksGone bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.running {
		return false, ErrNotRunning
	}
	var events, replays []string
	if off := e.cfg.DiscoveryOffsets; off != nil {
		if events, replays, err = DiscoveryEndpoints(e.cfg.HTTPAddr, n, off.Event, off.Replay); err != nil {
			return false, err
		}
	} else {
		events, replays = make([]string, n), make([]string, n)
		for dp := range n {
			events[dp], replays[dp] = AnyPort, AnyPort
			if dp < len(e.events) {
				events[dp], replays[dp] = e.events[dp], e.replays[dp]
			}
		}
	}
	stopRanks(e.ranks)
	e.ranks = nil
	e.cfg.DPSize = n
	ranks, err := e.startRanks(e.tctx, events, replays, rebindTimeout)
	if err != nil {
		e.events, e.replays = events, replays
		return true, err
	}
	e.ranks = ranks
	return false, nil
}

func (e *Engine) isRunning() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.running
}

// registerNewProcess gives a registered engine a new identity and
// registers it. The caller holds life.
func (e *Engine) registerNewProcess() error {
	e.regMu.Lock()
	defer e.regMu.Unlock()
	r := e.reg.Load()
	if r == nil {
		return nil
	}
	id, err := e.nextIdentity()
	if err != nil {
		return err
	}
	e.ident.Store(&id)
	return e.register(r, id)
}
