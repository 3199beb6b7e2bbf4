// Command kvcar-bench measures routing quality: what kvcar's policies
// do to the prefill work and the time to first token of a workload,
// next to bounds and other policies. It has two modes.
//
// # Trace replay (--trace)
//
// kvcar-bench --trace=FILE replays a Mooncake JSONL trace (timestamp,
// input_length, output_length and hash_ids per 512-token prefix block):
// each hash id becomes deterministic token ids derived from the id alone,
// and each request is sent when the trace's clock, divided by --speedup,
// says, to the real kvcar binary (or, for the benchmark's own policies,
// straight to the engine they pick) in front of emulated engines with a
// finite LRU KV capacity and a prefill cost model (enginesim.CostModel),
// each DP rank a FIFO server of prefills. Policies: RANDOM, RR,
// LEAST_QUEUE (kvcar's CAR with λ = 0), CAR@λ, and re-implementations of
// llm-d's precise-prefix scorer (LLMD) and Dynamo's KV router cost
// (DYNAMO), fed by kvcar's query API and registry. Next to them: the
// most any router could save (one unbounded cache shared by all, seeing
// every request) and a pooled-capacity reference (one LRU cache of every
// engine's capacity, seeing every request). TTFT is computed in trace
// time from the engines' reported ranks and hits with the same cost
// model, so wall-clock delays (the routing decision's HTTP round trips
// among them) count in no policy's TTFT; the engines' own wall-clock
// measure is reported beside it as a check. Every policy runs --seeds
// times; a seed sets the engines' order, the arrivals' jitter within the
// trace's millisecond and the random choices. --readme prints the README
// section.
//
// # Synthetic workload
//
// Without --trace, the workload (seeded, every knob a flag) has S shared
// system prompts and M multi-turn sessions. A session picks a system
// prompt, then each turn sends the whole history (system prompt, earlier
// user turns and answers) plus a new user part; the answer's tokens
// (max_tokens of the request, random ids from the seed, since the
// emulated engine's output is filler) join the history, so each prompt
// extends the previous one. A turn that would pass --max_prompt_tokens
// starts a new conversation. Sessions are interleaved at random; a
// session sends its next turn only once the previous one is answered.
// Load is closed-loop with --concurrency clients, or open-loop Poisson
// arrivals at --rate. Prompts go as token-id arrays.
//
// Every policy runs on a fresh set of emulated engines (enginesim: empty
// caches, a queueing cost model scaled by --time_scale) with the same
// workload. RR and CAR run kvcar as a child process, discovering the
// engines through an embedded etcd (one namespace per run), with
// --load_balance_policy set; requests go to kvcar's /v1/completions.
// LONGEST_PREFIX routes by itself, straight to the engines: per request
// the engine whose cache holds the longest reusable prefix (Device +
// Host-only tokens) at that moment, fewest waiting then fewest running
// requests breaking ties. It is a greedy policy with perfect knowledge
// of the caches, not a bound: it ignores load and what its choice does
// to later requests, and CAR can beat it. The engine, not the router,
// picks the DP rank of a multi-DP instance (its least loaded), so
// LONGEST_PREFIX values such an instance by its worst rank, the reuse it
// gets whatever the engine picks; LONGEST_PREFIX_MAX values it by its
// best rank, which the engine's choice may not deliver. The bound is the
// reuse of one unbounded cache serving every request in order.
//
// Saved tokens are the engines' own device_hit_tokens + host_hit_tokens
// for each request: from the answer's kvcar_engine object when the
// engine's HTTP answer comes back as it is (LONGEST_PREFIX, peers that
// route by themselves), else from the record the engine keeps under the
// answer's id (kvcar sends requests to the emulated xLLM engines over
// baidu_std and writes the answer from their output); emulated TTFT is
// (queue_ms + prefill_ms) / time_scale. The routing decision time is
// kvcar's X-Kvcar-Decision-Us header (the time inside its policy; kvcar
// gets --expose_routing_headers when it has that flag), and for
// LONGEST_PREFIX its own probe and pick; the client overhead is the
// round trip minus the engine's queue, prefill and decode time. Before
// each request the benchmark also reads every rank's reusable prefix
// from the engines, so the report can say how much of what was available
// each policy got and where the rest went.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/etcdembed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvcar-bench:", err)
		os.Exit(1)
	}
}

// Policy names: kvcar's, and the benchmark's own greedy ones.
const (
	policyRR         = "RR"
	policyCAR        = "CAR"
	policyLongest    = "LONGEST_PREFIX"
	policyLongestMax = "LONGEST_PREFIX_MAX"
)

type options struct {
	kvcar        string
	port         int
	policies     []string
	jsonOut      bool
	workload     workloadConfig
	cluster      clusterConfig
	concurrency  int
	rate         float64
	runTimeout   time.Duration
	readyTimeout time.Duration
	maxErrors    int
	recordsCSV   string
	// kvcarExtra are kvcar flags passed through when set.
	kvcarExtra []string
	command    string
}

// report is everything one invocation measured.
type report struct {
	Command      string         `json:"command"`
	Workload     reportWorkload `json:"workload"`
	Cluster      clusterConfig  `json:"cluster"`
	Load         reportLoad     `json:"load"`
	Results      []result       `json:"results"`
	Ratios       ratios         `json:"ratios"`
	DecisionNote string         `json:"-"`
}

type reportWorkload struct {
	workloadConfig
	SystemTokens string `json:"system_tokens"`
	UserTokens   string `json:"user_tokens"`
	AnswerTokens string `json:"answer_tokens"`
	PromptTokens int64  `json:"prompt_tokens"`
	// IdealReuseTokens is what one unbounded cache would reuse serving
	// the requests in order.
	IdealReuseTokens int64 `json:"ideal_reuse_tokens"`
}

type reportLoad struct {
	Mode        string  `json:"mode"`
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("kvcar-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := options{
		workload: workloadConfig{
			SystemTokens: tokenRange{1024, 2048}, UserTokens: tokenRange{64, 512}, AnswerTokens: tokenRange{16, 128},
		},
	}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary (RR and CAR)")
	fs.IntVar(&o.port, "port", 0, "HTTP port for kvcar (0: a free one per run)")
	policies := fs.String("policies", "RR,CAR,LONGEST_PREFIX", "policies to measure, in order: RR, CAR, SLO_AWARE (through kvcar), LONGEST_PREFIX, LONGEST_PREFIX_MAX")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON instead of Markdown")
	fs.Uint64Var(&o.workload.Seed, "seed", 1, "workload seed: prompts, session order, arrivals")

	fs.IntVar(&o.workload.Systems, "systems", 4, "shared system prompts")
	fs.Var(&o.workload.SystemTokens, "system_tokens", "system prompt length, tokens (lo-hi)")
	fs.IntVar(&o.workload.Sessions, "sessions", 32, "multi-turn sessions")
	fs.Var(&o.workload.UserTokens, "user_tokens", "new user tokens per turn (lo-hi)")
	fs.Var(&o.workload.AnswerTokens, "answer_tokens", "answer tokens per turn, the request's max_tokens (lo-hi)")
	fs.IntVar(&o.workload.Requests, "requests", 400, "requests in total")
	fs.IntVar(&o.workload.MaxPromptTokens, "max_prompt_tokens", 8192, "a turn longer than this starts a new conversation")
	fs.IntVar(&o.concurrency, "concurrency", 8, "closed loop: concurrent clients (ignored with --rate)")
	fs.Float64Var(&o.rate, "rate", 0, "open loop: Poisson arrivals per second (wall); 0 means closed loop")

	engines := fs.String("engines", "1,1,1,2", "DP size of each emulated engine")
	fs.IntVar(&o.cluster.BlockSize, "block_size", 16, "tokens per KV block, engines and kvcar's discovery.block_size")
	fs.IntVar(&o.cluster.DeviceBlocks, "device_blocks", 1024, "Device blocks per DP rank")
	fs.IntVar(&o.cluster.HostBlocks, "host_blocks", 1024, "Host blocks per DP rank of the first --host_engines engines")
	fs.IntVar(&o.cluster.HostEngines, "host_engines", 1, "engines with a Host tier, from the first")
	fs.IntVar(&o.cluster.BatchSlots, "batch_slots", 4, "requests each DP rank runs at once")
	fs.Float64Var(&o.cluster.TimeScale, "time_scale", 0.05, "wall time per emulated time")
	fs.DurationVar(&o.cluster.PrefillPerToken, "prefill_per_token", 100*time.Microsecond, "emulated compute per uncached prompt token")
	fs.DurationVar(&o.cluster.DecodePerToken, "decode_per_token", 20*time.Millisecond, "emulated time per output token after the first")
	fs.DurationVar(&o.cluster.Heartbeat, "heartbeat_interval", 100*time.Millisecond, "engines' load report interval (wall)")

	lambda := fs.String("car_prefill_lambda", "", "passed to kvcar when set (kvcar's default otherwise)")
	weight := fs.String("car_host_hit_weight", "", "passed to kvcar when set (kvcar's default otherwise)")
	fs.DurationVar(&o.runTimeout, "run_timeout", 3*time.Minute, "bound on each policy's request phase")
	fs.DurationVar(&o.readyTimeout, "ready_timeout", 30*time.Second, "bound on kvcar's start-up until every stream is synchronised")
	fs.IntVar(&o.maxErrors, "max_errors", 10, "failed requests that end a policy's run")
	fs.StringVar(&o.recordsCSV, "records_csv", "", "write every request's record as CSV to this file (all policies)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	for _, p := range strings.Split(*policies, ",") {
		switch p = strings.TrimSpace(p); p {
		case policyRR, policyCAR, "SLO_AWARE", policyLongest, policyLongestMax:
			o.policies = append(o.policies, p)
		case "ORACLE", "ORACLE_MAX":
			errs = append(errs, fmt.Errorf("--policies: %s is now %s: it routes greedily by the engines' true caches and is not an upper bound",
				p, strings.Replace(p, "ORACLE", policyLongest, 1)))
		case "":
		default:
			errs = append(errs, fmt.Errorf("--policies: unknown policy %q", p))
		}
	}
	if len(o.policies) == 0 {
		errs = append(errs, errors.New("--policies: none given"))
	}
	for _, f := range strings.Split(*engines, ",") {
		dp, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			errs = append(errs, fmt.Errorf("--engines: %w", err))
			continue
		}
		o.cluster.EngineDP = append(o.cluster.EngineDP, dp)
	}
	if *lambda != "" {
		o.kvcarExtra = append(o.kvcarExtra, "--car_prefill_lambda="+*lambda)
	}
	if *weight != "" {
		o.kvcarExtra = append(o.kvcarExtra, "--car_host_hit_weight="+*weight)
	}
	if o.rate < 0 || o.rate == 0 && o.concurrency < 1 {
		errs = append(errs, fmt.Errorf("--rate %v, --concurrency %d: need a positive rate or at least one client", o.rate, o.concurrency))
	}
	if o.maxErrors < 1 {
		errs = append(errs, fmt.Errorf("--max_errors = %d: must be at least 1", o.maxErrors))
	}
	errs = append(errs, o.workload.validate(), o.cluster.validate())
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	// The command that reproduces this run: the flags given, and the
	// seed even when it is the default.
	cmd := []string{"bin/kvcar-bench"}
	seedSet := false
	fs.Visit(func(f *flag.Flag) {
		seedSet = seedSet || f.Name == "seed"
		cmd = append(cmd, "--"+f.Name+"="+shellQuote(f.Value.String()))
	})
	if !seedSet {
		cmd = append(cmd, "--seed="+strconv.FormatUint(o.workload.Seed, 10))
	}
	o.command = strings.Join(cmd, " ")
	return o, nil
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,/:=+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if isTraceMode(args) {
		return runTrace(ctx, args, stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	wl, err := generate(o.workload)
	if err != nil {
		return err
	}
	rep, err := bench(ctx, o, wl, stderr)
	if err != nil {
		return err
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	writeMarkdown(stdout, rep)
	return nil
}

// bench measures every policy on fresh engines and reports.
func bench(ctx context.Context, o options, wl *workload, progress io.Writer) (*report, error) {
	rep := &report{
		Command: o.command,
		Workload: reportWorkload{
			workloadConfig: o.workload, PromptTokens: wl.promptTokens(), IdealReuseTokens: wl.idealReuse(o.cluster.BlockSize),
			SystemTokens: o.workload.SystemTokens.String(), UserTokens: o.workload.UserTokens.String(),
			AnswerTokens: o.workload.AnswerTokens.String(),
		},
		Cluster: o.cluster,
		Load:    reportLoad{Mode: "closed", Concurrency: o.concurrency},
	}
	if o.rate > 0 {
		rep.Load = reportLoad{Mode: "open", Rate: o.rate}
	}
	fmt.Fprintf(progress, "workload: %d requests, %d sessions, %d system prompts, %d prompt tokens, %d (%.1f%%) reusable by one unbounded cache; %s loop\n",
		len(wl.requests), o.workload.Sessions, o.workload.Systems, rep.Workload.PromptTokens, rep.Workload.IdealReuseTokens,
		pct(rep.Workload.IdealReuseTokens, rep.Workload.PromptTokens), rep.Load.Mode)

	var etcd *etcdembed.Server
	for _, p := range o.policies {
		if !isGreedy(p) && etcd == nil {
			// kvcar's decision-time header is opt-in where the flag
			// exists.
			headers, err := devcluster.HasFlag(ctx, o.kvcar, exposeHeadersFlag)
			if err != nil {
				return nil, fmt.Errorf("%w (build it with make build, or pass --kvcar)", err)
			}
			if headers {
				o.kvcarExtra = append(o.kvcarExtra, "--"+exposeHeadersFlag)
			}
			if etcd, err = etcdembed.Start(ctx, etcdembed.Options{}); err != nil {
				return nil, fmt.Errorf("embedded etcd: %w", err)
			}
			defer etcd.Close()
		}
	}
	hc := newHTTPClient(o)
	defer hc.CloseIdleConnections()
	var trace *traceWriter
	if o.recordsCSV != "" {
		var err error
		if trace, err = newTraceWriter(o.recordsCSV); err != nil {
			return nil, err
		}
		defer trace.close()
	}
	for i, p := range o.policies {
		r, recs, names, err := runPolicy(ctx, o, wl, etcd, hc, i, p, progress)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if trace != nil {
			if err := trace.write(p, wl, recs, names); err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(progress, "%s: %d requests in %.1fs, %.1f%% of prompt tokens saved\n", p, r.Requests, r.WallSeconds, r.SavedPct)
		rep.Results = append(rep.Results, r)
	}
	rep.Ratios = computeRatios(rep.Results)
	rep.DecisionNote = "Routing decision: kvcar's " + decisionMicrosHeader + " header (the time inside its policy) for the policies kvcar runs; " +
		"for LONGEST_PREFIX its own read of every rank's cache (in parallel, each through the rank's goroutine) plus the pick. " +
		"Client overhead: HTTP round trip minus the engine's reported queue, prefill and decode time; it includes JSON, the emulator's own " +
		"cache operation and, through kvcar, the extra hop. Emulated TTFT is (queue_ms + prefill_ms) / time_scale. " +
		"LONGEST_PREFIX values a multi-DP instance by its worst rank (the engine picks the rank), LONGEST_PREFIX_MAX by its best; " +
		"both are greedy policies that read the true caches, not bounds."
	return rep, nil
}

func isGreedy(p string) bool { return p == policyLongest || p == policyLongestMax }

func newHTTPClient(o options) *http.Client {
	conns := max(o.concurrency, o.workload.Sessions) + 4
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        4 * conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// runPolicy measures one policy on fresh engines.
// It returns the records and the engines' names too, for the trace.
func runPolicy(ctx context.Context, o options, wl *workload, etcd *etcdembed.Server, hc *http.Client, i int, policy string, progress io.Writer) (result, []record, []string, error) {
	var endpoints []string
	namespace := fmt.Sprintf("kvcar-bench-%d-%s", i, strings.ToLower(policy))
	if !isGreedy(policy) {
		endpoints = etcd.Endpoints()
	}
	engines, err := startEngines(o.cluster, endpoints, namespace)
	if err != nil {
		return result{}, nil, nil, err
	}
	names := make([]string, len(engines))
	for i, e := range engines {
		names[i] = e.Name()
	}
	defer engines.Close()

	var send sender
	if isGreedy(policy) {
		lp := &longestPrefix{engines: engines, rule: rankMin}
		if policy == policyLongestMax {
			lp.rule = rankMax
		}
		send = lp.sender(hc)
	} else {
		dir, err := os.MkdirTemp("", "kvcar-bench-")
		if err != nil {
			return result{}, nil, nil, fmt.Errorf("temp dir: %w", err)
		}
		defer os.RemoveAll(dir)
		fmt.Fprintf(progress, "%s: starting kvcar and %d engines\n", policy, len(engines))
		kv, logPath, err := startKvcar(o.cluster, kvcarArgs{
			Binary: o.kvcar, Port: o.port, Etcd: endpoints, Namespace: namespace, Dir: dir, Policy: policy, Extra: o.kvcarExtra,
		})
		if err != nil {
			return result{}, nil, nil, err
		}
		defer func() {
			if err := kv.Stop(); err != nil {
				fmt.Fprintf(progress, "%s: %v\n", policy, err)
			}
		}()
		if err := waitReady(ctx, hc, kv, logPath, engines, o.readyTimeout); err != nil {
			return result{}, nil, nil, err
		}
		send = viaKvcar(hc, kv.URL(), engines)
	}
	for _, e := range engines {
		e.ResetStats()
	}
	mode := loadMode{Concurrency: o.concurrency, Rate: o.rate, Seed: o.workload.Seed, Timeout: o.runTimeout, MaxErrors: o.maxErrors}
	recs, wall, err := drive(ctx, wl, mode, send)
	if err != nil {
		return result{}, nil, nil, err
	}
	return summarize(policy, recs, wall, engines, o.cluster.HostEngines), recs, names, nil
}
