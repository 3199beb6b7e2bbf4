// Command kvcar is a KV-cache-aware router for xLLM engines: it keeps a
// prefix directory fed by the engines' KV events, routes OpenAI requests
// on its public port, and takes heartbeats and serves prefix-hit queries
// and operator routes on its internal listener.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/buildinfo"
	"github.com/kvcar/kvcar/internal/cmalloc"
	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/cpuidle"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/lb"
	"github.com/kvcar/kvcar/internal/server"
	"github.com/kvcar/kvcar/internal/sysmon"
	"github.com/kvcar/kvcar/internal/tokenizer"
	"github.com/kvcar/kvcar/internal/xllmrpc"
)

func main() {
	// --version answers on stdout before anything starts; any flag error
	// is left to run, which reports it.
	if f, err := parseFlags(os.Args[1:], io.Discard); err == nil && f.version {
		fmt.Println(buildinfo.VersionLine("kvcar"))
		return
	}
	// Nothing has started yet, so the restart loses nothing. If it
	// fails, kvcar runs on at the runtime's default pace: the error goes
	// to stderr as main's other errors do (the logger is not made yet),
	// and run logs the pace.
	if err := sysmon.Reexec(os.Args, os.Environ()); err != nil {
		fmt.Fprintln(os.Stderr, "kvcar:", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "kvcar:", err)
		os.Exit(1)
	}
}

// flags are named as xllm_master_serving names them.
type flags struct {
	host             string
	port             int
	internalHost     string
	internalPort     int
	insecureInternal bool
	portAlias        bool // the port came from the deprecated --port
	rpcPort          int
	rpcNetworks      string
	rpcInflight      int64
	rpcQueuedOutput  int64
	advertiseHost    string
	kvEventsConfig   string
	internalAPIToken string
	tokenFile        string
	logLevel         string
	logFormat        string

	etcdAddr       string
	etcdNamespace  string
	leaseLostMs    int
	suspectSeconds int
	probeTimeoutMs int
	probeAttempts  int
	blockSize      int

	policy        string
	tokenizerPath string
	carLambda     float64
	carHostW      float64
	targetTTFT    int
	targetTPOT    int
	// CAR's router-side accounting (lb.AccountingOptions).
	acctDispatch     bool
	acctTokenWeight  float64
	acctLagMs        int
	acctMaxAgeMs     int
	acctMaxDispatch  int
	acctPending      bool
	acctPendingMs    int
	acctMaxPendBlock int
	keepWarmUs       int

	tokenizerSpecial bool // chat prompts are encoded with special tokens added
	// The request path's limits and what it tells clients.
	maxRequestBody     int64
	maxInflightRequest int64
	maxPromptText      int64
	exposeRouting      bool

	version bool // print the version line and exit
}

func parseFlags(args []string, out io.Writer) (*flags, error) {
	fs := flag.NewFlagSet("kvcar", flag.ContinueOnError)
	fs.SetOutput(out)
	f := &flags{}
	fs.StringVar(&f.host, "host", "", "address to listen on (empty: all interfaces)")
	fs.IntVar(&f.port, "http_server_port", 8888, "HTTP port of the service: OpenAI API, /health, /ready")
	var oldPort int
	fs.IntVar(&oldPort, "port", 8888, "deprecated alias of --http_server_port")
	fs.StringVar(&f.internalHost, "internal_host", "127.0.0.1", "address of the internal listeners: HTTP (heartbeat intake, query API, operator routes, status page, /metrics, profiler) and brpc (empty: all interfaces)")
	fs.IntVar(&f.internalPort, "internal_port", 8890, "port of the internal HTTP listener; the vLLM sidecar's HTTP heartbeats go here")
	fs.BoolVar(&f.insecureInternal, "insecure_internal_api", false, "allow internal listeners reachable from the network without a token (HTTP) or an allowed-network list (brpc), and KV event subscribers bound off loopback")
	fs.StringVar(&f.rpcNetworks, "rpc_allowed_networks", "", "comma-separated CIDRs whose peers may connect to the rpc port (loopback always may); required when it is reachable from the network, unless --insecure_internal_api")
	fs.IntVar(&f.rpcPort, "rpc_server_port", 8889, "brpc (baidu_std) port on --internal_host where xLLM engines send heartbeats and generations; 0 picks a free one")
	fs.Int64Var(&f.rpcInflight, "rpc_max_inflight_bytes", baidustd.DefaultMaxInflightBytes, "bytes the rpc port's calls hold at once, frames as they arrive and messages decompressed (ELIMIT past it); at least brpc's largest body, 64 MiB")
	fs.Int64Var(&f.rpcQueuedOutput, "rpc_max_queued_output_bytes", xllmrpc.DefaultMaxAllQueuedOutputBytes, "bytes the xLLM engines' output holds, decoded, queued for all requests at once (a request whose output does not fit fails); at least one request's queue, 4 MiB")
	fs.StringVar(&f.kvEventsConfig, "kv_events_config_file", "", "path of the KV events config JSON; empty disables the KV index")
	fs.StringVar(&f.internalAPIToken, "internal_api_token", "", "when set, internal routes require this X-Internal-Token; visible in the process list, prefer --internal_api_token_file or "+tokenEnv)
	fs.StringVar(&f.tokenFile, "internal_api_token_file", "", "file holding the internal API token (a trailing newline is ignored)")
	fs.StringVar(&f.logLevel, "log_level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log_format", "text", "log format: text or json")
	fs.StringVar(&f.advertiseHost, "advertise_host", "", "host engines reach this replica's internal listener at, written to XLLM:SERVICE keys (empty: --internal_host, else this machine's first non-loopback address)")
	fs.StringVar(&f.etcdAddr, "etcd_addr", "", "etcd endpoints, comma separated host:port; empty starts an embedded etcd for development")
	fs.StringVar(&f.etcdNamespace, "etcd_namespace", "", "optional namespace prefix of every etcd key, e.g. prod-a")
	fs.IntVar(&f.leaseLostMs, "lease_lost_heartbeat_timeout_ms", 3000, "heartbeat silence before a LEASE_LOST instance becomes SUSPECT")
	fs.IntVar(&f.suspectSeconds, "detect_disconnected_instance_interval", 15, "seconds a SUSPECT instance is kept before it is removed")
	fs.IntVar(&f.probeTimeoutMs, "instance_delete_probe_timeout_ms", 1000, "timeout of each health probe after an instance's etcd key is deleted")
	fs.IntVar(&f.probeAttempts, "instance_delete_probe_attempts", 2, "health probe attempts after an instance's etcd key is deleted")
	fs.StringVar(&f.policy, "load_balance_policy", lb.PolicyRR, "routing policy: RR, CAR or SLO_AWARE")
	fs.StringVar(&f.tokenizerPath, "tokenizer_path", "", "directory with the model's tokenizer.json (and tokenizer_config.json) so text and chat prompts get token ids for CAR; empty: they are routed by load only")
	fs.BoolVar(&f.tokenizerSpecial, "tokenizer_add_special_tokens", false, "encode rendered chat prompts with the tokenizer's special tokens added (BOS from add_bos_token or the post_processor), for engines that encode chat that way; text prompts always get them")
	fs.Float64Var(&f.carLambda, "car_prefill_lambda", lb.DefaultCARPrefillLambda, "CAR weight of the cache-miss cost against the queue cost, in [0, 1]")
	fs.Float64Var(&f.carHostW, "car_host_hit_weight", lb.DefaultCARHostHitWeight, "CAR benefit of a Host-only hit relative to a Device hit, in [0, 1]")
	fs.BoolVar(&f.acctDispatch, "car_dispatch_accounting", false, "CAR adds the requests it sent an instance since that instance's last load report to its waiting count (off: the seed's formula)")
	fs.Float64Var(&f.acctTokenWeight, "car_dispatch_token_weight", 0, "with --car_dispatch_accounting, weight in [0, 1] in the queue term of the uncached prompt tokens of the requests sent to an instance that have not ended")
	fs.IntVar(&f.acctLagMs, "car_dispatch_heartbeat_lag_ms", 0, "a load report received less than this after a dispatch does not supersede it, ms in [0, 60000]")
	fs.IntVar(&f.acctMaxAgeMs, "car_dispatch_max_age_ms", int(lb.DefaultDispatchMaxAge/time.Millisecond), "a dispatch stops counting (request and tokens) after this even without a load report or its end, ms in [1, 600000]")
	fs.IntVar(&f.acctMaxDispatch, "car_max_pending_dispatches", lb.DefaultMaxPendingDispatches, "dispatches remembered per instance, in [1, 1048576]")
	fs.BoolVar(&f.acctPending, "car_pending_prefixes", false, "CAR counts the blocks of prompts it sent an instance as hits there until its KV events report them or --car_pending_prefix_timeout_ms passes; never shown by the query API")
	fs.IntVar(&f.acctPendingMs, "car_pending_prefix_timeout_ms", int(lb.DefaultPendingPrefixTimeout/time.Millisecond), "how long a routed prompt's blocks count as pending hits, ms in [1, 600000]")
	fs.IntVar(&f.acctMaxPendBlock, "car_max_pending_blocks", lb.DefaultMaxPendingBlocks, "pending blocks remembered per instance, in [1, 4194304]")
	fs.IntVar(&f.keepWarmUs, "car_keep_warm_interval_us", int(lb.DefaultKeepWarmInterval/time.Microsecond), "while real CAR decisions come less often than this, CAR makes a dry one (no effect on routing) this often so that they find the processor's caches warm; µs in [0, 1000000], 0: never")
	fs.IntVar(&f.targetTTFT, "target_ttft", lb.DefaultTargetTTFTms, "SLO_AWARE target time to first token, ms")
	fs.IntVar(&f.targetTPOT, "target_tpot", lb.DefaultTargetTPOTms, "SLO_AWARE target time per output token, ms")
	fs.IntVar(&f.blockSize, "block_size", 128, "accepted for compatibility; the KV index uses discovery.block_size of the KV events config")
	fs.Int64Var(&f.maxRequestBody, "max_request_body_bytes", server.DefaultMaxRequestBodyBytes, "largest /v1/completions or /v1/chat/completions body, bytes (413 past it)")
	fs.Int64Var(&f.maxInflightRequest, "max_inflight_request_bytes", server.DefaultMaxInflightRequestBytes, "completion body bytes held at once across all requests (503 with Retry-After past it); at least --max_request_body_bytes")
	fs.Int64Var(&f.maxPromptText, "max_prompt_text_bytes", server.DefaultMaxPromptTextBytes, "largest prompt text or chat content of one request given to the tokenizer, bytes (413 past it)")
	fs.BoolVar(&f.exposeRouting, "expose_routing_headers", false, "send the routing decision (engine names, policy, hit ratio, decision time) to clients in X-Prefill-Name, X-Decode-Name and X-Kvcar-* headers")
	fs.BoolVar(&f.version, "version", false, "print the revision kvcar was built from, its Go version and platform, and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, r := range []struct {
		name     string
		val      int64
		min, max int64
	}{
		{"--max_request_body_bytes", f.maxRequestBody, 1 << 10, 1 << 30},
		{"--max_inflight_request_bytes", f.maxInflightRequest, f.maxRequestBody, 1 << 40},
		{"--max_prompt_text_bytes", f.maxPromptText, 1, f.maxRequestBody},
		{"--rpc_max_inflight_bytes", f.rpcInflight, baidustd.DefaultMaxBodySize, 1 << 40},
		{"--rpc_max_queued_output_bytes", f.rpcQueuedOutput, xllmrpc.DefaultMaxQueuedOutputBytes, 1 << 40},
	} {
		if r.val < r.min || r.val > r.max {
			return nil, fmt.Errorf("%s = %d: must be in [%d, %d]", r.name, r.val, r.min, r.max)
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["port"] {
		if set["http_server_port"] && oldPort != f.port {
			return nil, fmt.Errorf("--port = %d and --http_server_port = %d: --port is a deprecated alias, give only --http_server_port", oldPort, f.port)
		}
		f.port, f.portAlias = oldPort, true
	}
	for _, r := range []struct {
		name     string
		val      int
		min, max int
	}{
		{portFlagName(f), f.port, 0, 65535},
		{"--internal_port", f.internalPort, 0, 65535},
		{"--rpc_server_port", f.rpcPort, 0, 65535},
		{"--lease_lost_heartbeat_timeout_ms", f.leaseLostMs, 100, 600000},
		{"--detect_disconnected_instance_interval", f.suspectSeconds, 1, 3600},
		{"--instance_delete_probe_timeout_ms", f.probeTimeoutMs, 10, 60000},
		{"--instance_delete_probe_attempts", f.probeAttempts, 1, 10},
		{"--car_dispatch_heartbeat_lag_ms", f.acctLagMs, 0, int(lb.MaxHeartbeatLag / time.Millisecond)},
		{"--car_dispatch_max_age_ms", f.acctMaxAgeMs, 1, int(lb.MaxAccountingAge / time.Millisecond)},
		{"--car_max_pending_dispatches", f.acctMaxDispatch, 1, lb.MaxPendingCap},
		{"--car_pending_prefix_timeout_ms", f.acctPendingMs, 1, int(lb.MaxAccountingAge / time.Millisecond)},
		{"--car_max_pending_blocks", f.acctMaxPendBlock, 1, lb.MaxPendingBlocks},
		{"--car_keep_warm_interval_us", f.keepWarmUs, 0, int(lb.MaxKeepWarmInterval / time.Microsecond)},
		// Checked whatever the policy, as every flag is: a value out of
		// range under another policy is a mistake waiting for a switch.
		{"--target_ttft", f.targetTTFT, 0, maxTargetMs},
		{"--target_tpot", f.targetTPOT, 0, maxTargetMs},
	} {
		if r.val < r.min || r.val > r.max {
			return nil, fmt.Errorf("%s = %d: must be in [%d, %d]", r.name, r.val, r.min, r.max)
		}
	}
	for _, r := range []struct {
		name string
		val  float64
	}{
		{"--car_prefill_lambda", f.carLambda},
		{"--car_host_hit_weight", f.carHostW},
		{"--car_dispatch_token_weight", f.acctTokenWeight},
	} {
		if !(r.val >= 0 && r.val <= 1) {
			return nil, fmt.Errorf("%s = %v: must be in [0, 1]", r.name, r.val)
		}
	}
	if h := f.advertiseHost; h != "" && !validHost(h) {
		return nil, fmt.Errorf("--advertise_host = %q: must be a host name or an IP address, without a port", h)
	}
	for _, e := range splitEndpoints(f.etcdAddr) {
		if err := checkEndpoint(e); err != nil {
			return nil, fmt.Errorf("--etcd_addr = %q: endpoint %q %v", f.etcdAddr, e, err)
		}
	}
	return f, nil
}

// validHost reports whether h is an IP address or a DNS host name
// (letters, digits, hyphens and dots), as engines dial it.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// checkEndpoint refuses an etcd endpoint the client could never dial,
// which would leave kvcar waiting for its registry for ever: it must be
// host:port, with a port in [1, 65535], after an optional http:// or
// https://; unix sockets (unix:...) are the client's to check.
func checkEndpoint(e string) error {
	if strings.HasPrefix(e, "unix:") || strings.HasPrefix(e, "unixs:") {
		return nil
	}
	hp := e
	for _, scheme := range []string{"http://", "https://"} {
		hp = strings.TrimPrefix(hp, scheme)
	}
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("is not host:port: %w", err)
	}
	if host == "" {
		return errors.New("has no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("has port %q: must be in [1, 65535]", port)
	}
	return nil
}

// maxTargetMs bounds --target_ttft and --target_tpot: an hour.
const maxTargetMs = 3_600_000

// accountingOptions are CAR's accounting flags; the block size of
// pending prefixes is the KV events config's, the engines' block size.
func accountingOptions(f *flags, cfg *config.Config) lb.AccountingOptions {
	o := lb.DefaultAccountingOptions()
	o.Dispatched = f.acctDispatch
	o.TokenWeight = f.acctTokenWeight
	o.HeartbeatLag = time.Duration(f.acctLagMs) * time.Millisecond
	o.DispatchMaxAge = time.Duration(f.acctMaxAgeMs) * time.Millisecond
	o.MaxPendingDispatches = f.acctMaxDispatch
	o.PendingPrefixes = f.acctPending
	o.PendingTimeout = time.Duration(f.acctPendingMs) * time.Millisecond
	o.MaxPendingBlocks = f.acctMaxPendBlock
	if cfg != nil {
		switch {
		case cfg.Discovery.Enabled && cfg.Discovery.BlockSize > 0:
			o.BlockSize = cfg.Discovery.BlockSize
		case len(cfg.Streams) > 0 && cfg.Streams[0].BlockSize > 0:
			o.BlockSize = cfg.Streams[0].BlockSize
		}
	}
	return o
}

func newLogger(f *flags, out io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log_level = %q: must be one of debug, info, warn, error", f.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(f.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(out, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(out, opts)), nil
	}
	return nil, fmt.Errorf("--log_format = %q: must be text or json", f.logFormat)
}

// listening is where run serves: the public and the internal listener's
// addresses.
type listening struct{ public, internal string }

// run starts the service and blocks until ctx ends. When ready is not
// nil it receives the listening addresses once both listeners serve.
func run(ctx context.Context, args []string, logOut io.Writer, ready chan<- listening) error {
	f, err := parseFlags(args, logOut)
	if err != nil {
		return err
	}
	if f.version {
		_, err := fmt.Fprintln(logOut, buildinfo.VersionLine("kvcar"))
		return err
	}
	log, err := newLogger(f, logOut)
	if err != nil {
		return err
	}
	godebug := os.Getenv("GODEBUG")
	monitor := sysmon.StateOf(godebug)
	if monitor != sysmon.Polling {
		// main restarts kvcar under sysmon.Setting unless the operator set
		// schedtrace; "default" means that restart did not happen.
		log.Info("Go's system monitor deep-sleeps between bursts of work, and waking it delays routing decisions",
			"sysmon", monitor, "GODEBUG", godebug, "kvcar_sets", sysmon.Setting)
	}
	idleNotice(log, cpuidle.Read("/"))
	// Before any socket: libzmq's messages come from malloc.
	cmem := cmalloc.Keep(os.LookupEnv)
	if cmem == cmalloc.Unsupported {
		log.Info("the C library takes no malloc thresholds: it may give each received KV message's memory back to the kernel and fault it in again for the next")
	}
	if f.portAlias {
		log.Warn("--port is deprecated: use --http_server_port, as xllm_master_serving names it")
	}
	var cfg *config.Config
	if f.kvEventsConfig == "" {
		log.Warn("--kv_events_config_file is empty: the KV index is disabled and every prefix hit ratio is 0")
	} else if cfg, err = config.Load(f.kvEventsConfig); err != nil {
		return err
	}
	if err := checkHubExposure(f, cfg, log); err != nil {
		return err
	}
	if f.blockSize != 128 {
		log.Warn("--block_size does not affect the KV index; discovery.block_size in the KV events config does", "block_size", f.blockSize)
	}

	token, err := internalToken(f, os.Getenv, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, fmt.Sprint(f.port)))
	if err != nil {
		return fmt.Errorf("listen on --host=%q %s=%d: %w", f.host, portFlagName(f), f.port, err)
	}
	defer ln.Close()
	iln, err := net.Listen("tcp", net.JoinHostPort(f.internalHost, fmt.Sprint(f.internalPort)))
	if err != nil {
		return fmt.Errorf("internal listener on --internal_host=%q --internal_port=%d: %w", f.internalHost, f.internalPort, err)
	}
	defer iln.Close()
	if err := checkInternalExposure(f, token != "", iln.Addr(), log); err != nil {
		return err
	}
	rpcLn, err := net.Listen("tcp", net.JoinHostPort(f.internalHost, fmt.Sprint(f.rpcPort)))
	if err != nil {
		return fmt.Errorf("rpc listener on --internal_host=%q --rpc_server_port=%d: %w", f.internalHost, f.rpcPort, err)
	}
	defer rpcLn.Close()
	rpcNets, err := parseNetworks(f.rpcNetworks)
	if err != nil {
		return err
	}
	if err := checkRPCExposure(f, rpcNets, rpcLn.Addr(), log); err != nil {
		return err
	}
	// Engines find the master by its rpc address, as xllm-service
	// registers it (XLLM:SERVICE:MASTER = "ip:rpc_port").
	self, err := advertisedAddr(f, rpcLn.Addr())
	if err != nil {
		return err
	}

	// Every background part runs under runCtx on wg; at exit they are
	// stopped and waited for first, then the parts they used are closed
	// in reverse order of start.
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var cleanups []func()
	defer func() {
		cancel()
		wg.Wait()
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	reg, closeEtcd, err := startRegistry(runCtx, f, self, log, &wg)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, closeEtcd)

	// One registry per process, passed down: no package registers
	// anything globally.
	metricsReg := prometheus.NewRegistry()
	metricsReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		reg.Collector())
	// A constant 1 whose labels say what each replica runs, so a
	// dashboard or an alert can tell replicas of a rollout apart.
	metricsReg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvcar_build_info",
		Help:        "1, labelled with the revision kvcar was built from and the Go release that built it.",
		ConstLabels: prometheus.Labels{"revision": buildinfo.Revision(), "goversion": buildinfo.GoVersion()}},
		func() float64 { return 1 }))

	var (
		dir        *kvdir.Directory
		discovered <-chan struct{}
	)
	if cfg != nil {
		if dir, err = kvdir.New(kvdir.LimitsFromConfig(cfg), kvdir.Options{Logger: log, Registerer: metricsReg}); err != nil {
			return err
		}
		cleanups = append(cleanups, func() { dir.Close() })
		if err := dir.SetStreams(kvdir.StaticSpecs(cfg)); err != nil {
			return err
		}
		if cfg.Discovery.Enabled {
			discovered = dir.Discovered()
			wg.Add(1)
			go func() {
				defer wg.Done()
				dir.RunDiscovery(runCtx, reg, cfg.Discovery, cfg.MaxStreams)
			}()
		}
		// The bound is what an engine sending the worst the limits let
		// through could make kvcar hold; operators size the host by it.
		bound := kvdir.LimitsFromConfig(cfg).MemoryBound()
		log.Info("KV index enabled", "config", f.kvEventsConfig, "static_streams", len(cfg.Streams),
			"discovery", cfg.Discovery.Enabled, "memory_bound_mib_per_stream", bound.Process(1)>>20,
			"memory_bound_mib_at_max_streams", bound.Process(cfg.MaxStreams)>>20)
	}

	lbOpts := lb.Options{CARPrefillLambda: f.carLambda, CARHostHitWeight: f.carHostW,
		TargetTTFTms: f.targetTTFT, TargetTPOTms: f.targetTPOT, Accounting: accountingOptions(f, cfg)}
	if dir != nil {
		lbOpts.Prefix = dir
	}
	policy, err := lb.New(f.policy, lbOpts)
	if err != nil {
		return err
	}
	log.Info("routing", "policy", policy.Name())
	if a := lbOpts.Accounting; policy.Name() == lb.PolicyCAR && (a.Dispatched || a.PendingPrefixes) {
		log.Info("CAR accounting", "dispatches", a.Dispatched, "token_weight", a.TokenWeight,
			"pending_prefixes", a.PendingPrefixes && dir != nil, "pending_block_size", a.BlockSize)
		if a.PendingPrefixes && dir == nil {
			log.Warn("--car_pending_prefixes has no effect with the KV index disabled")
		}
	}

	// Requests for xLLM engines go over baidu_std, their output comes back
	// through the rpc port's Generations into outputs.
	outputs := xllmrpc.NewOutputs(0, f.rpcQueuedOutput)
	disp, err := xllmrpc.NewDispatcher(xllmrpc.DispatcherOptions{Self: self, Outputs: outputs, Registry: reg, Logger: log})
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { disp.Close() })
	metricsReg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvcar_xllm_requests_in_flight",
		Help: "Requests sent to xLLM engines over baidu_std whose output kvcar still waits for."},
		func() float64 { return float64(outputs.Len()) }))
	metricsReg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvcar_xllm_queued_output_bytes",
		Help: "Bytes the xLLM engines' output holds, decoded, queued for requests whose clients have not taken it yet."},
		func() float64 { return float64(outputs.QueuedBytes()) }))
	metricsReg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvcar_xllm_queued_output_limit_bytes",
		Help: "The bound on kvcar_xllm_queued_output_bytes (--rpc_max_queued_output_bytes)."},
		func() float64 { return float64(outputs.MaxQueuedBytes()) }))

	router := registryRouter{policy: policy, reg: reg}
	if w, ok := policy.(lb.Warmer); ok && f.keepWarmUs > 0 {
		if router.warm, err = lb.NewKeepWarm(w, reg.Snapshot, time.Duration(f.keepWarmUs)*time.Microsecond, lb.DefaultKeepWarmIdle); err != nil {
			return err
		}
		registerKeepWarm(metricsReg, router.warm)
		wg.Add(1)
		go func() {
			defer wg.Done()
			router.warm.Run(runCtx)
		}()
	}
	opts := server.Options{InternalAPIToken: token, Logger: log, Heartbeats: reg, Dispatcher: disp,
		Router: router, Metrics: metricsReg,
		Instances: reg, Policy: policy.Name(), IsMaster: reg.IsMaster,
		MaxRequestBodyBytes: f.maxRequestBody, MaxInflightRequestBytes: f.maxInflightRequest,
		MaxPromptTextBytes: int(f.maxPromptText), ExposeRoutingHeaders: f.exposeRouting}
	if f.tokenizerPath != "" {
		tok, err := tokenizer.Load(f.tokenizerPath)
		if err != nil {
			return fmt.Errorf("--tokenizer_path: %w", err)
		}
		opts.Tokenizer = chatTokenizer{t: tok, special: f.tokenizerSpecial}
		log.Info("tokenizer loaded", "path", f.tokenizerPath, "vocab", tok.VocabSize(), "chat_template", tok.HasChatTemplate(), "chat_special_tokens", f.tokenizerSpecial)
	}
	if dir != nil {
		opts.Directory = dir
		opts.Streams = dir
	}
	srv := server.New(opts)
	steps := readinessSteps(reg, discovered)
	// Not ready from the first request on, saying why (R-API-1).
	srv.SetNotReady(steps[0].waitingFor)
	rpcSrv := baidustd.NewServer(baidustd.ServerOptions{Identity: self, Logger: log, MaxInflightBytes: f.rpcInflight})
	if err := xllmrpc.NewService(reg, outputs, log).Register(rpcSrv); err != nil {
		return err
	}
	defer rpcSrv.Close()
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	// The public listener, which carries the request path, is served by
	// kvcar's own HTTP/1.1 loop (same timeouts and head limit as the
	// internal one's net/http server); the internal one by net/http.
	servers := []struct {
		name string
		hs   httpServer
		ln   net.Listener
	}{
		{"public", server.NewHTTP1Server(srv.Handler(), server.HTTP1Options{ReadHeaderTimeout: readHeaderTimeout,
			ReadTimeout: readTimeout, IdleTimeout: idleTimeout, Logger: log}), ln},
		{"internal", newHTTPServer(srv.InternalHandler(), errLog), iln},
	}
	// Each Serve returns once its server is shut down below; errc has
	// room for every result so no goroutine is left blocked.
	errc := make(chan error, len(servers)+1)
	// serving owns the Serve loops: run waits for them after the
	// shutdown below has closed their listeners.
	var serving sync.WaitGroup
	for _, s := range servers {
		serving.Go(func() {
			if err := s.hs.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s http server: %w", s.name, err)
			}
		})
	}
	serving.Go(func() {
		if err := rpcSrv.Serve(newAllowListener(rpcLn, rpcNets, log)); err != nil && !errors.Is(err, baidustd.ErrServerClosed) {
			errc <- fmt.Errorf("rpc server: %w", err)
		}
	})
	readyDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(readyDone)
		awaitReady(runCtx, srv, steps, log)
	}()
	log.Info("kvcar listening", "addr", ln.Addr().String(), "internal", iln.Addr().String(), "rpc", rpcLn.Addr().String(),
		"advertise_rpc", self, "query", fmt.Sprintf("http://%s%s", iln.Addr(), server.QueryPath),
		"revision", buildinfo.Revision(), "go", buildinfo.GoVersion(), "sysmon", monitor, "c_malloc", cmem)
	if ready != nil {
		ready <- listening{public: ln.Addr().String(), internal: iln.Addr().String()}
	}

	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
	}
	// The background parts stop first (runCtx is ctx's child, so on a
	// signal they are stopping already); awaitReady must not open the
	// service after it has been closed for the drain.
	cancel()
	<-readyDone
	srv.SetNotReady("shutting down")
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShutdown()
	// The HTTP servers drain first: the requests in flight to xLLM engines
	// still get their output through the rpc port. Those not done by the
	// deadline are cut off, which ends their engine requests.
	for _, s := range servers {
		if err := s.hs.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.hs.Close()
			serveErr = errors.Join(serveErr, fmt.Errorf("%s http shutdown: %w", s.name, err))
		}
	}
	if err := rpcSrv.Shutdown(shutdownCtx); err != nil {
		log.Warn("rpc shutdown", "err", err)
	}
	if !waitTimeout(&serving, serveStopTimeout) {
		log.Warn("a server's accept loop did not return after shutdown", "waited", serveStopTimeout)
	}
	if serveErr != nil {
		return serveErr
	}
	log.Info("kvcar stopped")
	return nil
}

// serveStopTimeout bounds the wait for the servers' accept loops once
// their listeners are closed; they return at once unless an accept is
// stuck in the kernel.
const serveStopTimeout = 5 * time.Second

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// httpServer is what serves a listener: net/http's server or kvcar's own.
type httpServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// Timeouts of both listeners' servers.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 60 * time.Second
	idleTimeout       = 120 * time.Second
)

func newHTTPServer(h http.Handler, errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          errLog,
	}
}

// startRegistry connects to etcd (or starts an embedded one when
// --etcd_addr is empty) and runs the instance registry on wg. The
// returned func closes the client and any embedded server.
func startRegistry(ctx context.Context, f *flags, self string, log *slog.Logger, wg *sync.WaitGroup) (*instance.Registry, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	endpoints := splitEndpoints(f.etcdAddr)
	if len(endpoints) == 0 {
		emb, err := etcdembed.Start(ctx, etcdembed.Options{Logger: log})
		if err != nil {
			return nil, nil, fmt.Errorf("embedded etcd: %w", err)
		}
		closers = append(closers, func() { emb.Close() })
		endpoints = []string{emb.Endpoint()}
		log.Warn("--etcd_addr is empty: started an embedded etcd for development; its data is discarded at exit",
			"endpoint", emb.Endpoint())
	}
	ccfg, err := instance.ClientConfig(endpoints, os.Getenv, log)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	client, err := clientv3.New(ccfg)
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("etcd client %v: %w", endpoints, err)
	}
	closers = append(closers, func() { client.Close() })
	reg, err := instance.New(instance.Options{
		Client:         client,
		Namespace:      f.etcdNamespace,
		SelfAddr:       self,
		Logger:         log,
		LeaseLostGrace: time.Duration(f.leaseLostMs) * time.Millisecond,
		SuspectTimeout: time.Duration(f.suspectSeconds) * time.Second,
		ProbeTimeout:   time.Duration(f.probeTimeoutMs) * time.Millisecond,
		ProbeAttempts:  f.probeAttempts,
	})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := reg.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("instance registry stopped", "err", err)
		}
	}()
	log.Info("instance registry started", "etcd", endpoints, "namespace", f.etcdNamespace, "self", self)
	return reg, closeAll, nil
}

// registryRouter routes over the registry's current snapshot: a pure
// in-process decision (R-DIR-4).
type registryRouter struct {
	policy lb.Policy
	reg    *instance.Registry
	// warm, when set, makes dry decisions between sparse real ones.
	warm *lb.KeepWarm
}

func (r registryRouter) Policy() string { return r.policy.Name() }

func (r registryRouter) Route(req lb.Request) (lb.Decision, error) {
	d, err := r.policy.Route(req, r.reg.Snapshot())
	if r.warm != nil {
		r.warm.Decided()
	}
	return d, err
}

// registerKeepWarm exports what the dry decisions cost.
func registerKeepWarm(reg prometheus.Registerer, k *lb.KeepWarm) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvcar_routing_dry_decisions_total",
		Help: "Dry CAR decisions made to keep the processor's caches warm between sparse real ones (--car_keep_warm_interval_us)."},
		func() float64 { n, _ := k.Warms(); return float64(n) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvcar_routing_dry_decision_seconds_total",
		Help: "Time spent in dry CAR decisions (kvcar_routing_dry_decisions_total): their share of a core."},
		func() float64 { _, took := k.Warms(); return took.Seconds() }))
}

// Release passes the end of a request on to a policy that counts its
// requests until they end (CAR with --car_dispatch_accounting).
func (r registryRouter) Release(d lb.Decision) {
	if rel, ok := r.policy.(lb.Releaser); ok {
		rel.Release(d)
	}
}

// chatTokenizer gives the request path the model's tokenizer.
type chatTokenizer struct {
	t       *tokenizer.Tokenizer
	special bool // --tokenizer_add_special_tokens
}

func (c chatTokenizer) Encode(ctx context.Context, text string, dst []uint32) ([]uint32, error) {
	return c.t.EncodeContext(ctx, text, dst)
}

func (c chatTokenizer) EncodeChat(ctx context.Context, msgs []server.ChatMessage, dst []uint32) ([]uint32, error) {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	return c.t.EncodeChatWithContext(ctx, tm, tokenizer.ChatOptions{AddGenerationPrompt: true, AddSpecialTokens: c.special}, dst)
}

func splitEndpoints(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// idleNotice tells the operator when the machine's idle vCPUs halt
// without polling first: kvcar cannot change that, and on such a machine
// a request that finds its core idle waits for the hypervisor, 0.1 ms to
// over 1 ms in the measurements README cites.
func idleNotice(log *slog.Logger, s cpuidle.Setting) {
	if s.HaltsAtOnce() {
		log.Info("idle CPUs halt at once, so a request that finds kvcar's core idle waits for the hypervisor to run it again; "+
			"see README, Idle CPUs on virtual machines", "cpuidle", s.String())
	}
}
