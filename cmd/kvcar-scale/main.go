// Command kvcar-scale measures how many streams one kvcar process
// sustains: it starts an embedded etcd and N emulated engines that
// register, heartbeat and publish KV events at a steady rate, runs the
// kvcar binary with discovery, and reports the time until every stream is
// synchronised, kvcar's CPU use and memory under the load, event
// throughput, the latency of HTTP queries sent during the load with
// prompts the engines hold, with how many of them hit, and the time of
// CAR's routing decisions for completions sent through kvcar meanwhile.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/cpuidle"
	"github.com/kvcar/kvcar/internal/cpunoise"
	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/kvevent"
	"github.com/kvcar/kvcar/internal/server"
)

type options struct {
	kvcar        string
	port         int
	internalPort int
	streams      int
	rate         float64
	duration     time.Duration
	blockSize    int
	promptBlocks int
	queryRate    float64
	queryTokens  int
	routeRate    float64
	seed         uint64
	adversarial  bool
	maxBlocks    int
	maxMessage   int
	resync       time.Duration
	// noise is how long a busy thread records the interruptions of
	// kvcar's CPUs, before kvcar starts and after it stops (0: not at
	// all).
	noise time.Duration
	// kvcarCPUs and driverCPUs, when set, keep kvcar and this driver
	// (its etcd, engines and clients) on CPUs of their own.
	kvcarCPUs, driverCPUs devcluster.CPUList
	// kvcarArgs are further kvcar flags, as --car_dispatch_accounting.
	kvcarArgs []string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o, err := parse(os.Args[1:])
	if err == nil && len(o.driverCPUs) > 0 {
		err = devcluster.PinSelf(o.driverCPUs)
	}
	if err == nil {
		var r *result
		if r, err = measure(ctx, o, os.Stdout); err == nil {
			r.print(os.Stdout, o)
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "kvcar-scale:", err)
		os.Exit(1)
	}
}

func parse(args []string) (options, error) {
	fs := flag.NewFlagSet("kvcar-scale", flag.ContinueOnError)
	o := options{}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary")
	fs.IntVar(&o.port, "port", 18888, "HTTP port for kvcar (0: a free one)")
	fs.IntVar(&o.internalPort, "internal_port", 18890, "port of kvcar's internal listener on loopback: the timed queries, /debug/pprof (0: a free one)")
	fs.IntVar(&o.streams, "streams", 128, "emulated engines (one DP rank, so one stream, each)")
	fs.Float64Var(&o.rate, "rate", 5, "prefills per second per engine")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "length of the measured load window")
	fs.IntVar(&o.blockSize, "block_size", 128, "tokens per block")
	fs.IntVar(&o.promptBlocks, "prompt_blocks", 8, "new blocks per prefill")
	fs.Float64Var(&o.queryRate, "query_rate", 50, "HTTP queries per second during the load window (0: none)")
	fs.IntVar(&o.queryTokens, "query_tokens", 8192, "tokens per query: an engine's recent prompt extended with new tokens")
	fs.Float64Var(&o.routeRate, "route_rate", 20, "completions per second routed through kvcar's CAR during the load window, prompts built like the queries' (0: none)")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.BoolVar(&o.adversarial, "adversarial", false, "engines publish to exhaust kvcar's limits: messages at and over max_message_bytes, chains past max_blocks_per_stream, repeated AllBlocksCleared")
	fs.IntVar(&o.maxBlocks, "max_blocks_per_stream", 262144, "kvcar's max_blocks_per_stream")
	fs.IntVar(&o.maxMessage, "max_message_bytes", 8<<20, "kvcar's max_message_bytes")
	fs.DurationVar(&o.resync, "resync_interval", config.Default().ResyncInterval, "kvcar's resync_interval_ms: the period of each stream's calibration snapshot (0: none; else at least 1s)")
	fs.DurationVar(&o.noise, "noise", 2*time.Second, "how long a busy thread records this machine's interruptions on kvcar's CPUs, before kvcar starts and again after it stops, the bound of the decision's latency (0: not at all)")
	fs.Var(&o.kvcarCPUs, "kvcar_cpus", "CPUs kvcar runs on, as taskset lists them (\"1\", \"2-3\"); empty: any")
	extra := fs.String("kvcar_args", "", "further kvcar flags, space separated (e.g. --car_dispatch_accounting)")
	fs.Var(&o.driverCPUs, "driver_cpus", "CPUs this driver (etcd, the emulated engines, the clients) runs on; empty: any")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.kvcarArgs = strings.Fields(*extra)
	if o.streams < 1 || o.streams > 128 {
		return o, fmt.Errorf("--streams = %d: must be in [1, 128]", o.streams)
	}
	if o.queryRate < 0 || o.queryRate > 10000 {
		return o, fmt.Errorf("--query_rate = %g: must be in [0, 10000]", o.queryRate)
	}
	if o.routeRate < 0 || o.routeRate > 10000 {
		return o, fmt.Errorf("--route_rate = %g: must be in [0, 10000]", o.routeRate)
	}
	if o.queryTokens < 1 || o.queryTokens > 65536 {
		return o, fmt.Errorf("--query_tokens = %d: must be in [1, 65536]", o.queryTokens)
	}
	if o.resync != 0 && o.resync < time.Second {
		return o, fmt.Errorf("--resync_interval = %v: must be 0 or at least 1s", o.resync)
	}
	if o.noise < 0 || o.noise > time.Minute {
		return o, fmt.Errorf("--noise = %v: must be in [0, 1m]", o.noise)
	}
	if o.rate <= 0 || o.duration <= 0 || o.blockSize < 1 || o.promptBlocks < 1 {
		return o, errors.New("--rate, --duration, --block_size and --prompt_blocks must be positive")
	}
	return o, nil
}

// result is what one run measured.
type result struct {
	syncTook time.Duration
	wall     time.Duration
	blocks   int64
	kvcarCPU time.Duration
	// snapshots and snapshotsFailed count kvcar's snapshots (its
	// calibrations, under this load) that ended during the window.
	snapshots, snapshotsFailed uint64
	// dry is what CAR's dry decisions (--car_keep_warm_interval_us) did
	// during the window.
	dry       dryStats
	selfCPU   time.Duration
	rss, peak int64
	bound     int64
	synced    int
	// resyncTook is how long the streams unsynchronised at the window's
	// end took to be synchronised again: 0 when none was, -1 when they
	// were not within resyncWait.
	resyncTook      time.Duration
	resident        int
	queries         queryStats
	routes          routeStats
	systemTokens    int
	promptTokensMax int
	// revs are the commits of the kvcar binary measured and of this
	// driver.
	revs devcluster.Revisions
	// idle is how the machine's idle CPUs waited, read at the start.
	idle cpuidle.Setting
	// noise is what a busy thread on kvcar's CPUs lost to interruptions
	// before kvcar started, and noiseAfter the same once it had stopped,
	// the engines still running both times: the two bracket the window.
	// Both are empty without --noise.
	noise, noiseAfter cpunoise.Trace
}

func (r *result) print(w io.Writer, o options) {
	fmt.Fprintf(w, "\nkvcar-scale: %d streams, %.1f prefills/s each of %d new %d-token blocks, %v window, %s\n",
		o.streams, o.rate, o.promptBlocks, o.blockSize, r.wall.Round(time.Millisecond), r.revs)
	if len(o.kvcarCPUs) > 0 || len(o.driverCPUs) > 0 {
		fmt.Fprintf(w, "kvcar on CPUs %s, this driver on CPUs %s\n", o.kvcarCPUs, o.driverCPUs)
	}
	fmt.Fprintf(w, "idle CPUs: %s\n", r.idle)
	fmt.Fprintf(w, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(w, "| kvcar start to all %d streams synchronised | %v |\n", o.streams, r.syncTook.Round(time.Millisecond))
	what := "blocks stored by the engines during the window"
	if o.adversarial {
		what = "blocks sent in at-limit messages and over-long chains (over-limit messages not counted)"
	}
	fmt.Fprintf(w, "| %s | %d (%.0f blocks/s) |\n", what, r.blocks, float64(r.blocks)/r.wall.Seconds())
	fmt.Fprintf(w, "| kvcar CPU during the window (the queries included) | %.1f%% of one core |\n", 100*r.kvcarCPU.Seconds()/r.wall.Seconds())
	resync := "off"
	if o.resync > 0 {
		resync = "every " + o.resync.String()
	}
	fmt.Fprintf(w, "| snapshots kvcar completed / failed during the window (calibrations %s per stream) | %d / %d |\n", resync, r.snapshots, r.snapshotsFailed)
	fmt.Fprintf(w, "| this driver's CPU (etcd, emulated engines, query client) in the window, on the same cores | %.1f%% of one core |\n", 100*r.selfCPU.Seconds()/r.wall.Seconds())
	if cpus := driverCPUs(o); r.selfCPU.Seconds() > saturated*float64(cpus)*r.wall.Seconds() {
		fmt.Fprintf(w, "| note | this driver used over %.0f%% of the %d CPU(s) it had: its engines' timers and its clients ran late, so the times its client saw are partly its own |\n", 100*saturated, cpus)
	}
	fmt.Fprintf(w, "| kvcar resident memory (now / peak) | %.1f MiB / %.1f MiB |\n", float64(r.rss)/(1<<20), float64(r.peak)/(1<<20))
	fmt.Fprintf(w, "| memory the config allows above kvcar's own (kvdir.MemoryBound for %d streams) | %.1f MiB |\n", o.streams, float64(r.bound)/(1<<20))
	fmt.Fprintf(w, "| streams synchronised after the window | %d of %d |\n", r.synced, o.streams)
	switch {
	case r.resyncTook > 0:
		fmt.Fprintf(w, "| after the window, all %d streams synchronised again within | %v |\n", o.streams, r.resyncTook.Round(time.Millisecond))
	case r.resyncTook < 0:
		fmt.Fprintf(w, "| after the window, all %d streams synchronised again within | not within %v |\n", o.streams, resyncWait)
	}
	fmt.Fprintf(w, "| resident Device blocks kvcar reports | %d |\n", r.resident)
	q := &r.queries
	fmt.Fprintf(w, "| HTTP queries during the window (%g/s, %d tokens each) answered / failed | %d / %d |\n", o.queryRate, o.queryTokens, len(q.server), q.failed)
	if !o.adversarial {
		fmt.Fprintf(w, "| queries on a prompt an engine served ≥ %v before: that engine reported the whole prompt (%d tokens) held / every other synchronised one the %d-token system prompt | %d / %d of %d |\n",
			settle, r.promptTokensMax, r.systemTokens, q.hits, q.sharedHits, q.withPrompt)
	}
	if len(q.server) > 0 {
		fmt.Fprintf(w, "| query during the window, kvcar's own time (Server-Timing): p50 / p99 | %v / %v |\n", q.server.at(0.5), q.server.at(0.99))
		fmt.Fprintf(w, "| same, seen by this driver's client (includes its own CPU contention): p50 / p99 | %v / %v |\n",
			q.client.at(0.5).Round(time.Microsecond), q.client.at(0.99).Round(time.Microsecond))
	}
	rt := &r.routes
	if o.routeRate > 0 {
		fmt.Fprintf(w, "| completions routed by CAR during the window (%g/s, %d tokens each) answered / failed / not sent (%d waiting) | %d / %d / %d |\n",
			o.routeRate, o.queryTokens, maxRoutesInFlight, len(rt.decision), rt.failed, rt.skipped)
		if rt.firstErr != nil {
			fmt.Fprintf(w, "| first failed completion | %v |\n", rt.firstErr)
		}
		if len(rt.client) > 0 && len(rt.queue) > 0 {
			fmt.Fprintf(w, "| answered completions, seen by this driver's client (%v limit): p50 / p99 / max | %v / %v / %v |\n",
				queryTimeout, rt.client.at(0.5).Round(time.Millisecond), rt.client.at(0.99).Round(time.Millisecond), rt.client[len(rt.client)-1].Round(time.Millisecond))
			fmt.Fprintf(w, "| same, the engines' own account (%d found): waiting for a batch slot p50 / p99 / max; emulated prefill p50 / p99 | %v / %v / %v; %v / %v |\n", len(rt.queue),
				rt.queue.at(0.5).Round(time.Millisecond), rt.queue.at(0.99).Round(time.Millisecond), rt.queue[len(rt.queue)-1].Round(time.Millisecond),
				rt.prefill.at(0.5).Round(time.Millisecond), rt.prefill.at(0.99).Round(time.Millisecond))
		}
	}
	if !o.adversarial && o.routeRate > 0 {
		fmt.Fprintf(w, "| completions on a prompt an engine served ≥ %v before, routed to that engine | %d of %d |\n", settle, rt.toServer, rt.withPrompt)
	}
	if len(rt.decision) > 0 {
		fmt.Fprintf(w, "| CAR's decision during the window (%s: prompt hashed, directory walked, instance picked): p50 / p99 / max | %v / %v / %v |\n",
			server.DecisionMicrosHeader, rt.decision.at(0.5), rt.decision.at(0.99), rt.decision[len(rt.decision)-1])
	}
	if d := r.dry; d.served {
		fmt.Fprintf(w, "| CAR's dry decisions during the window (--car_keep_warm_interval_us): count / share of one core | %.0f (%.0f/s) / %.2f%% |\n",
			d.n, d.n/r.wall.Seconds(), 100*d.took/r.wall.Seconds())
	} else {
		fmt.Fprintf(w, "| CAR's dry decisions during the window (--car_keep_warm_interval_us) | off |\n")
	}
	r.printNoise(w, o)
}

// saturated is the share of its CPUs past which the driver's own delays
// show in what its client measures: at 40 prefills a second on one core
// (97 %), the emulated engines' 666 ms prefills took up to 1.6 s.
const saturated = 0.9

// driverCPUs is how many CPUs this driver may run on.
func driverCPUs(o options) int {
	if len(o.driverCPUs) > 0 {
		return len(o.driverCPUs)
	}
	return runtime.NumCPU()
}

// dryStats are CAR's dry decisions: how many, and their time in seconds;
// served is false when kvcar makes none (the option off).
type dryStats struct {
	served  bool
	n, took float64
}

// readDry reads kvcar's dry-decision counters.
func readDry(ctx context.Context, kv *devcluster.KVCar) (dryStats, error) {
	const count, took = "kvcar_routing_dry_decisions_total", "kvcar_routing_dry_decision_seconds_total"
	m, err := kv.Metrics(ctx, count, took)
	if err != nil {
		return dryStats{}, err
	}
	n, served := m[count]
	return dryStats{served: served, n: n, took: m[took]}, nil
}

// printNoise reports the interruptions of kvcar's CPUs before kvcar
// started and after it stopped and, when CAR decided in the window, the
// bound each sets on its decision: work as long as the decision's median,
// delayed only by those interruptions.
func (r *result) printNoise(w io.Writer, o options) {
	where := "kvcar's CPUs (" + o.kvcarCPUs.String() + ")"
	if len(o.kvcarCPUs) == 0 {
		where = "any CPU"
	}
	for _, t := range []struct {
		when string
		n    *cpunoise.Trace
	}{{"before kvcar started", &r.noise}, {"after kvcar stopped", &r.noiseAfter}} {
		n := t.n
		if n.Span == 0 {
			continue
		}
		fmt.Fprintf(w, "| interruptions of a busy thread on %s over %v %s (gaps > %v): per second / each p50 / p99 / share of the CPU lost | %.0f / %v / %v / %.1f%% |\n",
			where, n.Span.Round(time.Millisecond), t.when, n.Threshold, n.PerSecond(), n.GapQuantile(0.5).Round(100*time.Nanosecond), n.GapQuantile(0.99).Round(100*time.Nanosecond), 100*n.Lost())
		if len(r.routes.decision) == 0 {
			continue
		}
		unit := r.routes.decision.at(0.5)
		if q, err := n.Elapsed(unit, cpunoise.Starts, 0.5, 0.99); err == nil {
			fmt.Fprintf(w, "| bound: %v of CPU work (the decision's p50) started anywhere in the trace %s: p50 / p99 | %v / %v |\n",
				unit, t.when, q[0].Round(100*time.Nanosecond), q[1].Round(100*time.Nanosecond))
		}
	}
}

// measure runs the load and the queries and reads what they cost kvcar.
// kvcar's own output goes to out.
func measure(ctx context.Context, o options, out io.Writer) (r *result, err error) {
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return nil, err
	}
	defer etcd.Close()

	var cfgs []enginesim.Config
	for range o.streams {
		cfgs = append(cfgs, devcluster.Discoverable(enginesim.Config{BlockSize: o.blockSize, DeviceBlocks: 8192}, etcd.Endpoints(), "", time.Second))
	}
	engines, err := devcluster.StartEngines(cfgs)
	if err != nil {
		return nil, err
	}
	defer engines.Close()

	dir, err := os.MkdirTemp("", "kvcar-scale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// The machine's own interruptions of kvcar's CPUs, measured before
	// kvcar runs there, so that its work is not counted among them.
	var noise cpunoise.Trace
	if o.noise > 0 {
		if noise, err = recordNoise(o); err != nil {
			return nil, err
		}
	}
	cfg := devcluster.DiscoveryConfig(o.blockSize, 200*time.Millisecond)
	cfg.MaxStreams, cfg.MaxBlocksPerStream, cfg.MaxMessageBytes, cfg.MaxBufferedBytes = 128, o.maxBlocks, o.maxMessage, 2*o.maxMessage
	cfg.ResyncInterval = o.resync
	cfgPath, err := devcluster.WriteConfig(dir, cfg)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: o.kvcar, Port: o.port, InternalPort: o.internalPort, Etcd: etcd.Endpoints(), ConfigFile: cfgPath,
		Args:   append([]string{"--log_level=warn", "--load_balance_policy=CAR", "--expose_routing_headers"}, o.kvcarArgs...),
		Stdout: out, Stderr: out, CPUs: o.kvcarCPUs,
	})
	if err != nil {
		return nil, fmt.Errorf("%w (run make build first)", err)
	}
	// The window ends by stopping kvcar when the machine's interruptions
	// are to be recorded again.
	stopped := false
	defer func() {
		if !stopped {
			err = errors.Join(err, kv.Stop())
		}
	}()
	// Queries and profiles are on the internal listener.
	base := kv.InternalURL()
	if err := kv.WaitSynced(ctx, o.streams, 60*time.Second); err != nil {
		return nil, err
	}
	syncTook := time.Since(began)
	hc := newClient()
	defer hc.CloseIdleConnections()
	if err := kv.WaitLoads(ctx, hc, o.streams, 30*time.Second); err != nil {
		return nil, err
	}
	rev, err := devcluster.KVCarRevision(ctx, o.kvcar)
	if err != nil {
		return nil, err
	}
	r = &result{syncTook: syncTook, systemTokens: systemBlocks * o.blockSize,
		promptTokensMax: min((systemBlocks+o.promptBlocks)*o.blockSize, o.queryTokens/o.blockSize*o.blockSize),
		revs:            devcluster.Revisions{KVCar: rev, Driver: devcluster.Revision()},
		idle:            cpuidle.Read("/"), noise: noise}

	states0, err := kv.StreamStates(ctx)
	if err != nil {
		return nil, err
	}
	dry0, err := readDry(ctx, kv)
	if err != nil {
		return nil, err
	}
	cpu0, err := devcluster.CPUTime(kv.Pid())
	if err != nil {
		return nil, err
	}
	self0, err := devcluster.CPUTime(os.Getpid())
	if err != nil {
		return nil, err
	}
	window, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	recent := newRecentPrompts(len(engines))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.queries = queryDuring(window, hc, base, engines, recent, o)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.routes = routeDuring(window, hc, kv.URL(), engines, recent, o)
	}()
	t0 := time.Now()
	if o.adversarial {
		r.blocks = attack(window, engines, o)
	} else {
		r.blocks = drive(window, engines, o, recent)
	}
	wg.Wait()
	r.wall = time.Since(t0)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	cpu1, err := devcluster.CPUTime(kv.Pid())
	if err != nil {
		return nil, err
	}
	self1, err := devcluster.CPUTime(os.Getpid())
	if err != nil {
		return nil, err
	}
	r.kvcarCPU, r.selfCPU = cpu1-cpu0, self1-self0
	states1, err := kv.StreamStates(ctx)
	if err != nil {
		return nil, err
	}
	r.snapshots, r.snapshotsFailed = devcluster.SnapshotsBetween(states0, states1)
	dry1, err := readDry(ctx, kv)
	if err != nil {
		return nil, err
	}
	r.dry = dryStats{served: dry1.served, n: dry1.n - dry0.n, took: dry1.took - dry0.took}
	if r.rss, r.peak, err = devcluster.Memory(kv.Pid()); err != nil {
		return nil, err
	}
	r.bound = kvdir.LimitsFromConfig(&cfg).MemoryBound().Process(o.streams)
	ms, _, err := queryTimed(ctx, hc, base, []uint32{})
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.Synchronized {
			r.synced++
		}
		r.resident += m.DeviceBlocks
	}
	if r.synced < o.streams {
		// What the window left unsynchronised, kvcar recovers once the
		// engines are quiet again.
		t0 := time.Now()
		if err := kv.WaitSynced(ctx, o.streams, resyncWait); err == nil {
			r.resyncTook = time.Since(t0)
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		} else {
			r.resyncTook = -1
		}
	}
	if o.noise > 0 {
		stopped = true
		if err := kv.Stop(); err != nil {
			return nil, err
		}
		if r.noiseAfter, err = recordNoise(o); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// recordNoise records the machine's interruptions of kvcar's CPUs for
// --noise, on those CPUs.
func recordNoise(o options) (cpunoise.Trace, error) {
	var noise cpunoise.Trace
	var nerr error
	if err := devcluster.RunOnCPUs(o.kvcarCPUs, func() { noise, nerr = cpunoise.Record(o.noise, cpunoise.Threshold) }); err != nil {
		return cpunoise.Trace{}, err
	}
	return noise, nerr
}

// attack makes every engine publish what costs a subscriber the most:
// messages just under and just over max_message_bytes, chains longer
// than max_blocks_per_stream, and AllBlocksCleared, in turn, as fast as
// it can until ctx ends.
func attack(ctx context.Context, engines []*enginesim.Engine, o options) int64 {
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	// Bytes of msgpack per block: ~3 per token plus the hash.
	perBlock := 3*o.blockSize + 9
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.seed, uint64(i+1)))
			for step := 0; ctx.Err() == nil; step++ {
				var err error
				switch step % 4 {
				case 0:
					err = e.SendOversize(0, o.maxMessage-perBlock*4)
					total.Add(int64(o.maxMessage / perBlock))
				case 1:
					err = e.SendOversize(0, 2*o.maxMessage) // refused by libzmq, link dropped
				case 2:
					n := min(o.maxBlocks+64, (o.maxMessage/perBlock)-8)
					_, err = e.StoreChain(0, tokens(rng, n*o.blockSize), kvevent.Device)
					total.Add(int64(n))
				default:
					err = e.Clear(0)
				}
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return total.Load()
}

// systemBlocks is the length of the system prompt every prefill starts
// with.
const systemBlocks = 4

// drive makes every engine prefill at o.rate until ctx ends: the shared
// system prompt plus fresh blocks, so the engines store and evict. Each
// prompt served goes to recent.
func drive(ctx context.Context, engines []*enginesim.Engine, o options, recent *recentPrompts) int64 {
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	system := tokens(rand.New(rand.NewPCG(o.seed, 0)), systemBlocks*o.blockSize)
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.seed, uint64(i+1)))
			// Each engine starts at its own point of the period, as a
			// fleet's engines do: started together, 128 engines would
			// prefill in one burst per period, a burst that takes both
			// cores from kvcar for its duration.
			period := time.Duration(float64(time.Second) / o.rate)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(rng.Int64N(int64(period)))):
			}
			tick := time.NewTicker(period)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				prompt := append(slices.Clip(system), tokens(rng, o.promptBlocks*o.blockSize)...)
				if _, _, err := e.Prefill(0, prompt); err == nil {
					total.Add(int64(o.promptBlocks))
					recent.put(i, prompt, time.Now())
				}
			}
		}()
	}
	wg.Wait()
	return total.Load()
}

func tokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150_000))
	}
	return t
}

// recentPrompts keeps the last prompts each engine served, with when.
type recentPrompts struct {
	mu       sync.Mutex
	byEngine [][]servedPrompt // oldest first
}

type servedPrompt struct {
	tokens []uint32
	at     time.Time
}

func newRecentPrompts(engines int) *recentPrompts {
	return &recentPrompts{byEngine: make([][]servedPrompt, engines)}
}

// put keeps p as served by engine at now, with the prompts served within
// settle before it and the newest one before those: all that pick can
// draw. A count alone would not do: at 40 prefills a second, four
// prompts span 100ms, and pick would find none served settle ago.
func (r *recentPrompts) put(engine int, p []uint32, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := append(r.byEngine[engine], servedPrompt{p, now})
	old := 0
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].at.Before(now.Add(-settle)) {
			old = i
			break
		}
	}
	r.byEngine[engine] = ps[old:]
}

// servedBefore returns the newest prompt engine served before t.
func (r *recentPrompts) servedBefore(engine int, t time.Time) ([]uint32, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.byEngine[engine]
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].at.Before(t) {
			return ps[i].tokens, true
		}
	}
	return nil, false
}

// pick draws an engine and builds a prompt on the newest one it served at
// least settle ago, extended with new tokens to o.queryTokens: held is how
// many of its tokens that engine holds (whole blocks), ok whether there
// was such a prompt (when not, the prompt is all new tokens).
func (r *recentPrompts) pick(rng *rand.Rand, o options) (engine int, prompt []uint32, held int, ok bool) {
	engine = rng.IntN(len(r.byEngine))
	served, ok := r.servedBefore(engine, time.Now().Add(-settle))
	prompt = tokens(rng, o.queryTokens)
	if ok {
		held = min(len(served), o.queryTokens) / o.blockSize * o.blockSize
		copy(prompt, served)
	}
	return engine, prompt, held, ok
}

// settle is how long before a query its prompt was served: kvcar sees a
// prefill's blocks only once the engine's event reaches it.
const settle = 200 * time.Millisecond

// resyncWait bounds the wait, after the window, for the streams it left
// unsynchronised: their recovery takes a snapshot of an engine that may
// have been given up on for a while (the stream's retry backoff).
const resyncWait = 60 * time.Second

// durations is a sorted sample.
type durations []time.Duration

func (d durations) at(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// queryStats is what the queries sent during the window saw.
type queryStats struct {
	client, server durations
	failed         int
	// withPrompt counts queries built on a prompt an engine had served;
	// hits those in whose answer that engine held it all, sharedHits
	// those in which every other synchronised engine held the system
	// prompt.
	withPrompt, hits, sharedHits int
}

// queryDuring sends a query at o.queryRate until ctx ends: a prompt a
// random engine served at least settle ago, extended with new tokens to
// o.queryTokens (new tokens only while no prompt has settled, and in the
// adversarial run). It counts the queries in which the engine's stream
// reports the whole served prompt held on Device, and those in which
// every other synchronised stream reports the system prompt.
func queryDuring(ctx context.Context, hc *http.Client, base string, engines []*enginesim.Engine, recent *recentPrompts, o options) queryStats {
	var st queryStats
	if o.queryRate == 0 {
		return st
	}
	rng := rand.New(rand.NewPCG(o.seed, 999))
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.queryRate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			slices.Sort(st.client)
			slices.Sort(st.server)
			return st
		case <-tick.C:
		}
		i, prompt, held, ok := recent.pick(rng, o)
		t := time.Now()
		ms, srv, err := queryTimed(ctx, hc, base, prompt)
		if err != nil {
			if ctx.Err() == nil {
				st.failed++
			}
			continue
		}
		st.client = append(st.client, time.Since(t))
		st.server = append(st.server, srv)
		if ok {
			st.withPrompt++
			own, others := hitAll(ms, engines[i].Name(), held, min(held, systemBlocks*o.blockSize))
			if own {
				st.hits++
			}
			if others {
				st.sharedHits++
			}
		}
	}
}

// hitAll reports whether the stream of instance holds want tokens of the
// prompt on Device, and whether every other synchronised stream holds at
// least shared.
func hitAll(ms []match, instance string, want, shared int) (own, others bool) {
	others = true
	for _, m := range ms {
		switch {
		case m.InstanceName == instance:
			own = m.Synchronized && m.DeviceHitTokens >= want
		case m.Synchronized && m.DeviceHitTokens < shared:
			others = false
		}
	}
	return own, others
}

type match struct {
	InstanceName    string `json:"instance_name"`
	Synchronized    bool   `json:"synchronized"`
	DeviceHitTokens int    `json:"device_hit_tokens"`
	DeviceBlocks    int    `json:"device_blocks"`
}

// queryTimeout bounds one query.
const queryTimeout = 5 * time.Second

// queryTimed queries kvcar and also returns its own time for the query,
// from its Server-Timing header.
func queryTimed(ctx context.Context, hc *http.Client, base string, ids []uint32) ([]match, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string][]uint32{"token_ids": ids})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/internal/kv-cache/query", bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, 0, fmt.Errorf("query: %s: %s", resp.Status, b)
	}
	var out struct {
		Matches []match `json:"matches"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, 0, err
	}
	var server time.Duration
	if v, ok := strings.CutPrefix(resp.Header.Get("Server-Timing"), "kvcar;dur="); ok {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			server = time.Duration(ms * float64(time.Millisecond))
		}
	}
	return out.Matches, server, nil
}

// routeStats is what the completions routed during the window saw.
type routeStats struct {
	// decision is kvcar's own time for each routing decision, from its
	// decision header; client each answered completion's time as this
	// driver's client saw it, and queue and prefill the engine's own
	// account of it (EngineUsage): what waited for a batch slot and what
	// the cost model made the prefill take.
	decision, client, queue, prefill durations
	failed                           int
	// skipped counts ticks that found maxRoutesInFlight completions
	// waiting.
	skipped  int
	firstErr error
	// withPrompt counts completions built on a prompt an engine had
	// served; toServer those kvcar sent to that engine.
	withPrompt, toServer int
}

// routeDuring sends a completion through kvcar's public listener at
// o.routeRate until ctx ends, its prompt built like a query's, and reads
// the decision kvcar reports: how long CAR took and where it sent the
// request. The engine that served a prompt holds all of it and the others
// only the system prompt, so on an idle fleet CAR sends it there. An
// engine takes a while to answer an 8k-token prompt, so completions
// overlap, up to maxRoutesInFlight; a tick that finds that many waiting
// sends nothing.
func routeDuring(ctx context.Context, hc *http.Client, base string, engines []*enginesim.Engine, recent *recentPrompts, o options) routeStats {
	var (
		st routeStats
		mu sync.Mutex
		wg sync.WaitGroup
	)
	if o.routeRate == 0 {
		return st
	}
	slots := make(chan struct{}, maxRoutesInFlight)
	rng := rand.New(rand.NewPCG(o.seed, 1999))
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.routeRate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			for _, d := range []durations{st.decision, st.client, st.queue, st.prefill} {
				slices.Sort(d)
			}
			return st
		case <-tick.C:
		}
		select {
		case slots <- struct{}{}:
		default:
			mu.Lock()
			st.skipped++
			mu.Unlock()
			continue
		}
		i, prompt, _, ok := recent.pick(rng, o)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			t0 := time.Now()
			a, err := routeOne(ctx, hc, base, prompt)
			client := time.Since(t0)
			// Looked up before the stats' lock: it asks every engine.
			eu, served := devcluster.Engines(engines).Served(a.id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if ctx.Err() == nil {
					st.failed++
					if st.firstErr == nil {
						st.firstErr = err
					}
				}
				return
			}
			st.decision = append(st.decision, a.decision)
			st.client = append(st.client, client)
			if served {
				ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
				st.queue = append(st.queue, ms(eu.QueueMs))
				st.prefill = append(st.prefill, ms(eu.PrefillMs))
			}
			if ok {
				st.withPrompt++
				if a.to == engines[i].Name() {
					st.toServer++
				}
			}
		}()
	}
}

// newClient is the driver's HTTP client. Its write buffer holds a whole
// request, so a body reaches kvcar in one write: the query's
// Server-Timing starts before its body is read, and a body sent in 4 KB
// pieces by a driver waiting for a core between them would count the
// driver's waits as kvcar's time.
func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{WriteBufferSize: 1 << 20, MaxIdleConnsPerHost: maxRoutesInFlight}}
}

// maxRoutesInFlight bounds the completions routeDuring has waiting.
const maxRoutesInFlight = 64

// routed is what one completion through kvcar reported: the instance
// kvcar sent it to, kvcar's decision time, and the id of its answer, by
// which the engine that served it tells its own account (Served).
type routed struct {
	to, id   string
	decision time.Duration
}

// routeOne sends one completion of ids through kvcar and returns what it
// reported.
func routeOne(ctx context.Context, hc *http.Client, base string, ids []uint32) (routed, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	body, _ := json.Marshal(struct {
		Model     string   `json:"model"`
		MaxTokens int      `json:"max_tokens"`
		Prompt    []uint32 `json:"prompt"`
	}{"scale", 1, ids})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+server.CompletionsPath, bytes.NewReader(body))
	if err != nil {
		return routed{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return routed{}, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return routed{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return routed{}, fmt.Errorf("completion: %s: %.200s", resp.Status, answer)
	}
	us, err := strconv.ParseInt(resp.Header.Get(server.DecisionMicrosHeader), 10, 64)
	if err != nil {
		return routed{}, fmt.Errorf("completion: no decision time: %w", err)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(answer, &out); err != nil {
		return routed{}, fmt.Errorf("completion: answer: %w", err)
	}
	return routed{to: resp.Header.Get(server.PrefillNameHeader), id: out.ID, decision: time.Duration(us) * time.Microsecond}, nil
}
