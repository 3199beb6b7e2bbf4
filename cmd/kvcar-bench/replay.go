package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
)

// traceRecord is what one replayed request did.
type traceRecord struct {
	// Index is the request's place in the window, Line its trace line.
	Index int
	Line  int
	// ArrivalMs is the arrival in trace time, jitter included, from the
	// window's start.
	ArrivalMs float64
	Input     int
	Output    int
	// Engine is the serving engine's place in the run's engine list and
	// DPRank the rank it picked; -1 when the request failed.
	Engine    int
	DPRank    int
	DeviceHit int
	HostHit   int
	// EngineTTFTMs is what the engine measured on the wall clock, queue
	// and prefill, scaled back to trace time.
	EngineTTFTMs float64
	// Decision is the routing decision time: kvcar's header, or the
	// benchmark's own pick with its HTTP round trips (DecisionHTTP).
	Decision     time.Duration
	HasDecision  bool
	DecisionHTTP time.Duration
	// LaunchLag is how late the request left against its due wall time.
	LaunchLag time.Duration
	Err       error

	// The replay-time model's results, in trace milliseconds.
	StartMs   float64
	PrefillMs float64
	TTFTMs    float64
}

// replayRequest is one request of a run, due at ArrivalMs.
type replayRequest struct {
	index     int
	arrivalMs float64
	req       *traceRequest
}

// fleet is one run's engines with what the routers need to know of them.
type fleet struct {
	engines devcluster.Engines
	names   []string
	dp      []int
	costs   []enginesim.CostModel
	index   map[string]int
	// scale is the trace tokens one emulated token stands for.
	scale int
}

// newFleet describes the engines; costs are in the trace's tokens, a
// rank of a DP-d engine having 1/d of the engine's compute.
func newFleet(es devcluster.Engines, c traceCluster) *fleet {
	f := &fleet{engines: es, index: map[string]int{}, scale: c.TokenScale}
	for i, e := range es {
		dp := time.Duration(e.DPSize())
		f.names = append(f.names, e.Name())
		f.dp = append(f.dp, e.DPSize())
		f.costs = append(f.costs, enginesim.CostModel{PrefillPerToken: c.PrefillPerToken * dp, AttentionPer1KContext: c.AttentionPer1K * dp})
		f.index[e.Name()] = i
	}
	return f
}

// seededOrder returns the engines' DP sizes in the seed's order: which
// place the multi-DP engine takes changes with the seed.
func seededOrder(dp []int, seed uint64) []int {
	out := slices.Clone(dp)
	rng := rand.New(rand.NewPCG(seed, 0x656e67696e6573))
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// jitteredArrivals spreads each request uniformly over the millisecond
// its timestamp names (the trace's resolution), by the seed, in arrival
// order, relative to startMs.
func jitteredArrivals(reqs []traceRequest, startMs int64, seed uint64) []replayRequest {
	rng := rand.New(rand.NewPCG(seed, 0x6a6974746572))
	out := make([]replayRequest, len(reqs))
	for i := range reqs {
		out[i] = replayRequest{index: i, arrivalMs: float64(reqs[i].ArrivalMs-startMs) + rng.Float64(), req: &reqs[i]}
	}
	slices.SortStableFunc(out, func(a, b replayRequest) int {
		switch {
		case a.arrivalMs < b.arrivalMs:
			return -1
		case a.arrivalMs > b.arrivalMs:
			return 1
		}
		return 0
	})
	return out
}

// replayOnce replays the window with one policy and seed on fresh
// engines and a fresh kvcar.
func replayOnce(ctx context.Context, o traceOptions, reqs []traceRequest, etcd *etcdembed.Server, p tracePolicy,
	seed uint64, run int, routingHeaders bool, progress io.Writer,
) (runResult, error) {
	namespace := fmt.Sprintf("kvcar-trace-%d", run)
	es, err := startTraceEngines(o, seededOrder(o.Cluster.EngineDP, seed), etcd.Endpoints(), namespace)
	if err != nil {
		return runResult{}, err
	}
	defer es.Close()
	f := newFleet(es, o.Cluster)

	dir, err := os.MkdirTemp("", "kvcar-trace-")
	if err != nil {
		return runResult{}, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	kvPolicy, extra := "RR", []string(nil)
	if p.Kind == kindKvcar {
		kvPolicy = p.KvcarPolicy
		extra = append(extra, p.kvcarFlags(time.Duration(float64(o.PendingTimeout)/o.Speedup))...)
	}
	if routingHeaders {
		extra = append(extra, "--"+exposeHeadersFlag)
	}
	kv, logPath, err := startTraceKvcar(o, dir, etcd.Endpoints(), namespace, kvPolicy, extra)
	if err != nil {
		return runResult{}, err
	}
	defer func() {
		if err := kv.Stop(); err != nil {
			fmt.Fprintf(progress, "%s seed %d: %v\n", p.Name, seed, err)
		}
	}()
	hc := traceHTTPClient()
	defer hc.CloseIdleConnections()
	if err := waitReady(ctx, hc, kv, logPath, es, o.readyTimeout); err != nil {
		return runResult{}, err
	}
	for _, e := range es {
		e.ResetStats()
	}
	rt, err := newRouter(p, f, kv, hc, seed)
	if err != nil {
		return runResult{}, err
	}
	arrivals := jitteredArrivals(reqs, o.Start.Milliseconds(), seed)
	kvCPU0, err1 := devcluster.CPUTime(kv.Pid())
	ownCPU0, err2 := devcluster.CPUTime(os.Getpid())
	recs, wall, err := replay(ctx, arrivals, o, rt, f, hc, kv.URL())
	if err != nil {
		return runResult{}, fmt.Errorf("%w\n%s", err, logTail(logPath, 10))
	}
	if err := kv.Exited(); err != nil {
		return runResult{}, fmt.Errorf("%w\n%s", err, logTail(logPath, 20))
	}
	kvCPU1, err3 := devcluster.CPUTime(kv.Pid())
	ownCPU1, err4 := devcluster.CPUTime(os.Getpid())
	res := summarizeRun(p, seed, recs, f, o, wall, rt)
	if errors.Join(err1, err2, err3, err4) == nil {
		res.KvcarCPUSeconds, res.OwnCPUSeconds = (kvCPU1 - kvCPU0).Seconds(), (ownCPU1 - ownCPU0).Seconds()
	}
	return res, nil
}

func traceHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// startTraceEngines starts one engine per DP size, each registered under
// namespace, with the trace cluster's capacity and costs, their times
// divided by the speed-up.
func startTraceEngines(o traceOptions, dps []int, etcd []string, namespace string) (devcluster.Engines, error) {
	c := o.Cluster
	cfgs := make([]enginesim.Config, 0, len(dps))
	for _, dp := range dps {
		// An emulated token stands for TokenScale of the trace's, and
		// attention grows with both the tokens and their context.
		scale := time.Duration(c.TokenScale)
		cfg := enginesim.Config{
			DPSize: dp, BlockSize: c.perBlock(), DeviceBlocks: c.rankBlocks(dp),
			TimeScale:                    1 / o.Speedup,
			PrefillPerToken:              c.PrefillPerToken * time.Duration(dp) * scale,
			PrefillAttentionPer1KContext: c.AttentionPer1K * time.Duration(dp) * scale * scale,
			// One prompt at a time per rank: a FIFO server whose speed is
			// the rank's compute; more slots would each run at full speed.
			BatchSlots: 1,
			// Every request of a burst may queue on one engine.
			MaxQueue: 1 << 16,
		}
		hb := time.Duration(float64(c.Heartbeat) / o.Speedup)
		cfgs = append(cfgs, devcluster.Discoverable(cfg, etcd, namespace, hb))
	}
	return devcluster.StartEngines(cfgs)
}

func startTraceKvcar(o traceOptions, dir string, etcd []string, namespace, policy string, extra []string) (*devcluster.KVCar, string, error) {
	cfgPath, err := devcluster.WriteConfig(dir, devcluster.DiscoveryConfig(o.Cluster.perBlock(), 100*time.Millisecond))
	if err != nil {
		return nil, "", err
	}
	logPath := filepath.Join(dir, "kvcar.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", fmt.Errorf("kvcar log: %w", err)
	}
	defer logFile.Close()
	args := append([]string{"--host=127.0.0.1", "--load_balance_policy=" + policy, "--log_level=warn"}, extra...)
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: o.kvcar, Etcd: etcd, Namespace: namespace, ConfigFile: cfgPath, Args: args, Stdout: logFile, Stderr: logFile,
	})
	if err != nil {
		return nil, "", fmt.Errorf("%w (build it with make build, or pass --kvcar)", err)
	}
	return kv, logPath, nil
}

// replay sends every request when it is due on the wall clock (its
// arrival divided by the speed-up), through the router, and returns the
// records in window order and the wall time from the first launch to the
// last answer.
func replay(ctx context.Context, arrivals []replayRequest, o traceOptions, rt router, f *fleet, hc *http.Client, kvcarURL string) ([]traceRecord, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recs := make([]traceRecord, len(arrivals))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed int
	var firstErr error
	began := time.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for _, a := range arrivals {
		due := began.Add(time.Duration(a.arrivalMs / o.Speedup * float64(time.Millisecond)))
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		lag := time.Since(due)
		wg.Go(func() {
			rec := serveOne(ctx, a, rt, f, hc, kvcarURL)
			rec.LaunchLag = lag
			mu.Lock()
			defer mu.Unlock()
			recs[a.index] = rec
			if rec.Err != nil {
				failed++
				if firstErr == nil {
					firstErr = rec.Err
				}
				if failed >= o.maxErrors {
					cancel()
				}
			}
		})
	}
	wg.Wait()
	wall := time.Since(began)
	if failed >= o.maxErrors {
		return recs, wall, fmt.Errorf("%d requests failed, the first: %w", failed, firstErr)
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return recs, wall, err
	}
	return recs, wall, nil
}
