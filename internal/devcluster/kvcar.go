package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/buildinfo"
	"github.com/kvcar/kvcar/internal/freeport"
	"github.com/kvcar/kvcar/internal/server"
)

// StopTimeout is how long Stop waits for kvcar to exit after SIGTERM
// before it kills it. kvcar's own shutdown takes well under a second; a
// kvcar still running after this is stuck.
const StopTimeout = 15 * time.Second

// KVCarOptions says how to run the kvcar binary.
type KVCarOptions struct {
	// Binary is the path of the kvcar executable.
	Binary string
	// Port is kvcar's HTTP port (--http_server_port); 0 picks one free right now.
	Port int
	// InternalPort is the port of kvcar's internal listener
	// (--internal_port, on loopback), where the query API, the operator
	// routes and heartbeat intake are; 0 picks one free right now.
	InternalPort int
	// Etcd are the etcd endpoints (--etcd_addr).
	Etcd []string
	// Namespace is the etcd key prefix (--etcd_namespace), left out when
	// empty.
	Namespace string
	// ConfigFile is the KV events config (--kv_events_config_file).
	ConfigFile string
	// Args are further flags, passed as given (--log_level=warn, …).
	Args []string
	// Stdout and Stderr receive kvcar's output; nil discards it.
	Stdout, Stderr io.Writer
	// CPUs, when set, are the only CPUs kvcar's threads run on (as
	// taskset would put them), so that a benchmark can give kvcar cores
	// its load generator does not use.
	CPUs []int
	// Env are environment variables ("KEY=value") added to this
	// process's for kvcar; a later one of the same key wins.
	Env []string
}

// KVCar is a kvcar child process. Its owner must call Stop.
type KVCar struct {
	cmd         *exec.Cmd
	url         string
	internalURL string
	client      *http.Client
	// done is closed once the process has been waited for; exit holds
	// Wait's result by then.
	done chan struct{}
	exit error
}

// StartKVCar starts kvcar. Its internal listener stays on loopback, where
// the emulated engines send their heartbeats, and is advertised there.
func StartKVCar(o KVCarOptions) (*KVCar, error) {
	port, internalPort := o.Port, o.InternalPort
	for _, p := range []*int{&port, &internalPort} {
		if *p == 0 {
			var err error
			if *p, err = FreePort(); err != nil {
				return nil, err
			}
		}
	}
	args := []string{
		"--http_server_port=" + strconv.Itoa(port), "--internal_host=127.0.0.1", "--internal_port=" + strconv.Itoa(internalPort),
		"--rpc_server_port=0", "--advertise_host=127.0.0.1",
		"--etcd_addr=" + strings.Join(o.Etcd, ","), "--kv_events_config_file=" + o.ConfigFile,
	}
	if o.Namespace != "" {
		args = append(args, "--etcd_namespace="+o.Namespace)
	}
	cmd := exec.Command(o.Binary, append(args, o.Args...)...)
	cmd.Stdout, cmd.Stderr = o.Stdout, o.Stderr
	if len(o.Env) > 0 {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	// Bounds Wait when output is copied through a pipe that something
	// other than kvcar keeps open.
	cmd.WaitDelay = 5 * time.Second
	if err := StartOnCPUs(cmd, o.CPUs); err != nil {
		return nil, fmt.Errorf("start kvcar %s: %w", o.Binary, err)
	}
	k := &KVCar{
		cmd:         cmd,
		url:         "http://127.0.0.1:" + strconv.Itoa(port),
		internalURL: "http://127.0.0.1:" + strconv.Itoa(internalPort),
		// A transport of its own, so that Stop can close its connections
		// without touching anyone else's.
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}},
		done:   make(chan struct{}),
	}
	go func() {
		k.exit = cmd.Wait()
		close(k.done)
	}()
	return k, nil
}

// URL is the base URL of kvcar's public listener on loopback (the
// OpenAI-compatible API), without a trailing slash.
func (k *KVCar) URL() string { return k.url }

// InternalURL is the base URL of kvcar's internal listener: the query
// API, operator routes, status page, /metrics and the profiler.
func (k *KVCar) InternalURL() string { return k.internalURL }

// Pid is the process id of kvcar.
func (k *KVCar) Pid() int { return k.cmd.Process.Pid }

// Signal sends sig to kvcar.
func (k *KVCar) Signal(sig os.Signal) error {
	if err := k.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal kvcar %v: %w", sig, err)
	}
	return nil
}

// Exited returns an error saying how kvcar exited once it has, and nil
// while it runs.
func (k *KVCar) Exited() error {
	select {
	case <-k.done:
		if k.exit != nil {
			return fmt.Errorf("kvcar exited: %w", k.exit)
		}
		return errors.New("kvcar exited: exit status 0")
	default:
		return nil
	}
}

// Stop ends kvcar with SIGTERM and waits for it to exit; after
// StopTimeout it kills it. It returns kvcar's exit error, if any, or an
// error saying it had to be killed. Stop may be called again; it then
// reports the same exit.
func (k *KVCar) Stop() error {
	defer k.client.CloseIdleConnections()
	select {
	case <-k.done:
		return k.exitErr()
	default:
	}
	// A process stopped by SIGSTOP acts on SIGTERM only once continued.
	// Errors mean it has exited meanwhile, which done will tell.
	_ = k.cmd.Process.Signal(syscall.SIGCONT)
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(StopTimeout)
	defer t.Stop()
	select {
	case <-k.done:
		return k.exitErr()
	case <-t.C:
	}
	_ = k.cmd.Process.Kill()
	<-k.done
	return fmt.Errorf("kvcar did not stop within %v of SIGTERM and was killed", StopTimeout)
}

func (k *KVCar) exitErr() error {
	if k.exit != nil {
		return fmt.Errorf("kvcar: %w", k.exit)
	}
	return nil
}

// Streams asks kvcar's query API, with no token ids, for every stream's
// state, and returns how many streams it has and how many of them are
// synchronised.
func (k *KVCar) Streams(ctx context.Context) (synced, total int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.internalURL+server.QueryPath, strings.NewReader(`{"token_ids":[]}`))
	if err != nil {
		return 0, 0, fmt.Errorf("query: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("query: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, 0, fmt.Errorf("query: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var out struct {
		Matches []struct {
			Synchronized bool `json:"synchronized"`
		} `json:"matches"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, 0, fmt.Errorf("query answer: %w", err)
	}
	for _, m := range out.Matches {
		if m.Synchronized {
			synced++
		}
	}
	return synced, len(out.Matches), nil
}

// WaitSynced waits until kvcar has exactly n streams, all synchronised.
// It gives up at once when kvcar exits.
func (k *KVCar) WaitSynced(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := k.Exited(); err != nil {
			return err
		}
		// Errors are expected until kvcar listens and is ready.
		synced, total, err := k.Streams(ctx)
		if err == nil && synced == n && total == n {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("kvcar streams not synchronised within %v: %w", timeout, err)
			}
			return fmt.Errorf("kvcar streams not synchronised within %v: %d of %d synchronised, want all of %d", timeout, synced, total, n)
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return err
		}
	}
}

// BuildKVCar builds the kvcar command as shipped (no race detector, whose
// shadow memory would distort what a test measures) into dir and returns
// the binary's path. It stamps the working tree's revision as make build
// does (GitRevision; none when git cannot say). It is for tests, which run
// inside the module.
func BuildKVCar(ctx context.Context, dir string) (string, error) {
	rev, err := GitRevision(ctx, "")
	if err != nil {
		rev = "" // the binary then reports buildinfo.Unknown
	}
	return BuildKVCarRevision(ctx, dir, rev)
}

// BuildKVCarRevision is BuildKVCar stamping rev. The toolchain's VCS
// stamp is left out, so with an empty rev the binary reports
// buildinfo.Unknown wherever it is built.
func BuildKVCarRevision(ctx context.Context, dir, rev string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build kvcar: %w", err)
	}
	bin := filepath.Join(dir, "kvcar")
	args := []string{"build", "-buildvcs=false", "-o", bin}
	if rev != "" {
		args = append(args, "-ldflags="+buildinfo.LDFlags(rev))
	}
	out, err := exec.CommandContext(ctx, goBin, append(args, "github.com/kvcar/kvcar/cmd/kvcar")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build kvcar: %w\n%s", err, out)
	}
	return bin, nil
}

// FreePort returns a loopback TCP port that is free right now, outside
// the kernel's ephemeral range (freeport), so that no other socket is
// given it before the child process binds it.
func FreePort() (int, error) {
	p, err := freeport.Loopback(1)
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	return p[0], nil
}

// StreamState is what kvcar's streams listing says of one stream.
type StreamState struct {
	Instance     string `json:"instance_name"`
	DPRank       int    `json:"dp_rank"`
	SyncMode     string `json:"sync_mode"`
	Synchronized bool   `json:"synchronized"`
	Complete     bool   `json:"complete"`
	DeviceBlocks int    `json:"device_blocks"`
	HostBlocks   int    `json:"host_blocks"`
	// SnapshotsSucceeded and SnapshotsFailed count the stream's
	// snapshots, recoveries and calibrations alike, since it began.
	SnapshotsSucceeded uint64 `json:"snapshots_succeeded"`
	SnapshotsFailed    uint64 `json:"snapshots_failed"`
}

// SnapshotsBetween counts the snapshots that succeeded and failed between
// two listings of the same kvcar. A stream's counters start at zero when
// kvcar makes it anew (its instance left discovery and came back), so a
// stream whose counters went back counts from zero, and one missing from
// the first listing counts whole: the result is what at least happened.
func SnapshotsBetween(before, after []StreamState) (succeeded, failed uint64) {
	type key struct {
		instance string
		dp       int
	}
	prev := make(map[key]StreamState, len(before))
	for _, s := range before {
		prev[key{s.Instance, s.DPRank}] = s
	}
	for _, s := range after {
		p := prev[key{s.Instance, s.DPRank}]
		if s.SnapshotsSucceeded < p.SnapshotsSucceeded || s.SnapshotsFailed < p.SnapshotsFailed {
			p = StreamState{}
		}
		succeeded += s.SnapshotsSucceeded - p.SnapshotsSucceeded
		failed += s.SnapshotsFailed - p.SnapshotsFailed
	}
	return succeeded, failed
}

// StreamStates reads kvcar's streams listing from its internal listener.
func (k *KVCar) StreamStates(ctx context.Context) ([]StreamState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.internalURL+server.StreamsPath, nil)
	if err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("streams: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var out struct {
		Streams []StreamState `json:"streams"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("streams answer: %w", err)
	}
	return out.Streams, nil
}

// WaitStream waits until kvcar lists a stream of instance and returns
// its state. It gives up at once when kvcar exits.
func (k *KVCar) WaitStream(ctx context.Context, instance string, timeout time.Duration) (StreamState, error) {
	deadline := time.Now().Add(timeout)
	for {
		if err := k.Exited(); err != nil {
			return StreamState{}, err
		}
		// Errors are expected until kvcar listens and is ready.
		states, err := k.StreamStates(ctx)
		for _, s := range states {
			if s.Instance == instance {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			return StreamState{}, fmt.Errorf("no kvcar stream of %s within %v (last error: %v)", instance, timeout, err)
		}
		if err := sleep(ctx, pollInterval); err != nil {
			return StreamState{}, err
		}
	}
}

// Metrics reads the values of unlabelled samples of kvcar's /metrics
// (counters or gauges) named names, in one scrape; a name kvcar does not
// serve is missing from the map.
func (k *KVCar) Metrics(ctx context.Context, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.internalURL+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	// kvcar's metrics are tens of kilobytes; the bound keeps a wrong
	// answer from costing the driver memory.
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s: %v", resp.Status, err)
	}
	out := make(map[string]float64, len(names))
	for line := range strings.Lines(string(b)) {
		name, rest, found := strings.Cut(strings.TrimSpace(line), " ")
		if !found || !slices.Contains(names, name) {
			continue
		}
		v, err := strconv.ParseFloat(rest, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %s %q: %w", name, rest, err)
		}
		out[name] = v
	}
	return out, nil
}
