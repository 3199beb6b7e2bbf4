// Command kvcar-soak runs the KV directory for a bounded time against
// emulated engines that change their caches continuously while faults
// are injected (sequence gaps, corrupt and oversize messages, restarts,
// silently dropped events, snapshots that hang or lose a batch), with
// concurrent queries. It regularly quiesces one engine, waits until its
// stream has caught up, and checks that no query reports a prefix the
// engine does not hold (a stale hit). It reports events applied, recoveries, checks performed and
// failed, and the heap high-water mark; it exits non-zero on any failed
// check.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
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
	if r.checksFailed > 0 {
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

type report struct {
	eventsApplied, snapshotsOK, gaps, decodeErrors uint64
	faults, queries, checks, checksFailed          int64
	checksSkipped                                  int64
	heapHighWater                                  uint64
	failures                                       []string
}

func (r *report) print(w *os.File, o options) {
	fmt.Fprintf(w, "kvcar-soak: %d streams for %v, %.0f ops/s each, %.1f faults/s\n", o.streams, o.duration, o.rate, o.faultRate)
	fmt.Fprintf(w, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(w, "| events applied | %d |\n| snapshots succeeded (recoveries and calibrations) | %d |\n", r.eventsApplied, r.snapshotsOK)
	fmt.Fprintf(w, "| gaps detected | %d |\n| decode errors | %d |\n| faults injected | %d |\n", r.gaps, r.decodeErrors, r.faults)
	fmt.Fprintf(w, "| queries | %d |\n| stale-hit checks performed | %d |\n| checks failed | %d |\n", r.queries, r.checks, r.checksFailed)
	fmt.Fprintf(w, "| checks skipped (stream not caught up in time) | %d |\n", r.checksSkipped)
	fmt.Fprintf(w, "| Go heap high-water | %.1f MiB |\n", float64(r.heapHighWater)/(1<<20))
	for _, f := range r.failures {
		fmt.Fprintln(w, "FAILED:", f)
	}
}

// engine is one emulated engine with the prompts it was given, and a
// lock that the checker holds to quiesce it.
type engine struct {
	e       *enginesim.Engine
	mu      sync.Mutex
	prompts [][]uint32
	// taintedAt is the stream's successful-snapshot count when a fault
	// made the engine change its cache without telling (dropped tail) or
	// start over (restart): until a later snapshot has been taken, a
	// stale view is what R-REC-4 allows, so the check waits for one.
	taintedAt uint64
	tainted   bool
}

func soak(ctx context.Context, o options) (*report, error) {
	quiet := slog.New(slog.DiscardHandler)
	lim := kvdir.Limits{MaxBlocksPerStream: 8192, MaxMessageBytes: 1 << 20, MaxBufferedBytes: 4 << 20,
		ReplayTimeout: 500 * time.Millisecond, ResyncInterval: 2 * time.Second}
	dir, err := kvdir.New(lim, kvdir.Options{Logger: quiet})
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	var engines []*engine
	defer func() {
		for _, en := range engines {
			en.e.Close()
		}
	}()
	var specs []kvdir.StreamSpec
	for i := range o.streams {
		e, err := enginesim.New(enginesim.Config{Name: fmt.Sprintf("127.0.0.1:%d", 9000+i), BlockSize: o.blockSize,
			DeviceBlocks: 128, HostBlocks: 128, Topic: "xllm-kv", SnapshotBatchBlocks: 64, Logger: quiet,
			ReplaySlowDelay: 20 * time.Millisecond})
		if err == nil {
			err = e.Start()
		}
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		engines = append(engines, &engine{e: e})
		specs = append(specs, kvdir.StreamSpec{InstanceName: e.Name(), Endpoint: e.EventEndpoint(0),
			ReplayEndpoint: e.ReplayEndpoint(0), Topic: "xllm-kv", BlockSize: o.blockSize, HashSeed: 1024})
	}
	if err := dir.SetStreams(specs); err != nil {
		return nil, err
	}

	r := &report{}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	var failMu sync.Mutex
	fail := func(msg string) {
		failMu.Lock()
		if len(r.failures) < 20 {
			r.failures = append(r.failures, msg)
		}
		failMu.Unlock()
		atomic.AddInt64(&r.checksFailed, 1)
	}
	for i, en := range engines {
		wg.Add(1)
		go func() { defer wg.Done(); work(runCtx, en, o, uint64(i)) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); injectFaults(runCtx, dir, engines, o, &r.faults) }()
	for q := range o.queries {
		wg.Add(1)
		go func() { defer wg.Done(); queryLoop(runCtx, dir, engines, uint64(q), &r.queries) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); check(runCtx, dir, engines, o, r, fail) }()
	wg.Add(1)
	go func() { defer wg.Done(); sampleHeap(runCtx, &r.heapHighWater) }()
	wg.Wait()

	for _, st := range dir.Streams() {
		r.eventsApplied += st.EventsApplied
		r.snapshotsOK += st.SnapshotsOK
		r.gaps += st.Gaps
		r.decodeErrors += st.DecodeErrors
	}
	return r, ctx.Err()
}

// work drives one engine's cache: prefills of session-like prompts that
// extend earlier ones, and occasional removals.
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
		var p []uint32
		if len(en.prompts) > 0 && rng.IntN(3) > 0 {
			p = append(append([]uint32(nil), en.prompts[rng.IntN(len(en.prompts))]...), tokens(rng, (1+rng.IntN(4))*o.blockSize)...)
		} else {
			p = tokens(rng, (2+rng.IntN(8))*o.blockSize)
		}
		if len(p) > 64*o.blockSize {
			p = p[:64*o.blockSize]
		}
		_, _, _ = en.e.Prefill(0, p)
		if len(en.prompts) < 64 {
			en.prompts = append(en.prompts, p)
		} else {
			en.prompts[rng.IntN(len(en.prompts))] = p
		}
		if rng.IntN(200) == 0 {
			_ = en.e.Clear(0)
		}
		en.mu.Unlock()
	}
}

func tokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150_000))
	}
	return t
}

// injectFaults picks an engine and a fault at random, at o.faultRate.
func injectFaults(ctx context.Context, dir *kvdir.Directory, engines []*engine, o options, count *int64) {
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
		en := engines[rng.IntN(len(engines))]
		en.mu.Lock()
		var err error
		switch rng.IntN(8) {
		case 0:
			err = en.e.SkipSeq(0, uint64(1+rng.IntN(5)))
		case 1:
			err = en.e.SendRaw(0, []byte{0x93, 0xcb, 0xff})
		case 2:
			err = en.e.SendOversize(0, 2<<20)
		case 3:
			en.taint(dir)
			err = en.e.Restart()
			en.prompts = nil
		case 4:
			// Lose the tail for a moment; calibration has to find it.
			en.taint(dir)
			if err = en.e.SetDropTail(0, true); err == nil {
				_, _, _ = en.e.Prefill(0, tokens(rng, 4*o.blockSize))
				err = en.e.SetDropTail(0, false)
			}
		case 5:
			err = en.e.SetReplayMode(0, enginesim.ReplayGapInMiddle)
		case 6:
			err = en.e.SetReplayMode(0, enginesim.ReplaySlow)
		default:
			err = en.e.SetReplayMode(0, enginesim.ReplayNormal)
		}
		en.mu.Unlock()
		if err == nil {
			atomic.AddInt64(count, 1)
		}
	}
}

// taint records the stream's snapshot count before a silent change.
func (en *engine) taint(dir *kvdir.Directory) {
	if st, ok := streamOf(dir, en.e.Name()); ok {
		en.taintedAt, en.tainted = st.SnapshotsOK, true
	}
}

func streamOf(dir *kvdir.Directory, name string) (kvdir.StreamStatus, bool) {
	for _, st := range dir.Streams() {
		if st.InstanceName == name {
			return st, true
		}
	}
	return kvdir.StreamStatus{}, false
}

func queryLoop(ctx context.Context, dir *kvdir.Directory, engines []*engine, id uint64, count *int64) {
	rng := rand.New(rand.NewPCG(id, 7))
	dst := make([]kvdir.Match, 0, len(engines))
	for ctx.Err() == nil {
		en := engines[rng.IntN(len(engines))]
		en.mu.Lock()
		var p []uint32
		if len(en.prompts) > 0 {
			p = en.prompts[rng.IntN(len(en.prompts))]
		}
		en.mu.Unlock()
		dst = dir.Query(p, dst[:0])
		atomic.AddInt64(count, 1)
	}
}

// check quiesces one engine at a time, waits until its stream reflects
// everything the engine published, and compares every recent prompt's
// hit with what the engine would reuse. Snapshots of a restored normal
// replay mode and calibration repair what faults lost, so a stream that
// does not catch up within the wait is skipped, not failed: staleness,
// not slowness, is what the check is about.
func check(ctx context.Context, dir *kvdir.Directory, engines []*engine, o options, r *report, fail func(string)) {
	rng := rand.New(rand.NewPCG(o.seed, 99))
	for ctx.Err() == nil {
		en := engines[rng.IntN(len(engines))]
		en.mu.Lock()
		_ = en.e.SetReplayMode(0, enginesim.ReplayNormal)
		caught := waitCaughtUp(ctx, dir, en, 3*time.Second)
		if caught {
			for _, p := range en.prompts {
				dev, host := en.e.Oracle(0, p)
				var m kvdir.Match
				for _, mm := range dir.Query(p, nil) {
					if mm.InstanceName == en.e.Name() {
						m = mm
					}
				}
				if m.DeviceHitTokens > dev || m.DeviceHitTokens+m.HostOnlyHitTokens > dev+host {
					fail(fmt.Sprintf("%s: stale hit, directory device=%d host_only=%d, engine device=%d host_only=%d",
						en.e.Name(), m.DeviceHitTokens, m.HostOnlyHitTokens, dev, host))
				}
			}
			atomic.AddInt64(&r.checks, 1)
		} else if ctx.Err() == nil {
			atomic.AddInt64(&r.checksSkipped, 1)
		}
		en.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitCaughtUp waits until the engine's stream is synchronised at the
// engine's last sequence.
func waitCaughtUp(ctx context.Context, dir *kvdir.Directory, en *engine, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		next := en.e.Seq(0)
		if st, ok := streamOf(dir, en.e.Name()); ok && st.Synchronized && next > 0 && st.Sequence == next-1 &&
			(!en.tainted || st.SnapshotsOK > en.taintedAt) {
			en.tainted = false
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func sampleHeap(ctx context.Context, hwm *uint64) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var ms runtime.MemStats
	for {
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > *hwm {
			*hwm = ms.HeapInuse
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
