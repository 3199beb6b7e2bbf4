package enginesim

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/kvtransport"
)

// idleWait bounds how long a rank waits for a replay request, a
// subscription or a command before it looks at its quit channel again;
// commands and quit wake it at once.
const idleWait = time.Second

// queuedCommands is how many commands may wait for a busy rank before
// their callers block.
const queuedCommands = 64

var errUnbound = errors.New("sockets are not bound")

// rank is one DP rank: the goroutine started by run owns every field below
// the channels, including both sockets.
type rank struct {
	dp   int
	cfg  *Config
	tctx *kvtransport.Context
	log  *slog.Logger

	cmds chan func()
	quit chan struct{}
	done chan struct{}
	subs atomic.Uint64
	// waker ends the rank's wait when a command is queued or quit is
	// closed; set by run before it reports its start.
	waker *kvtransport.Waker

	// Written before run reports its first bind, then fixed.
	eventEP, replayEP string

	pub   *kvtransport.Publisher
	rs    *kvtransport.ReplayServer
	cache *cache
	next  uint64 // seq of the next live message
	sent  bool   // a live message went out since the last (re)start
	last  uint64 // seq of the last live message sent
	batch kvevent.Batch
	buf   []byte
	jobs  []*replayJob
	// appendState's storage for runs of blocks, kept between calls.
	stateRun      run
	stateReplicas []kvevent.EngineHash
	// bound is true while the rank has its sockets; rs is nil with
	// ReplayNone.
	bound bool
	// history holds the live messages a ReplayHistory rank can replay,
	// oldest first.
	history []histEntry

	dropTail    bool
	dropLive    bool
	wrongDP     bool
	replayMode  ReplayMode
	replayDelay time.Duration
}

func newRank(dp int, cfg *Config, tctx *kvtransport.Context, eventEP, replayEP string) *rank {
	return &rank{
		dp:          dp,
		cfg:         cfg,
		tctx:        tctx,
		log:         cfg.Logger.With("engine", cfg.Name, "dp", dp),
		cmds:        make(chan func(), queuedCommands),
		quit:        make(chan struct{}),
		done:        make(chan struct{}),
		eventEP:     eventEP,
		replayEP:    replayEP,
		cache:       newCache(cfg.BlockSize, cfg.DeviceBlocks, cfg.HostBlocks, cfg.HashSeed),
		replayDelay: cfg.ReplaySlowDelay,
	}
}

// run binds the sockets, retrying for up to bindWait, reports the outcome
// on started and then serves commands and replay requests until quit is
// closed. A failed first bind ends the goroutine.
func (r *rank) run(bindWait time.Duration, started chan<- error) {
	defer close(r.done)
	w, err := r.tctx.NewWaker()
	if err != nil {
		started <- fmt.Errorf("enginesim: %s dp %d: %w", r.cfg.Name, r.dp, err)
		return
	}
	r.waker = w
	defer func() {
		if err := w.Close(); err != nil {
			r.log.Warn("closing waker failed", "err", err)
		}
	}()
	defer r.closeSockets()
	var deadline time.Time
	if bindWait > 0 {
		deadline = time.Now().Add(bindWait)
	}
	if err := r.bind(deadline); err != nil {
		started <- err
		return
	}
	started <- nil
	for {
		select {
		case <-r.quit:
			return
		default:
		}
		if !r.bound {
			// A failed rebind leaves the rank without sockets; it still
			// answers commands, which report the failure.
			select {
			case <-r.quit:
				return
			case fn := <-r.cmds:
				fn()
			}
			continue
		}
		r.runCommands()
		r.serve()
	}
}

func (r *rank) runCommands() {
	for {
		select {
		case fn := <-r.cmds:
			fn()
		default:
			return
		}
	}
}

// serve waits for a replay request, a subscription, a command or the
// next reply that is due, keeps the XPUB's subscription queue drained and
// sends the replies that are due.
func (r *rank) serve() {
	wait := idleWait
	now := time.Now()
	for _, j := range r.jobs {
		if d := j.due.Sub(now); d < wait {
			wait = max(d, 0)
		}
	}
	if r.rs == nil {
		if err := r.pub.Wait(r.waker, wait); err != nil {
			r.log.Warn("wait failed", "err", err)
		}
		if n, err := r.pub.DrainSubscriptions(); err != nil {
			r.log.Warn("reading subscriptions failed", "err", err)
		} else {
			r.subs.Store(n)
		}
		return
	}
	request, err := r.rs.Wait(r.pub, r.waker, wait)
	if err != nil {
		r.log.Warn("replay wait failed", "err", err)
	}
	if request {
		id, frames, err := r.rs.Recv(0)
		switch {
		case err == nil:
			r.request(id, frames)
		case !errors.Is(err, kvtransport.ErrTimeout):
			r.log.Warn("replay receive failed", "err", err)
		}
	}
	if n, err := r.pub.DrainSubscriptions(); err != nil {
		r.log.Warn("reading subscriptions failed", "err", err)
	} else {
		r.subs.Store(n)
	}
	r.sendDueReplies(time.Now())
}

// bind opens both sockets. With a non-zero deadline it retries until then,
// because a port released by closed sockets is freed asynchronously.
func (r *rank) bind(deadline time.Time) error {
	for {
		err := r.bindOnce()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("enginesim: %s dp %d: %w", r.cfg.Name, r.dp, err)
		}
		select {
		case <-r.quit:
			return fmt.Errorf("enginesim: %s dp %d: stopped while binding: %w", r.cfg.Name, r.dp, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *rank) bindOnce() error {
	var pub *kvtransport.Publisher
	var err error
	if r.cfg.DialEvents != "" {
		pub, err = r.tctx.DialPublisher(r.eventEP, kvtransport.PublisherOptions{SendHWM: r.cfg.SendHWM})
	} else {
		pub, err = r.tctx.BindPublisher(r.eventEP, kvtransport.PublisherOptions{SendHWM: r.cfg.SendHWM})
	}
	if err != nil {
		return err
	}
	if r.cfg.Replay == ReplayNone {
		r.pub, r.rs, r.bound = pub, nil, true
		r.eventEP, r.replayEP = pub.Endpoint(), ""
		return nil
	}
	rs, err := r.tctx.BindReplayServer(r.replayEP, kvtransport.ReplayServerOptions{SendHWM: r.cfg.ReplaySendHWM})
	if err != nil {
		pub.Close()
		return err
	}
	r.pub, r.rs, r.bound = pub, rs, true
	r.eventEP, r.replayEP = pub.Endpoint(), rs.Endpoint()
	return nil
}

func (r *rank) closeSockets() {
	r.bound = false
	if r.pub != nil {
		if err := r.pub.Close(); err != nil {
			r.log.Warn("closing publisher failed", "err", err)
		}
		r.pub = nil
	}
	if r.rs != nil {
		if err := r.rs.Close(); err != nil {
			r.log.Warn("closing replay server failed", "err", err)
		}
		r.rs = nil
	}
}

// restart is a process restart of this rank: new sockets on the same
// ports, an empty cache, sequence 0 and no pending replies.
func (r *rank) restart() error {
	r.closeSockets()
	wrong := r.cache.wrongBlock
	r.cache = newCache(r.cfg.BlockSize, r.cfg.DeviceBlocks, r.cfg.HostBlocks, r.cfg.HashSeed)
	r.cache.wrongBlock = wrong
	r.next, r.sent, r.last = 0, false, 0
	r.jobs = nil
	r.history = nil
	r.subs.Store(0)
	return r.bind(time.Now().Add(rebindTimeout))
}

// startBatch resets the rank's live batch for one message.
func (r *rank) startBatch() *kvevent.Batch {
	r.batch.Reset()
	r.stampBatch(&r.batch)
	return &r.batch
}

func (r *rank) stampBatch(b *kvevent.Batch) {
	b.Timestamp = float64(r.cfg.Clock().UnixNano()) / 1e9
	b.HasDPRank = true
	b.DPRank = r.cfg.DPRankBase + r.dp
	if r.wrongDP {
		b.DPRank++
	}
}

// publish sends b as the next live message unless it is empty. With the
// drop-tail fault the state has changed but nothing is sent and the
// sequence stays where it was.
func (r *rank) publish(b *kvevent.Batch) error {
	if len(b.Events) == 0 || r.dropTail {
		return nil
	}
	r.buf = kvevent.AppendBatch(r.buf[:0], b, r.cfg.Shape)
	return r.sendLive(r.buf)
}

// sendLive sends payload under the next sequence number. The number is
// used even when the send fails, as the engine's counter would be.
func (r *rank) sendLive(payload []byte) error {
	if r.pub == nil {
		return fmt.Errorf("enginesim: %s dp %d: publish: %w", r.cfg.Name, r.dp, errUnbound)
	}
	seq := r.next
	r.next++
	r.sent, r.last = true, seq
	r.remember(seq, payload)
	if r.dropLive {
		return nil
	}
	if err := r.pub.Send(kvevent.LiveFrames(r.cfg.Topic, seq, payload)); err != nil {
		return fmt.Errorf("enginesim: %s dp %d: publish seq %d: %w", r.cfg.Name, r.dp, seq, err)
	}
	return nil
}

// appendState appends blocks, parent first, as BlockStored events: chains
// of Device blocks as one gpu store with tokens followed by a tokenless
// cpu store for those that also have a Host copy, chains of Host-only
// blocks as one cpu store with tokens. An orphan keeps its parent hash.
func (r *rank) appendState(b *kvevent.Batch, blocks []*blockRec) {
	// One run's storage, which flush keeps, serves every run of every
	// call: a snapshot's hundreds of batches would otherwise each grow
	// their own.
	cur, replicas := &r.stateRun, r.stateReplicas
	curDevice := false
	var prev *blockRec
	flush := func() {
		m := kvevent.Host
		if curDevice {
			m = kvevent.Device
		}
		r.cache.flush(b, cur, m)
		if len(replicas) > 0 {
			b.AddStored(replicas, kvevent.EngineHash{}, false, nil, 0, kvevent.Host)
		}
		replicas = replicas[:0]
	}
	for _, blk := range blocks {
		onDevice := blk.dev != nil
		chained := prev != nil && len(cur.hashes) > 0 && blk.hasParent && blk.parent == prev.hash && onDevice == curDevice
		if !chained {
			flush()
			cur.parent, cur.hasParent, curDevice = blk.parent, blk.hasParent, onDevice
		}
		cur.hashes = append(cur.hashes, blk.hash)
		cur.tokens = append(cur.tokens, blk.tokens...)
		if onDevice && blk.host != nil {
			replicas = append(replicas, blk.hash)
		}
		prev = blk
	}
	flush()
	r.stateReplicas = replicas
}
