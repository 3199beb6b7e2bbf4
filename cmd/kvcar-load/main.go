// Command kvcar-load measures kvcar's request path: it starts an embedded
// etcd, trivial engines that answer every completion at once (registered
// as vLLM servers, so kvcar relays to them over HTTP) and the kvcar
// binary, and drives kvcar closed-loop at each concurrency with prompts
// of random token ids, for each routing policy, next to the same load
// sent to the engines directly. Per cell it reports requests per second,
// p50/p99 latency, the p50 kvcar adds, errors by status and kvcar's CPU
// time per request, read from /proc over the measured window.
package main

import (
	"context"
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

	"github.com/kvcar/kvcar/internal/cpuidle"
	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/server"
	"github.com/kvcar/kvcar/internal/sysmon"
)

type options struct {
	kvcar      string
	engines    int
	conc       []int
	ids        []int
	policies   []string
	duration   time.Duration
	warmup     time.Duration
	prompts    int
	seed       uint64
	engineIdle time.Duration
	backend    string
	readme     bool
	profileDir string
	kvcarArgs  []string
	command    string
	bound      bool
	// maxTokens and stream are every request's max_tokens and stream:
	// the engines answer with that many tokens, streamed as SSE events
	// one token each when stream is set.
	maxTokens int
	stream    bool
	// kvcarCPUs (kvcar's and the relay bound's) and driverCPUs (the
	// clients', the engines' and etcd's), when set, keep the two sides
	// on CPUs of their own.
	kvcarCPUs, driverCPUs devcluster.CPUList
}

func main() {
	if engines := os.Getenv(relayEnv); engines != "" {
		// The bound runs under the runtime setting kvcar runs under, so
		// that what kvcar adds over it is kvcar's own cost. If the
		// restart fails it runs on, saying so, as kvcar does.
		if err := sysmon.Reexec(os.Args, os.Environ()); err != nil {
			fmt.Fprintln(os.Stderr, "kvcar-load relay:", err)
		}
		if err := runRelay(engines); err != nil {
			fmt.Fprintln(os.Stderr, "kvcar-load:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o, err := parse(os.Args[1:])
	if err == nil && len(o.driverCPUs) > 0 {
		err = devcluster.PinSelf(o.driverCPUs)
	}
	if err == nil {
		var rep *report
		if rep, err = run(ctx, o, os.Stderr); err == nil {
			rep.write(os.Stdout, o.readme)
		}
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "kvcar-load:", err)
		os.Exit(1)
	}
}

func parse(args []string) (options, error) {
	fs := flag.NewFlagSet("kvcar-load", flag.ContinueOnError)
	o := options{command: "kvcar-load " + strings.Join(args, " ")}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary")
	fs.IntVar(&o.engines, "engines", 2, "trivial engines")
	conc := fs.String("concurrency", "1,16,64", "closed-loop clients, one cell each")
	ids := fs.String("prompt_ids", "2048,16384", "token ids per prompt, one cell each")
	pol := fs.String("policies", "RR,CAR", "kvcar routing policies, one kvcar run each")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured window of each cell")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each cell's window")
	fs.IntVar(&o.prompts, "prompts", 256, "distinct prompts of each size, sent in turn")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the random token ids")
	fs.DurationVar(&o.engineIdle, "engine_idle_timeout", 5*time.Second, "the engines' keep-alive idle timeout (uvicorn's default)")
	fs.StringVar(&o.backend, "backend", backendVLLM, "engines: vllm (trivial OpenAI servers registered as vLLM, relayed over HTTP) or xllm (emulated xLLM engines, dispatched over baidu_std)")
	fs.BoolVar(&o.readme, "readme", false, "print the README section: the table with date, commit, command and load average")
	fs.StringVar(&o.profileDir, "profile_dir", "", "save a CPU profile of kvcar over each cell's window here (<policy>-<ids>-c<clients>.pprof)")
	fs.IntVar(&o.maxTokens, "max_tokens", 1, "output tokens of every request, the engines' answer")
	fs.BoolVar(&o.stream, "stream", false, "requests stream their output: one SSE event per token, then data: [DONE]")
	fs.BoolVar(&o.bound, "bound", true, "measure each cell also through the relay bound: a minimal relay (Content-Length framing, kept engine connections, no parsing or routing) run as its own process")
	extra := fs.String("kvcar_args", "--log_level=warn", "further kvcar flags, space separated")
	fs.Var(&o.kvcarCPUs, "kvcar_cpus", "CPUs kvcar and the relay bound run on, as taskset lists them (\"1\", \"2-3\"); empty: any")
	fs.Var(&o.driverCPUs, "driver_cpus", "CPUs this driver (clients, engines, etcd) runs on; empty: any")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var errs []error
	var err error
	if o.conc, err = ints("--concurrency", *conc, 1, 1024); err != nil {
		errs = append(errs, err)
	}
	if o.ids, err = ints("--prompt_ids", *ids, 1, 65536); err != nil {
		errs = append(errs, err)
	}
	for _, p := range strings.Split(*pol, ",") {
		switch p = strings.TrimSpace(p); p {
		case "RR", "CAR", "SLO_AWARE":
			o.policies = append(o.policies, p)
		default:
			errs = append(errs, fmt.Errorf("--policies: %q is not RR, CAR or SLO_AWARE", p))
		}
	}
	if o.engines < 1 || o.engines > 64 {
		errs = append(errs, fmt.Errorf("--engines = %d: must be in [1, 64]", o.engines))
	}
	if o.duration <= 0 || o.warmup < 0 {
		errs = append(errs, errors.New("--duration must be positive and --warmup not negative"))
	}
	if o.maxTokens < 1 || o.maxTokens > 4096 {
		errs = append(errs, fmt.Errorf("--max_tokens = %d: must be in [1, 4096]", o.maxTokens))
	}
	if o.stream && o.bound {
		errs = append(errs, errors.New("--stream needs --bound=false: the relay bound frames answers by Content-Length"))
	}
	if o.prompts < 1 || o.prompts > 4096 {
		errs = append(errs, fmt.Errorf("--prompts = %d: must be in [1, 4096]", o.prompts))
	}
	if o.backend != backendVLLM && o.backend != backendXLLM {
		errs = append(errs, fmt.Errorf("--backend = %q: must be %s or %s", o.backend, backendVLLM, backendXLLM))
	}
	if o.engineIdle < 0 {
		errs = append(errs, errors.New("--engine_idle_timeout must not be negative"))
	}
	o.kvcarArgs = strings.Fields(*extra)
	return o, errors.Join(errs...)
}

func ints(flag, s string, lo, hi int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%s: %q is not a number in [%d, %d]", flag, f, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

// cell is one measured load: a target (direct or a policy), a prompt
// size and a concurrency.
type cell struct {
	target      string // "direct", boundTarget or the policy
	ids, conc   int
	requests    int
	window      time.Duration
	p50, p99    time.Duration
	byStatus    map[int]int
	connErr     int
	cut         int           // 200 answers that ended early (see tally)
	kvcarCPU    time.Duration // of kvcar or the relay, over the window; 0 for direct
	load1       float64       // load average at the window's end
	loadAtStart float64
	// direct is the same load sent to the engines right before.
	direct *cell
}

// boundTarget names the relay bound's cells.
const boundTarget = "relay bound"

// measured is the process whose CPU time a cell reads: kvcar or the
// relay bound; pid 0 for direct cells. profileURL, when set, is kvcar's
// internal listener.
type measured struct {
	pid        int
	profileURL string
}

func (c *cell) rate() float64 { return float64(c.requests) / c.window.Seconds() }

func (c *cell) errors() int {
	n := c.connErr + c.cut
	for _, v := range c.byStatus {
		n += v
	}
	return n
}

// cpuPerRequest is kvcar's CPU time per answered or failed request.
func (c *cell) cpuPerRequest() time.Duration {
	n := c.requests + c.errors()
	if n == 0 {
		return 0
	}
	return c.kvcarCPU / time.Duration(n)
}

type report struct {
	started  time.Time
	revision devcluster.Revisions // of the kvcar binary and of this program
	idle     cpuidle.Setting      // how the machine's idle CPUs waited, read at the start
	command  string
	opts     options
	cells    []*cell
	elapsed  time.Duration
}

// run measures every cell of kvcar with each policy, a kvcar process per
// policy, each right after the same load sent to the engines directly.
// Progress goes to log.
func run(ctx context.Context, o options, log io.Writer) (_ *report, err error) {
	kvcarRev, err := devcluster.KVCarRevision(ctx, o.kvcar)
	if err != nil {
		return nil, err
	}
	rep := &report{started: time.Now().UTC(), command: o.command, opts: o,
		revision: devcluster.Revisions{KVCar: kvcarRev, Driver: devcluster.Revision()}, idle: cpuidle.Read("/")}
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return nil, err
	}
	defer etcd.Close()
	// The engines report their load to kvcar's internal listener, which
	// keeps its port across the kvcar processes of the run.
	internalPort, err := devcluster.FreePort()
	if err != nil {
		return nil, err
	}
	internal := "http://127.0.0.1:" + strconv.Itoa(internalPort)
	start := startTrivialFleet
	if o.backend == backendXLLM {
		start = startXLLMFleet
	}
	engines, err := start(etcd.Endpoints(), internal, o)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, engines.close()) }()
	direct := engines.urls
	var relayURLs []string
	boundPid := 0
	if o.bound {
		var addrs []string
		for _, u := range engines.urls {
			addrs = append(addrs, strings.TrimSuffix(strings.TrimPrefix(u, "http://"), server.CompletionsPath))
		}
		relay, rerr := startRelay(ctx, addrs, o.kvcarCPUs)
		if rerr != nil {
			return nil, rerr
		}
		defer func() { err = errors.Join(err, relay.stop()) }()
		relayURLs = []string{"http://" + relay.addr + server.CompletionsPath}
		boundPid = relay.pid()
	}
	bodies := map[int]*prompts{}
	for _, n := range o.ids {
		bodies[n] = newPrompts(o.prompts, n, o.seed, o.maxTokens, o.stream)
	}
	// Each kvcar cell follows the same load sent directly, so that the
	// two see the same machine: its cores are shared with other work.
	measure := func(policy string, kv *devcluster.KVCar) error {
		for _, n := range o.ids {
			for _, c := range o.conc {
				d, err := measureCell(ctx, "direct", direct, bodies[n], n, c, measured{}, o)
				if err != nil {
					return err
				}
				var b *cell
				if relayURLs != nil {
					if b, err = measureCell(ctx, boundTarget, relayURLs, bodies[n], n, c, measured{pid: boundPid}, o); err != nil {
						return err
					}
					b.direct = d
					fmt.Fprintf(log, "%s %d ids c=%d: %.0f req/s p50 %v p99 %v errors %d CPU/req %v load %.2f\n",
						boundTarget, n, c, b.rate(), b.p50, b.p99, b.errors(), b.cpuPerRequest(), b.load1)
				}
				ce, err := measureCell(ctx, policy, []string{kv.URL() + server.CompletionsPath}, bodies[n], n, c,
					measured{pid: kv.Pid(), profileURL: kv.InternalURL()}, o)
				if err != nil {
					return err
				}
				ce.direct = d
				if b != nil {
					rep.cells = append(rep.cells, b)
				}
				fmt.Fprintf(log, "%s %d ids c=%d: %.0f req/s (direct %.0f) p50 %v (direct %v) p99 %v errors %d kvcar CPU/req %v load %.2f\n",
					policy, n, c, ce.rate(), d.rate(), ce.p50, d.p50, ce.p99, ce.errors(), ce.cpuPerRequest(), ce.load1)
				rep.cells = append(rep.cells, ce)
			}
		}
		return nil
	}
	dir, err := os.MkdirTemp("", "kvcar-load-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for _, policy := range o.policies {
		if err := func() (err error) {
			kv, err := startKVCar(ctx, o, engines, etcd.Endpoints(), internalPort, dir, policy)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, kv.Stop()) }()
			return measure(policy, kv)
		}(); err != nil {
			return nil, err
		}
	}
	rep.elapsed = time.Since(rep.started)
	return rep, nil
}

// startKVCar starts kvcar with policy and waits until it sees every
// engine with a load report, which CAR and SLO_AWARE need to schedule it.
func startKVCar(ctx context.Context, o options, engines *fleet, etcd []string, internalPort int, dir, policy string) (*devcluster.KVCar, error) {
	cfgPath, err := devcluster.WriteConfig(dir, devcluster.DiscoveryConfig(128, 200*time.Millisecond))
	if err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(dir, "kvcar-"+policy+".log"))
	if err != nil {
		return nil, fmt.Errorf("kvcar log: %w", err)
	}
	defer out.Close()
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: o.kvcar, InternalPort: internalPort, Etcd: etcd, ConfigFile: cfgPath,
		Args:   append([]string{"--load_balance_policy=" + policy}, o.kvcarArgs...),
		Stdout: out, Stderr: out, CPUs: o.kvcarCPUs,
	})
	if err != nil {
		return nil, fmt.Errorf("%w (build it with make build, or pass --kvcar)", err)
	}
	if err := engines.synced(ctx, kv); err != nil {
		return nil, errors.Join(err, kv.Stop(), kvcarLog(dir, policy))
	}
	hc := newClient(1)
	defer hc.CloseIdleConnections()
	if err := kv.WaitLoads(ctx, hc, o.engines, 30*time.Second); err != nil {
		return nil, errors.Join(fmt.Errorf("kvcar's load reports: %w", err), kv.Stop())
	}
	return kv, nil
}

// kvcarLog returns kvcar's output as an error, for a kvcar that did not
// come up.
func kvcarLog(dir, policy string) error {
	b, err := os.ReadFile(filepath.Join(dir, "kvcar-"+policy+".log"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return fmt.Errorf("kvcar output:\n%s", b[max(0, len(b)-4096):])
}

func measureCell(ctx context.Context, target string, urls []string, ps *prompts, ids, conc int, m measured, o options) (*cell, error) {
	hc := newClient(conc)
	defer hc.CloseIdleConnections()
	ce := &cell{target: target, ids: ids, conc: conc}
	var cpu0, cpu1 time.Duration
	var cpuErr error
	var profiled chan error
	ce.loadAtStart = loadAverage()
	t := closedLoop(ctx, hc, urls, ps, conc, o.warmup, o.duration, func(start bool) {
		if m.pid == 0 {
			return
		}
		if start && o.profileDir != "" && m.profileURL != "" {
			profiled = make(chan error, 1)
			name := filepath.Join(o.profileDir, fmt.Sprintf("%s-%d-c%d.pprof", target, ids, conc))
			go func() { profiled <- saveProfile(ctx, m.profileURL, name, o.duration) }()
		}
		c, err := devcluster.CPUTime(m.pid)
		cpuErr = errors.Join(cpuErr, err)
		if start {
			cpu0 = c
		} else {
			cpu1 = c
		}
	})
	if profiled != nil {
		cpuErr = errors.Join(cpuErr, <-profiled)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cpuErr != nil {
		return nil, cpuErr
	}
	ce.load1 = loadAverage()
	ce.window, ce.requests, ce.byStatus, ce.connErr, ce.cut = o.duration, len(t.lat), t.byStatus, t.connErr, t.cut
	ce.p50, ce.p99 = quantile(t.lat, 0.5), quantile(t.lat, 0.99)
	ce.kvcarCPU = cpu1 - cpu0
	return ce, nil
}

// saveProfile writes a CPU profile of kvcar over d to path.
func saveProfile(ctx context.Context, internalURL, path string, d time.Duration) error {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, internalURL+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), nil)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	hc := &http.Client{Timeout: d + 30*time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}

// loadAverage is the 1-minute load average, -1 when unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}
