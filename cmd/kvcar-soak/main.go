// Command kvcar-soak runs the KV directory for a bounded time against
// emulated engines that change their caches continuously while faults
// are injected (sequence gaps, corrupt and oversize messages, restarts,
// silently dropped tails, snapshots that hang or lose a batch, messages
// lost at the publisher, and link stalls that make the publisher drop
// past its send HWM), with concurrent queries.
//
// It checks three things. Every answer of an unsynchronised stream
// reports no hit (R-REC-1). Regularly it quiesces one engine, waits until
// its stream has caught up, and requires the stream's answer for every
// recent prompt to equal what the engine would reuse, tier by tier, and
// its resident block counts to equal the engine's (orphans included: the
// directory keeps them by engine hash, R-IDX-5): a hit the engine does
// not hold (a stale hit) fails, and so does one it holds but the
// directory does not report. Then it loses a message at the publisher:
// the stream must notice the gap, report nothing while it recovers, and
// be exact again afterwards (R-REC-3).
//
// It reports events applied, recoveries, faults, checks performed and
// failed by kind, and the heap high-water mark; it exits non-zero on any
// failed check.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvdir"
)

type options struct {
	streams   int
	duration  time.Duration
	rate      float64
	faultRate float64
	queries   int
	blockSize int
	seed      uint64
	// minProbes, set by tests, extends the run past duration, up to
	// four times it, until the checker has made that many loss probes:
	// on a busy machine a short run may otherwise end before one.
	minProbes int64
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvcar-soak:", err)
		os.Exit(2)
	}
	r, err := soak(ctx, o)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "kvcar-soak:", err)
		os.Exit(1)
	}
	r.print(os.Stdout, o)
	if r.failed() > 0 {
		os.Exit(1)
	}
}

func parse(args []string) (options, error) {
	fs := flag.NewFlagSet("kvcar-soak", flag.ContinueOnError)
	o := options{}
	fs.IntVar(&o.streams, "streams", 32, "emulated engines, one stream each (1-128)")
	fs.DurationVar(&o.duration, "duration", time.Minute, "how long to run")
	fs.Float64Var(&o.rate, "rate", 20, "cache operations per second per engine")
	fs.Float64Var(&o.faultRate, "fault_rate", 2, "faults injected per second, over all engines")
	fs.IntVar(&o.queries, "query_clients", 2, "goroutines querying the directory continuously")
	fs.IntVar(&o.blockSize, "block_size", 16, "tokens per block")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of operations and faults")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.streams < 1 || o.streams > 128 {
		return o, fmt.Errorf("--streams = %d: must be in [1, 128]", o.streams)
	}
	if o.rate <= 0 || o.faultRate < 0 || o.queries < 0 || o.blockSize < 1 || o.duration <= 0 {
		return o, errors.New("--rate, --duration and --block_size must be positive; --fault_rate and --query_clients not negative")
	}
	return o, nil
}

// Soak-wide constants of the emulated engines and the directory.
const (
	deviceBlocks = 128
	hostBlocks   = 128
	// liveSendHWM is the engines' live send HWM, small so that a link
	// stall of a few hundred kilobytes makes them drop.
	liveSendHWM = 8
	// stallBurst prefills of stallBlocks new blocks each go out during a
	// link stall: about 2 MB, more than the stalled sockets buffer.
	stallBurst  = 200
	stallBlocks = 120
	// replayTimeout is the directory's replay_timeout_ms. A snapshot
	// requested before a silent change completes within it or fails, so
	// one that completes later than settle after the change reflects it.
	replayTimeout = 500 * time.Millisecond
	settle        = replayTimeout + 250*time.Millisecond
	// caughtUpWait bounds how long the checker waits for a stream to
	// reflect everything its quiesced engine published.
	caughtUpWait = 3 * time.Second
	// gapWait bounds how long a stream may take to notice a gap once the
	// message after it has been published.
	gapWait = 2 * time.Second
)

// failure kinds, in report order.
type failKind int

const (
	failStale     failKind = iota // a hit the engine does not hold
	failUnder                     // a hit the engine holds, not reported by a caught-up stream
	failCounts                    // resident block counts outside the engine's
	failUnsyncHit                 // an unsynchronised stream reported a hit
	failGapMissed                 // a message lost at the publisher went unnoticed
	failKinds
)

func (k failKind) String() string {
	switch k {
	case failStale:
		return "stale hit (over-report)"
	case failUnder:
		return "missed hit (under-report)"
	case failCounts:
		return "resident counts wrong"
	case failUnsyncHit:
		return "hit while unsynchronised"
	case failGapMissed:
		return "lost message not noticed"
	}
	return fmt.Sprintf("failKind(%d)", int(k))
}

type report struct {
	eventsApplied, snapshotsOK, gaps, decodeErrors, disconnects uint64

	faults, lostMessages, stalls, lossyStalls int64
	queries, unsyncAnswers                    int64
	checks, probes, probesUndecided           int64
	checksSkipped                             int64
	failures                                  [failKinds]int64
	heapHighWater                             atomic.Uint64

	mu       sync.Mutex
	examples []string // the first failures, for the log
}

func (r *report) failed() int64 {
	var n int64
	for k := range r.failures {
		n += atomic.LoadInt64(&r.failures[k])
	}
	return n
}

func (r *report) fail(k failKind, format string, args ...any) {
	atomic.AddInt64(&r.failures[k], 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.examples) < 20 {
		r.examples = append(r.examples, k.String()+": "+fmt.Sprintf(format, args...))
	}
}

func (r *report) print(w io.Writer, o options) {
	fmt.Fprintf(w, "kvcar-soak: %d streams for %v, %.0f ops/s each, %.1f faults/s\n", o.streams, o.duration, o.rate, o.faultRate)
	fmt.Fprintf(w, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(w, "| events applied | %d |\n| snapshots succeeded (recoveries and calibrations) | %d |\n", r.eventsApplied, r.snapshotsOK)
	fmt.Fprintf(w, "| gaps / decode errors / disconnects the directory detected | %d / %d / %d |\n", r.gaps, r.decodeErrors, r.disconnects)
	fmt.Fprintf(w, "| faults injected | %d |\n", r.faults)
	fmt.Fprintf(w, "| messages lost at the publisher (faults and probes) | %d |\n", r.lostMessages)
	fmt.Fprintf(w, "| link stalls / followed by a gap or resynchronisation (publisher HWM drops) | %d / %d |\n", r.stalls, r.lossyStalls)
	fmt.Fprintf(w, "| queries | %d |\n", r.queries)
	fmt.Fprintf(w, "| answers of unsynchronised streams checked for zero hits | %d |\n", r.unsyncAnswers)
	fmt.Fprintf(w, "| caught-up streams compared with their quiesced engine | %d |\n", r.checks)
	fmt.Fprintf(w, "| loss probes (gap noticed, no hit meanwhile, exact after) / undecided (next message not received in %v) | %d / %d |\n", gapWait, r.probes, r.probesUndecided)
	fmt.Fprintf(w, "| checks skipped (stream not caught up in %v, or left the synchronised state) | %d |\n", caughtUpWait, r.checksSkipped)
	for k := range failKinds {
		fmt.Fprintf(w, "| failed: %v | %d |\n", k, r.failures[k])
	}
	fmt.Fprintf(w, "| Go heap high-water (directory and emulated engines) | %.1f MiB |\n", float64(r.heapHighWater.Load())/(1<<20))
	for _, f := range r.examples {
		fmt.Fprintln(w, "FAILED:", f)
	}
}

// view is what the checker and the query clients read: the directory
// itself, or, in the checker's own tests, a deliberately broken one.
type view interface {
	Query(tokenIDs []uint32, dst []kvdir.Match) []kvdir.Match
	Streams() []kvdir.StreamStatus
}

// plant puts deliberately broken parts in the directory's way so that
// the checker's tests can show it catches them. Only tests set it; the
// program runs with the zero plant.
type plant struct {
	// view wraps what queries read.
	view func(view) view
	// relay, given the endpoint of an engine's live channel, returns the
	// endpoint the directory subscribes to instead.
	relay func(endpoint string) (string, io.Closer, error)
}

// engine is one emulated engine with the prompts it was given, the link
// its live channel goes through, and a lock that the checker holds to
// quiesce it.
type engine struct {
	e    *enginesim.Engine
	link *stallLink
	// mu is held by everything that changes the engine: its workload,
	// the faults and the checker.
	mu sync.Mutex
	// pmu guards prompts, which query clients read without quiescing.
	pmu     sync.Mutex
	prompts [][]uint32
	// taintedAt is when a fault made the engine change its cache without
	// telling (dropped tail, restart, a snapshot that lost a batch): a
	// stale view is what R-REC-4 allows until a snapshot taken after it.
	taintedAt time.Time
	// badReplay: snapshots may be losing a batch; set back to normal,
	// the engine is tainted from then.
	badReplay bool
}

func (en *engine) addPrompt(rng *rand.Rand, p []uint32) {
	en.pmu.Lock()
	defer en.pmu.Unlock()
	if len(en.prompts) < 64 {
		en.prompts = append(en.prompts, p)
	} else {
		en.prompts[rng.IntN(len(en.prompts))] = p
	}
}

func (en *engine) recentPrompts() [][]uint32 {
	en.pmu.Lock()
	defer en.pmu.Unlock()
	return slices.Clone(en.prompts)
}

func (en *engine) anyPrompt(rng *rand.Rand) []uint32 {
	en.pmu.Lock()
	defer en.pmu.Unlock()
	if len(en.prompts) == 0 {
		return nil
	}
	return en.prompts[rng.IntN(len(en.prompts))]
}

func (en *engine) taint() { en.taintedAt = time.Now() }

// setReplay sets the engine's replay mode; leaving a mode that loses
// batches taints the engine.
func (en *engine) setReplay(m enginesim.ReplayMode) error {
	if err := en.e.SetReplayMode(0, m); err != nil {
		return err
	}
	switch {
	case m == enginesim.ReplayGapInMiddle:
		en.badReplay = true
	case en.badReplay:
		en.badReplay = false
		en.taint()
	}
	return nil
}

func soak(ctx context.Context, o options) (*report, error) { return soakWith(ctx, o, plant{}) }

func soakWith(ctx context.Context, o options, pl plant) (*report, error) {
	quiet := slog.New(slog.DiscardHandler)
	lim := kvdir.Limits{MaxBlocksPerStream: 8192, MaxMessageBytes: 1 << 20, MaxBufferedBytes: 4 << 20,
		ReplayTimeout: replayTimeout, ResyncInterval: 2 * time.Second}
	dir, err := kvdir.New(lim, kvdir.Options{Logger: quiet})
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var engines []*engine
	var closers []io.Closer
	defer func() {
		// The directory's subscriptions go first, then the relays and
		// links they used, then the engines.
		dir.Close()
		for _, c := range slices.Backward(closers) {
			c.Close()
		}
		for _, en := range engines {
			en.e.Close()
		}
	}()
	var specs []kvdir.StreamSpec
	for i := range o.streams {
		e, err := enginesim.New(enginesim.Config{Name: fmt.Sprintf("127.0.0.1:%d", 9000+i), BlockSize: o.blockSize,
			DeviceBlocks: deviceBlocks, HostBlocks: hostBlocks, Topic: "xllm-kv", SnapshotBatchBlocks: 64, Logger: quiet,
			ReplaySlowDelay: 20 * time.Millisecond, SendHWM: liveSendHWM, ReplaySendHWM: enginesim.DefaultSendHWM})
		if err == nil {
			err = e.Start()
		}
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		en := &engine{e: e}
		engines = append(engines, en)
		if en.link, err = newStallLink(e.EventEndpoint(0)); err != nil {
			return nil, err
		}
		closers = append(closers, en.link)
		live := en.link.Endpoint()
		if pl.relay != nil {
			ep, c, err := pl.relay(live)
			if err != nil {
				return nil, err
			}
			live = ep
			closers = append(closers, c)
		}
		specs = append(specs, kvdir.StreamSpec{InstanceName: e.Name(), Endpoint: live,
			ReplayEndpoint: e.ReplayEndpoint(0), Topic: "xllm-kv", BlockSize: o.blockSize, HashSeed: 1024})
	}
	if err := dir.SetStreams(specs); err != nil {
		return nil, err
	}
	var v view = dir
	if pl.view != nil {
		v = pl.view(dir)
	}

	r := &report{}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		end := time.Now().Add(4 * o.duration)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for start := time.Now(); ; {
			select {
			case <-runCtx.Done():
				return
			case now := <-tick.C:
				if now.Sub(start) >= o.duration && (atomic.LoadInt64(&r.probes) >= o.minProbes || now.After(end)) {
					return
				}
			}
		}
	}()
	for i, en := range engines {
		wg.Add(1)
		go func() { defer wg.Done(); work(runCtx, en, o, uint64(i)) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); injectFaults(runCtx, v, engines, o, r) }()
	for q := range o.queries {
		wg.Add(1)
		go func() { defer wg.Done(); queryLoop(runCtx, v, engines, uint64(q), r) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := &checker{ctx: runCtx, v: v, o: o, r: r, rng: rand.New(rand.NewPCG(o.seed, 99))}
		c.run(engines)
	}()
	wg.Add(1)
	go func() { defer wg.Done(); sampleHeap(runCtx, &r.heapHighWater) }()
	wg.Wait()

	for _, st := range dir.Streams() {
		r.eventsApplied += st.EventsApplied
		r.snapshotsOK += st.SnapshotsOK
		r.gaps += st.Gaps
		r.decodeErrors += st.DecodeErrors
		r.disconnects += st.Disconnects
	}
	return r, ctx.Err()
}

// work drives one engine's cache: prefills of session-like prompts that
// extend earlier ones, and occasional clears.
func work(ctx context.Context, en *engine, o options, id uint64) {
	rng := rand.New(rand.NewPCG(o.seed, id))
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		en.mu.Lock()
		p := sessionPrompt(rng, en, o.blockSize)
		_, _, _ = en.e.Prefill(0, p)
		en.addPrompt(rng, p)
		if rng.IntN(200) == 0 {
			_ = en.e.Clear(0)
		}
		en.mu.Unlock()
	}
}

// sessionPrompt extends one of the engine's earlier prompts by 1-4
// blocks, or, one time in three, starts a new one of 2-9 blocks.
func sessionPrompt(rng *rand.Rand, en *engine, blockSize int) []uint32 {
	var p []uint32
	if prev := en.anyPrompt(rng); prev != nil && rng.IntN(3) > 0 {
		p = append(slices.Clip(prev), tokens(rng, (1+rng.IntN(4))*blockSize)...)
	} else {
		p = tokens(rng, (2+rng.IntN(8))*blockSize)
	}
	return p[:min(len(p), 64*blockSize)]
}

// tokens returns n token ids drawn from a 150k vocabulary.
func tokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150_000))
	}
	return t
}

// injectFaults picks an engine and a fault at random, at o.faultRate.
func injectFaults(ctx context.Context, v view, engines []*engine, o options, r *report) {
	if o.faultRate == 0 {
		return
	}
	rng := rand.New(rand.NewPCG(o.seed, 1<<32))
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.faultRate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Not the engine the checker holds: the fault would wait for it.
		var en *engine
		for range 4 {
			if e := engines[rng.IntN(len(engines))]; e.mu.TryLock() {
				en = e
				break
			}
		}
		if en == nil {
			continue
		}
		var err error
		switch rng.IntN(10) {
		case 0:
			err = en.e.SkipSeq(0, uint64(1+rng.IntN(5)))
		case 1:
			err = en.e.SendRaw(0, []byte{0x93, 0xcb, 0xff})
		case 2:
			err = en.e.SendOversize(0, 2<<20)
		case 3:
			en.taint()
			err = en.e.Restart()
			en.pmu.Lock()
			en.prompts = nil
			en.pmu.Unlock()
		case 4:
			// Lose the tail for a moment; calibration has to find it.
			en.taint()
			if err = en.e.SetDropTail(0, true); err == nil {
				_, _, _ = en.e.Prefill(0, tokens(rng, 4*o.blockSize))
				err = en.e.SetDropTail(0, false)
			}
		case 5:
			// Messages lost at the publisher: the next one shows the gap.
			for range 1 + rng.IntN(3) {
				p := sessionPrompt(rng, en, o.blockSize)
				if _, _, err = en.e.PrefillLost(0, p); err == nil {
					en.addPrompt(rng, p)
					atomic.AddInt64(&r.lostMessages, 1)
				}
			}
		case 6:
			err = stall(ctx, v, en, rng, o, r)
		case 7:
			err = en.setReplay(enginesim.ReplayGapInMiddle)
		case 8:
			err = en.setReplay(enginesim.ReplaySlow)
		default:
			err = en.setReplay(enginesim.ReplayNormal)
		}
		en.mu.Unlock()
		if err == nil {
			atomic.AddInt64(&r.faults, 1)
		}
	}
}

// stall stops the engine's link while it publishes a burst larger than
// the stalled sockets hold, so that its publisher drops past its send
// HWM, then lets the link flow and publishes until the stream has
// decided. It counts the stall as lossy when the stream then counts a gap
// or is seen unsynchronised (a snapshot in progress may find the hole
// instead) before it reaches the engine's sequence.
func stall(ctx context.Context, v view, en *engine, rng *rand.Rand, o options, r *report) error {
	before, _ := streamOf(v, en.e.Name())
	en.link.Stall()
	for range stallBurst {
		if _, _, err := en.e.Prefill(0, tokens(rng, stallBlocks*o.blockSize)); err != nil {
			en.link.Resume()
			return err
		}
	}
	en.link.Resume()
	atomic.AddInt64(&r.stalls, 1)
	// The publisher goes on dropping until it sees room in its queue
	// again, so a message sent right after the stall may be lost too:
	// publish again until the stream has decided.
	deadline := time.Now().Add(gapWait)
	var again time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if time.Now().After(again) {
			p := sessionPrompt(rng, en, o.blockSize)
			if _, _, err := en.e.Prefill(0, p); err != nil {
				return err
			}
			en.addPrompt(rng, p)
			again = time.Now().Add(200 * time.Millisecond)
		}
		st, _ := streamOf(v, en.e.Name())
		if st.Gaps > before.Gaps || !st.Synchronized {
			atomic.AddInt64(&r.lossyStalls, 1)
			return nil
		}
		if st.Sequence+1 == en.e.Seq(0) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

func streamOf(v view, name string) (kvdir.StreamStatus, bool) {
	for _, st := range v.Streams() {
		if st.InstanceName == name {
			return st, true
		}
	}
	return kvdir.StreamStatus{}, false
}

func hits(m kvdir.Match) bool { return m.DeviceHitTokens > 0 || m.HostOnlyHitTokens > 0 }

// queryLoop queries recent prompts of random engines and checks, at any
// time, that no unsynchronised stream reports a hit (R-REC-1).
func queryLoop(ctx context.Context, v view, engines []*engine, id uint64, r *report) {
	rng := rand.New(rand.NewPCG(id, 7))
	dst := make([]kvdir.Match, 0, len(engines))
	for ctx.Err() == nil {
		p := engines[rng.IntN(len(engines))].anyPrompt(rng)
		dst = v.Query(p, dst[:0])
		atomic.AddInt64(&r.queries, 1)
		for _, m := range dst {
			if m.Synchronized {
				continue
			}
			atomic.AddInt64(&r.unsyncAnswers, 1)
			if hits(m) {
				r.fail(failUnsyncHit, "%s (%s): device=%d host_only=%d", m.InstanceName, m.Error, m.DeviceHitTokens, m.HostOnlyHitTokens)
			}
		}
	}
}

// checker quiesces one engine at a time and compares its stream with it.
type checker struct {
	ctx context.Context
	v   view
	o   options
	r   *report
	rng *rand.Rand
}

func (c *checker) run(engines []*engine) {
	for c.ctx.Err() == nil {
		c.cycle(engines[c.rng.IntN(len(engines))])
		select {
		case <-c.ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cycle checks one quiesced engine: exact once caught up, then a loss
// probe.
func (c *checker) cycle(en *engine) {
	en.mu.Lock()
	defer en.mu.Unlock()
	if en.setReplay(enginesim.ReplayNormal) != nil {
		return
	}
	if !c.caughtUp(en) || !c.exact(en) {
		if c.ctx.Err() == nil {
			atomic.AddInt64(&c.r.checksSkipped, 1)
		}
		return
	}
	atomic.AddInt64(&c.r.checks, 1)
	c.probe(en)
}

// caughtUp waits until the engine's stream is synchronised at the
// engine's last sequence number. After a silent change it first waits
// until no snapshot older than the change can still complete, then makes
// the engine publish a gap so that the stream takes a snapshot, and
// waits for one to succeed.
func (c *checker) caughtUp(en *engine) bool {
	// Caught up is judged by the last sequence number, which must not
	// be 0: a stream that has applied nothing reports 0 as well.
	for en.e.Seq(0) < 2 {
		if c.prefill(en) != nil {
			return false
		}
	}
	deadline := time.Now().Add(caughtUpWait)
	forced := false
	var mark uint64
	for time.Now().Before(deadline) && c.ctx.Err() == nil {
		st, ok := streamOf(c.v, en.e.Name())
		next := en.e.Seq(0)
		at := ok && st.Synchronized && next > 1 && st.Sequence == next-1
		switch {
		case en.taintedAt.IsZero():
			if at {
				return true
			}
		case time.Since(en.taintedAt) < settle:
		case !forced:
			mark, forced = st.SnapshotsOK, true
			if en.e.SkipSeq(0, 1) != nil || c.prefill(en) != nil {
				return false
			}
			continue
		case at && st.SnapshotsOK > mark:
			en.taintedAt = time.Time{}
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// prefill serves a new session-like prompt and remembers it.
func (c *checker) prefill(en *engine) error {
	return c.serve(en, sessionPrompt(c.rng, en, c.o.blockSize))
}

// serve serves prompt p and remembers it.
func (c *checker) serve(en *engine, p []uint32) error {
	_, _, err := en.e.Prefill(0, p)
	if err == nil {
		en.addPrompt(c.rng, p)
	}
	return err
}

// exact compares the caught-up stream with its quiesced engine: every
// recent prompt's hit tier by tier, and the resident block counts. It
// returns false, failing nothing, when the stream left the synchronised
// state meanwhile.
func (c *checker) exact(en *engine) bool {
	name := en.e.Name()
	dev, host := residentCounts(en.e.State(0))
	st, ok := streamOf(c.v, name)
	if !ok || !st.Synchronized {
		return false
	}
	if st.DeviceBlocks != dev || st.HostBlocks != host {
		c.r.fail(failCounts, "%s: directory holds %d Device / %d Host blocks, engine %d / %d",
			name, st.DeviceBlocks, st.HostBlocks, dev, host)
	}
	for _, p := range en.recentPrompts() {
		wantDev, wantHost := en.e.Oracle(0, p)
		m := c.matchOf(name, p)
		switch {
		case !m.Synchronized:
			if hits(m) {
				c.r.fail(failUnsyncHit, "%s (%s): device=%d host_only=%d", name, m.Error, m.DeviceHitTokens, m.HostOnlyHitTokens)
			}
			return false
		case m.DeviceHitTokens > wantDev || m.DeviceHitTokens+m.HostOnlyHitTokens > wantDev+wantHost:
			c.r.fail(failStale, "%s: directory device=%d host_only=%d, engine device=%d host_only=%d",
				name, m.DeviceHitTokens, m.HostOnlyHitTokens, wantDev, wantHost)
		case m.DeviceHitTokens != wantDev || m.HostOnlyHitTokens != wantHost:
			c.r.fail(failUnder, "%s: directory device=%d host_only=%d, engine device=%d host_only=%d",
				name, m.DeviceHitTokens, m.HostOnlyHitTokens, wantDev, wantHost)
		}
	}
	return true
}

// residentCounts counts the engine's resident blocks per tier; a block on
// both tiers counts on each. Orphans (blocks whose parent left both
// tiers) count too: a snapshot keeps them by engine hash, never as hits,
// so that a Host copy announced while the block was an orphan is still
// known when its parent returns (R-IDX-5).
func residentCounts(blocks []enginesim.BlockState) (dev, host int) {
	for _, b := range blocks {
		if b.Device {
			dev++
		}
		if b.Host {
			host++
		}
	}
	return dev, host
}

func (c *checker) matchOf(name string, p []uint32) kvdir.Match {
	for _, m := range c.v.Query(p, nil) {
		if m.InstanceName == name {
			return m
		}
	}
	return kvdir.Match{}
}

// probe loses a message at the publisher of a caught-up stream and
// publishes the next one, with snapshots unanswered for the moment: the
// stream must leave the synchronised state, report no hit for any recent
// prompt meanwhile, and once snapshots are answered again be exact.
func (c *checker) probe(en *engine) {
	name := en.e.Name()
	before, _ := streamOf(c.v, name)
	if en.setReplay(enginesim.ReplayIgnore) != nil {
		return
	}
	lost := sessionPrompt(c.rng, en, c.o.blockSize)
	if _, _, err := en.e.PrefillLost(0, lost); err != nil {
		return
	}
	en.addPrompt(c.rng, lost)
	atomic.AddInt64(&c.r.lostMessages, 1)
	// A new prompt, not one that extends the lost one: its parent would
	// be unknown to the stream, which reveals the loss without the gap.
	if c.serve(en, tokens(c.rng, (2+c.rng.IntN(8))*c.o.blockSize)) != nil {
		return
	}
	atomic.AddInt64(&c.r.probes, 1)
	// The stream notices the gap, or applies the message after it as if
	// there were none. Until it has received that message it can do
	// neither (a subscription that has just been made may even have
	// missed it): such a probe decides nothing.
	revealed := en.e.Seq(0) - 1
	var st kvdir.StreamStatus
	noticed, missed := false, false
	deadline := time.Now().Add(gapWait)
	for !noticed && !missed && time.Now().Before(deadline) && c.ctx.Err() == nil {
		st, _ = streamOf(c.v, name)
		noticed = !st.Synchronized || st.Gaps > before.Gaps
		missed = !noticed && st.Sequence >= revealed
		if !noticed && !missed {
			time.Sleep(2 * time.Millisecond)
		}
	}
	switch {
	case noticed:
		for _, p := range en.recentPrompts() {
			m := c.matchOf(name, p)
			if m.Synchronized {
				break
			}
			atomic.AddInt64(&c.r.unsyncAnswers, 1)
			if hits(m) {
				c.r.fail(failUnsyncHit, "%s (%s): device=%d host_only=%d", name, m.Error, m.DeviceHitTokens, m.HostOnlyHitTokens)
			}
		}
	case missed:
		c.r.fail(failGapMissed, "%s: seq %d lost, the stream applied %d and stays synchronised", name, revealed-1, st.Sequence)
	default:
		atomic.AddInt64(&c.r.probesUndecided, 1)
	}
	if en.setReplay(enginesim.ReplayNormal) != nil {
		return
	}
	if (!c.caughtUp(en) || !c.exact(en)) && c.ctx.Err() == nil {
		atomic.AddInt64(&c.r.checksSkipped, 1)
	}
}

func sampleHeap(ctx context.Context, hwm *atomic.Uint64) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var ms runtime.MemStats
	for {
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > hwm.Load() {
			hwm.Store(ms.HeapInuse)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
