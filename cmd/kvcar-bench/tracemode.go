package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/etcdembed"
)

// policyKind says who routes a trace policy.
type policyKind int

const (
	// kindKvcar: kvcar routes (RR, or CAR with a λ) and relays the
	// request to the engine it picks.
	kindKvcar policyKind = iota
	// kindRandom: the benchmark picks an instance uniformly at random.
	kindRandom
	// kindLLMD and kindDynamo: the benchmark's re-implementations of
	// other routers' scoring, fed by kvcar's query API and registry.
	kindLLMD
	kindDynamo
)

// tracePolicy is one routing policy of the trace replay.
type tracePolicy struct {
	Name   string     `json:"name"`
	Kind   policyKind `json:"-"`
	Lambda float64    `json:"lambda,omitempty"`
	// KvcarPolicy is --load_balance_policy for kindKvcar.
	KvcarPolicy string `json:"-"`
	// Accounting are the parts of CAR's router-side accounting the
	// policy's suffixes turn on (see accountingSuffixes).
	Accounting []string `json:"accounting,omitempty"`
}

// accountingSuffixes are the suffixes of a CAR@λ or LEAST_QUEUE policy
// name and the kvcar flags they add: +acct dispatch accounting, +tok
// the same with half the queue term's weight on uncached prompt tokens,
// +pend pending prefixes. CAR@0.5+acct+pend turns on both parts.
var accountingSuffixes = map[string][]string{
	"acct": {"--car_dispatch_accounting"},
	"tok":  {"--car_dispatch_accounting", "--car_dispatch_token_weight=0.5"},
	"pend": {"--car_pending_prefixes"},
}

// kvcarFlags are the flags a kvcar policy passes to kvcar beyond
// --load_balance_policy; pendingTimeout is in wall time.
func (p tracePolicy) kvcarFlags(pendingTimeout time.Duration) []string {
	var out []string
	if p.KvcarPolicy == "CAR" {
		out = append(out, "--car_prefill_lambda="+strconv.FormatFloat(p.Lambda, 'g', -1, 64))
	}
	seen := map[string]bool{}
	for _, a := range p.Accounting {
		for _, f := range accountingSuffixes[a] {
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
		if a == "pend" {
			out = append(out, "--car_pending_prefix_timeout_ms="+strconv.FormatInt(max(pendingTimeout.Milliseconds(), 1), 10))
		}
	}
	return out
}

// Policy names of the trace replay. LEAST_QUEUE is kvcar's CAR with
// λ = 0: the queue term alone.
const (
	tpRandom     = "RANDOM"
	tpRR         = "RR"
	tpLeastQueue = "LEAST_QUEUE"
	tpCARPrefix  = "CAR@"
	tpLLMD       = "LLMD"
	tpDynamo     = "DYNAMO"
)

const defaultTracePolicies = "RANDOM,RR,LEAST_QUEUE,CAR@0.25,CAR@0.5,CAR@0.75,CAR@1,CAR@0.5+acct,CAR@0.5+tok,CAR@0.5+pend,CAR@0.5+tok+pend,LLMD,DYNAMO"

func parseTracePolicy(s string) (tracePolicy, error) {
	base, suffixes, _ := strings.Cut(s, "+")
	if suffixes == "" {
		return parseBasePolicy(s)
	}
	p, err := parseBasePolicy(base)
	if err != nil {
		return p, err
	}
	if p.KvcarPolicy != "CAR" {
		return tracePolicy{}, fmt.Errorf("policy %q: accounting suffixes apply to CAR@λ and LEAST_QUEUE only", s)
	}
	for _, a := range strings.Split(suffixes, "+") {
		if _, ok := accountingSuffixes[a]; !ok {
			return tracePolicy{}, fmt.Errorf("policy %q: unknown suffix %q (want +acct, +tok or +pend)", s, a)
		}
		p.Accounting = append(p.Accounting, a)
	}
	p.Name = s
	return p, nil
}

func parseBasePolicy(s string) (tracePolicy, error) {
	switch s {
	case tpRandom:
		return tracePolicy{Name: s, Kind: kindRandom}, nil
	case tpRR:
		return tracePolicy{Name: s, Kind: kindKvcar, KvcarPolicy: "RR"}, nil
	case tpLeastQueue:
		return tracePolicy{Name: s, Kind: kindKvcar, KvcarPolicy: "CAR", Lambda: 0}, nil
	case tpLLMD:
		return tracePolicy{Name: s, Kind: kindLLMD}, nil
	case tpDynamo:
		return tracePolicy{Name: s, Kind: kindDynamo}, nil
	}
	if l, ok := strings.CutPrefix(s, tpCARPrefix); ok {
		lambda, err := strconv.ParseFloat(l, 64)
		if err != nil || !(lambda >= 0 && lambda <= 1) {
			return tracePolicy{}, fmt.Errorf("policy %q: λ must be a number in [0, 1]", s)
		}
		return tracePolicy{Name: s, Kind: kindKvcar, KvcarPolicy: "CAR", Lambda: lambda}, nil
	}
	return tracePolicy{}, fmt.Errorf("unknown policy %q (want RANDOM, RR, LEAST_QUEUE, CAR@λ, LLMD or DYNAMO; CAR@λ and LEAST_QUEUE may add +acct, +tok, +pend)", s)
}

// traceOptions configure a trace replay.
type traceOptions struct {
	Trace   string        `json:"trace"`
	Start   time.Duration `json:"start_ns"`
	Window  time.Duration `json:"window_ns"`
	Speedup float64       `json:"speedup"`
	Seeds   int           `json:"seeds"`
	Seed    uint64        `json:"first_seed"`
	// Parallel runs share the machine; the report's launch lag and
	// engine-measured TTFT show whether it kept up.
	Parallel int `json:"parallel"`

	Policies []tracePolicy `json:"policies"`
	// PendingTimeout is the pending prefixes' timeout of +pend
	// policies, in trace time.
	PendingTimeout time.Duration `json:"pending_prefix_timeout_ns,omitempty"`
	Cluster        traceCluster  `json:"cluster"`

	kvcar        string
	readme       bool
	jsonOut      bool
	jsonFile     string
	recordsCSV   string
	readyTimeout time.Duration
	maxErrors    int
	command      string
}

// traceCluster is the emulated fleet of the replay. Times are emulated
// (trace) time; the replay divides them by Speedup.
type traceCluster struct {
	EngineDP []int `json:"engine_dp"`
	// CapacityTokens is each engine's Device KV capacity, split evenly
	// over its DP ranks.
	CapacityTokens int `json:"capacity_tokens"`
	// PrefillPerToken and AttentionPer1K are an engine's prefill costs
	// (enginesim.CostModel); a rank of an engine with DP size d has 1/d
	// of the engine's compute, so its costs are d times these.
	PrefillPerToken time.Duration `json:"prefill_per_token_ns"`
	AttentionPer1K  time.Duration `json:"attention_per_1k_context_ns"`
	// TPOT is the decode time per output token after the first, for the
	// end-to-end latency (decode is not emulated, see the report).
	TPOT      time.Duration `json:"tpot_ns"`
	Heartbeat time.Duration `json:"heartbeat_interval_ns"`
	// TokenScale shrinks every prompt: a hash id becomes 512/TokenScale
	// token ids and the engines' blocks are as long, so blocks, hits and
	// evictions are the same, and the capacity and costs stay in the
	// trace's tokens (each emulated token stands for TokenScale).
	TokenScale int `json:"token_scale"`
}

// perBlock is the number of token ids one hash id expands to, the
// engines' and kvcar's block size.
func (c traceCluster) perBlock() int { return TraceBlockTokens / c.TokenScale }

func (c traceCluster) validate() error {
	var errs []error
	if len(c.EngineDP) == 0 || len(c.EngineDP) > 64 {
		errs = append(errs, fmt.Errorf("--engines: %d engines, want 1..64", len(c.EngineDP)))
	}
	for i, dp := range c.EngineDP {
		if dp < 1 || dp > 8 {
			errs = append(errs, fmt.Errorf("--engines: engine %d has DP size %d, want 1..8", i, dp))
		} else if c.CapacityTokens/dp < TraceBlockTokens {
			errs = append(errs, fmt.Errorf("--capacity_tokens %d: engine %d's DP ranks would hold less than one %d-token block",
				c.CapacityTokens, i, TraceBlockTokens))
		}
	}
	if c.CapacityTokens < TraceBlockTokens || c.CapacityTokens > 1<<30 {
		errs = append(errs, fmt.Errorf("--capacity_tokens = %d: want %d..%d", c.CapacityTokens, TraceBlockTokens, 1<<30))
	}
	if c.TokenScale < 1 || c.TokenScale > 64 || TraceBlockTokens%c.TokenScale != 0 {
		errs = append(errs, fmt.Errorf("--token_scale = %d: want a power of two in 1..64", c.TokenScale))
	}
	if c.PrefillPerToken <= 0 || c.AttentionPer1K < 0 || c.TPOT < 0 || c.Heartbeat <= 0 {
		errs = append(errs, errors.New("--prefill_per_token and --heartbeat_interval must be positive, --attention_per_1k_context and --tpot not negative"))
	}
	return errors.Join(errs...)
}

// rankBlocks is the Device capacity of one rank of an engine of DP size
// dp, in trace blocks.
func (c traceCluster) rankBlocks(dp int) int { return c.CapacityTokens / dp / TraceBlockTokens }

// pooledBlocks is every rank's capacity together.
func (c traceCluster) pooledBlocks() int {
	n := 0
	for _, dp := range c.EngineDP {
		n += dp * c.rankBlocks(dp)
	}
	return n
}

// isTraceMode reports whether the arguments ask for a trace replay.
func isTraceMode(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "trace" {
			return true
		}
	}
	return false
}

func parseTraceFlags(args []string, stderr io.Writer) (traceOptions, error) {
	fs := flag.NewFlagSet("kvcar-bench --trace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := traceOptions{}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary")
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace to replay (cmd/kvcar-bench/testdata/traces/…)")
	fs.DurationVar(&o.Start, "trace_start", 0, "replay the trace's requests from this time of the trace on")
	fs.DurationVar(&o.Window, "trace_window", 10*time.Minute, "length of trace time replayed from --trace_start; 0: to the end")
	fs.Float64Var(&o.Speedup, "speedup", 10, "time compression: the replay runs this many times faster than the trace's clock")
	fs.IntVar(&o.Parallel, "parallel", 1, "runs at once, each with its own kvcar and engines")
	fs.IntVar(&o.Seeds, "seeds", 5, "runs of every policy, with seeds --seed, --seed+1, …")
	fs.Uint64Var(&o.Seed, "seed", 1, "first seed: the random policy's choices, the engines' order and the arrivals' sub-millisecond jitter")
	policies := fs.String("policies", defaultTracePolicies, "policies to replay: RANDOM, RR, LEAST_QUEUE (CAR λ=0), CAR@λ, LLMD, DYNAMO; CAR@λ and LEAST_QUEUE take accounting suffixes: +acct (--car_dispatch_accounting), +tok (the same, token weight 0.5), +pend (--car_pending_prefixes), e.g. CAR@0.5+acct+pend")
	fs.DurationVar(&o.PendingTimeout, "pending_prefix_timeout", 10*time.Second, "for +pend policies: how long a routed prompt's blocks count as pending, in trace time (divided by --speedup for kvcar)")
	engines := fs.String("engines", "1,1,1,1,1,1,1,2", "DP size of each emulated engine")
	fs.IntVar(&o.Cluster.CapacityTokens, "capacity_tokens", 1<<20, "Device KV capacity of each engine in tokens, split over its DP ranks")
	fs.DurationVar(&o.Cluster.PrefillPerToken, "prefill_per_token", 110*time.Microsecond, "an engine's prefill compute per uncached token (emulated)")
	fs.DurationVar(&o.Cluster.AttentionPer1K, "attention_per_1k_context", 2150*time.Nanosecond, "an engine's attention time per computed token per 1,024 context tokens (emulated)")
	fs.DurationVar(&o.Cluster.TPOT, "tpot", 30*time.Millisecond, "decode time per output token after the first, for end-to-end latency")
	fs.DurationVar(&o.Cluster.Heartbeat, "heartbeat_interval", 500*time.Millisecond, "engines' load report interval in trace time (xLLM's default)")
	fs.IntVar(&o.Cluster.TokenScale, "token_scale", 1, "emulated prompts are this many times shorter than the trace's: 512/token_scale token ids per hash id, blocks as long; 1 sends the trace's full lengths")
	fs.BoolVar(&o.readme, "readme", false, "print the README section: tables with spread, date, commit and the command")
	fs.BoolVar(&o.jsonOut, "json", false, "print every run's results as JSON")
	fs.StringVar(&o.jsonFile, "json_file", "", "also write every run's results as JSON to this file")
	fs.StringVar(&o.recordsCSV, "records_csv", "", "write every request's record of every run as CSV to this file")
	fs.DurationVar(&o.readyTimeout, "ready_timeout", 30*time.Second, "bound on kvcar's start-up until every stream is synchronised")
	fs.IntVar(&o.maxErrors, "max_errors", 10, "failed requests that end a run")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	if o.Trace == "" {
		errs = append(errs, errors.New("--trace: a trace file is required"))
	}
	for _, p := range strings.Split(*policies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		tp, err := parseTracePolicy(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("--policies: %w", err))
			continue
		}
		o.Policies = append(o.Policies, tp)
	}
	if len(o.Policies) == 0 {
		errs = append(errs, errors.New("--policies: none given"))
	}
	for _, f := range strings.Split(*engines, ",") {
		dp, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			errs = append(errs, fmt.Errorf("--engines: %w", err))
			continue
		}
		o.Cluster.EngineDP = append(o.Cluster.EngineDP, dp)
	}
	if o.Start < 0 || o.Window < 0 {
		errs = append(errs, errors.New("--trace_start and --trace_window must not be negative"))
	}
	if !(o.Speedup >= 1 && o.Speedup <= 1000) {
		errs = append(errs, fmt.Errorf("--speedup = %v: want 1..1000", o.Speedup))
	}
	if pt := float64(o.PendingTimeout) / max(o.Speedup, 1); pt < float64(time.Millisecond) || pt > float64(10*time.Minute) {
		errs = append(errs, fmt.Errorf("--pending_prefix_timeout = %v: divided by --speedup it must be in [1ms, 10m]", o.PendingTimeout))
	}
	if o.Parallel < 1 || o.Parallel > 16 {
		errs = append(errs, fmt.Errorf("--parallel = %d: want 1..16", o.Parallel))
	}
	if o.Seeds < 1 || o.Seeds > 100 {
		errs = append(errs, fmt.Errorf("--seeds = %d: want 1..100", o.Seeds))
	}
	if o.maxErrors < 1 {
		errs = append(errs, fmt.Errorf("--max_errors = %d: must be at least 1", o.maxErrors))
	}
	errs = append(errs, o.Cluster.validate())
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	// The command that reproduces the run names every setting, defaults
	// included, so that it still does once a default changes.
	cmd := []string{"bin/kvcar-bench", "--trace=" + shellQuote(o.Trace)}
	fs.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "trace", "kvcar", "json", "json_file", "records_csv", "ready_timeout", "max_errors":
		default:
			cmd = append(cmd, "--"+f.Name+"="+shellQuote(f.Value.String()))
		}
	})
	o.command = strings.Join(cmd, " ")
	return o, nil
}

// traceReport is everything one trace invocation measured.
type traceReport struct {
	Command string        `json:"command"`
	Options traceOptions  `json:"options"`
	Window  windowSummary `json:"window"`
	// Bound is one unbounded cache shared by every engine, seeing every
	// request: the most any router could save. Pooled is one LRU cache
	// with every engine's capacity together, seeing every request: what
	// perfect placement could approach.
	Bound  reuse `json:"shared_unbounded_bound"`
	Pooled reuse `json:"pooled_capacity_reference"`
	// RoutingHeaders says whether kvcar was given
	// --expose_routing_headers (binaries that have it).
	RoutingHeaders bool        `json:"routing_headers_flag"`
	Runs           []runResult `json:"runs"`
	Started        time.Time   `json:"started"`
	Elapsed        float64     `json:"elapsed_seconds"`
	// Revision is this program's commit, KVCarRevision the kvcar
	// binary's (its --version).
	Revision      string `json:"revision"`
	KVCarRevision string `json:"kvcar_revision"`
}

type windowSummary struct {
	Requests     int     `json:"requests"`
	FirstMs      int64   `json:"first_ms"`
	LastMs       int64   `json:"last_ms"`
	InputTokens  int64   `json:"input_tokens"`
	MeanInput    float64 `json:"mean_input"`
	MeanOutput   float64 `json:"mean_output"`
	TraceSeconds float64 `json:"trace_seconds"`
	WallSeconds  float64 `json:"wall_seconds_per_run"`
}

// runTrace is the trace mode's whole program.
func runTrace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseTraceFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	all, err := loadTrace(o.Trace)
	if err != nil {
		return err
	}
	reqs := traceWindow(all, o.Start.Milliseconds(), o.Window.Milliseconds())
	if len(reqs) == 0 {
		return fmt.Errorf("--trace_start %v, --trace_window %v: no request of %s arrives in that window", o.Start, o.Window, o.Trace)
	}
	rep := &traceReport{Command: o.command, Options: o, Started: time.Now().UTC(), Revision: devcluster.Revision()}
	rep.Window = summarizeWindow(reqs, o)
	rep.Bound = sharedReuse(reqs, 0)
	rep.Pooled = sharedReuse(reqs, o.Cluster.pooledBlocks())
	fmt.Fprintf(stderr, "trace: %d requests over %.0f s of trace (%.0f s a run at %gx), %.1f%% of input reusable by one unbounded cache, %.1f%% by one cache of the pooled capacity\n",
		rep.Window.Requests, rep.Window.TraceSeconds, rep.Window.WallSeconds, o.Speedup, rep.Bound.savedPct(), rep.Pooled.savedPct())

	if _, err := os.Stat(o.kvcar); err != nil {
		return fmt.Errorf("kvcar binary: %w (build it with make build, or pass --kvcar)", err)
	}
	if rep.RoutingHeaders, err = devcluster.HasFlag(ctx, o.kvcar, exposeHeadersFlag); err != nil {
		return err
	}
	if rep.KVCarRevision, err = devcluster.KVCarRevision(ctx, o.kvcar); err != nil {
		return err
	}
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return fmt.Errorf("embedded etcd: %w", err)
	}
	defer etcd.Close()
	var csv *recordsCSV
	if o.recordsCSV != "" {
		if csv, err = newRecordsCSV(o.recordsCSV); err != nil {
			return err
		}
		defer csv.close()
	}
	began := time.Now()
	runs, err := runAll(ctx, o, reqs, etcd, rep.RoutingHeaders, stderr)
	if err != nil {
		return err
	}
	for i := range runs {
		if csv != nil {
			if err := csv.write(runs[i]); err != nil {
				return err
			}
		}
		runs[i].records = nil
	}
	rep.Runs = runs
	rep.Elapsed = time.Since(began).Seconds()
	if o.jsonFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(o.jsonFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			return fmt.Errorf("--json_file: %w", err)
		}
	}
	switch {
	case o.jsonOut:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case o.readme:
		writeTraceReadme(stdout, rep)
	default:
		writeTraceTables(stdout, rep)
	}
	return nil
}

// exposeHeadersFlag makes kvcar return its X-Kvcar-* headers (the
// decision time among them) in binaries where they are opt-in.
const exposeHeadersFlag = "expose_routing_headers"

func summarizeWindow(reqs []traceRequest, o traceOptions) windowSummary {
	w := windowSummary{Requests: len(reqs), FirstMs: reqs[0].ArrivalMs, LastMs: reqs[len(reqs)-1].ArrivalMs}
	var out int64
	for i := range reqs {
		w.InputTokens += int64(reqs[i].Input)
		out += int64(reqs[i].Output)
	}
	w.MeanInput = float64(w.InputTokens) / float64(len(reqs))
	w.MeanOutput = float64(out) / float64(len(reqs))
	w.TraceSeconds = float64(w.LastMs-o.Start.Milliseconds()) / 1000
	w.WallSeconds = w.TraceSeconds / o.Speedup
	return w
}

// maxAttempts bounds how often a run the machine disturbed or failed is
// repeated.
const maxAttempts = 3

// runAll replays every policy with every seed, o.Parallel runs at once,
// seed by seed so that runs of one seed meet the same machine load, and
// returns the results in that order.
func runAll(ctx context.Context, o traceOptions, reqs []traceRequest, etcd *etcdembed.Server, headers bool, progress io.Writer) ([]runResult, error) {
	type job struct {
		i    int
		p    tracePolicy
		seed uint64
	}
	var jobs []job
	for s := range o.Seeds {
		for _, p := range o.Policies {
			jobs = append(jobs, job{len(jobs), p, o.Seed + uint64(s)})
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]runResult, len(jobs))
	errs := make([]error, len(jobs))
	next := make(chan job)
	var wg sync.WaitGroup
	// Parallel runs share progress; each line is one Write.
	progress = &lockedWriter{w: progress}
	say := func(format string, args ...any) { fmt.Fprintf(progress, format, args...) }
	for range min(o.Parallel, len(jobs)) {
		wg.Go(func() {
			for j := range next {
				var res runResult
				var err error
				for attempt := range maxAttempts {
					// Each attempt is a run of its own: fresh engines, kvcar
					// and etcd namespace.
					res, err = replayOnce(ctx, o, reqs, etcd, j.p, j.seed, (j.i+1)*maxAttempts+attempt, headers, progress)
					res.Attempts = attempt + 1
					if ctx.Err() != nil || attempt == maxAttempts-1 {
						break
					}
					// A run fails when requests fail, which on this
					// harness means the machine stalled long enough for
					// heartbeats or leases to lapse; it is repeated like a
					// disturbed one.
					if err != nil {
						say("%s seed %d: %v; repeating the run\n", j.p.Name, j.seed, firstLine(err))
						continue
					}
					if !res.disturbed(o.Speedup) {
						break
					}
					say("%s seed %d: requests left up to %.0f ms late (p99) against the trace's clock, %.1f s of trace time: the machine stalled; repeating the run\n",
						j.p.Name, j.seed, res.LaunchLagP99Ms, res.LaunchLagP99Ms*o.Speedup/1000)
				}
				if err != nil {
					errs[j.i] = fmt.Errorf("%s seed %d: %w", j.p.Name, j.seed, err)
					cancel()
					continue
				}
				results[j.i] = res
				say("%s seed %d: %d requests in %.1f s, saved %.1f%%, TTFT mean %.2f s p99 %.2f s (engines measured %.2f s), launch lag p99 %.1f ms, CPU kvcar %.1f s + benchmark %.1f s\n",
					j.p.Name, j.seed, res.Requests, res.WallSeconds, res.SavedPct, res.TTFT.Mean, res.TTFT.P99, res.EngineTTFTMean,
					res.LaunchLagP99Ms, res.KvcarCPUSeconds, res.OwnCPUSeconds)
			}
		})
	}
	for _, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		next <- j
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return results, nil
}

// firstLine is an error's first line: the log tail that follows stays
// for the final error.
func firstLine(err error) string {
	line, _, _ := strings.Cut(err.Error(), "\n")
	return line
}

// lockedWriter serialises the Writes of goroutines sharing w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
