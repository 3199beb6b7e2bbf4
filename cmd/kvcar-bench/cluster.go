package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

// clusterConfig describes the emulated engines and the kvcar child.
type clusterConfig struct {
	// EngineDP holds one DP size per engine.
	EngineDP     []int `json:"engine_dp"`
	BlockSize    int   `json:"block_size"`
	DeviceBlocks int   `json:"device_blocks"`
	// HostBlocks is the Host tier of the first HostEngines engines.
	HostBlocks  int `json:"host_blocks"`
	HostEngines int `json:"host_engines"`
	BatchSlots  int `json:"batch_slots"`
	// TimeScale scales every emulated time; the costs are per token.
	TimeScale       float64       `json:"time_scale"`
	PrefillPerToken time.Duration `json:"prefill_per_token_ns"`
	DecodePerToken  time.Duration `json:"decode_per_token_ns"`
	Heartbeat       time.Duration `json:"heartbeat_interval_ns"`
}

func (c clusterConfig) validate() error {
	var errs []error
	if len(c.EngineDP) == 0 {
		errs = append(errs, errors.New("--engines: at least one engine is needed"))
	}
	for i, dp := range c.EngineDP {
		if dp < 1 || dp > 8 {
			errs = append(errs, fmt.Errorf("--engines: engine %d has DP size %d, want 1..8", i, dp))
		}
	}
	if c.BlockSize < 1 || c.DeviceBlocks < 1 || c.HostBlocks < 0 || c.BatchSlots < 1 {
		errs = append(errs, fmt.Errorf("--block_size %d, --device_blocks %d, --batch_slots %d must be positive and --host_blocks %d not negative",
			c.BlockSize, c.DeviceBlocks, c.BatchSlots, c.HostBlocks))
	}
	if c.HostEngines < 0 || c.HostEngines > len(c.EngineDP) {
		errs = append(errs, fmt.Errorf("--host_engines = %d: must be in [0, %d]", c.HostEngines, len(c.EngineDP)))
	}
	if !(c.TimeScale > 0 && c.TimeScale <= 1) {
		errs = append(errs, fmt.Errorf("--time_scale = %v: must be in (0, 1]", c.TimeScale))
	}
	if c.PrefillPerToken <= 0 || c.DecodePerToken <= 0 || c.Heartbeat <= 0 {
		errs = append(errs, errors.New("--prefill_per_token, --decode_per_token and --heartbeat_interval must be positive"))
	}
	return errors.Join(errs...)
}

func (c clusterConfig) streams() int {
	n := 0
	for _, dp := range c.EngineDP {
		n += dp
	}
	return n
}

// startEngines starts a fresh set of engines, registered in etcd under
// namespace when etcd is not empty (kvcar discovers them there). Each
// serves its OpenAI path on a free loopback port from which the
// discovery rule derives its KV endpoints.
func startEngines(c clusterConfig, etcd []string, namespace string) ([]*enginesim.Engine, error) {
	var engines []*enginesim.Engine
	closeAll := func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}
	for i, dp := range c.EngineDP {
		cfg := enginesim.Config{
			DPSize: dp, BlockSize: c.BlockSize, DeviceBlocks: c.DeviceBlocks, Topic: "xllm-kv",
			DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
			Logger:           slog.New(slog.DiscardHandler),
			TimeScale:        c.TimeScale, PrefillPerToken: c.PrefillPerToken, DecodePerToken: c.DecodePerToken,
			BatchSlots: c.BatchSlots,
			// The whole workload may queue on one engine.
			MaxQueue: 1 << 16,
		}
		if i < c.HostEngines {
			cfg.HostBlocks = c.HostBlocks
		}
		if len(etcd) > 0 {
			cfg.Etcd = &enginesim.EtcdConfig{Endpoints: etcd, Namespace: namespace, Type: enginesim.TypeDefault}
			cfg.Heartbeat = &enginesim.HeartbeatConfig{Interval: c.Heartbeat}
		}
		e, err := enginesim.New(cfg)
		if err == nil {
			err = e.Start()
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		engines = append(engines, e)
	}
	return engines, nil
}

// kvcarProc is the kvcar child process of one policy run.
type kvcarProc struct {
	cmd  *exec.Cmd
	base string
	log  string
	done chan error
}

// kvcarArgs are the flags kvcar gets besides the policy's.
type kvcarArgs struct {
	Binary    string
	Port      int
	Etcd      []string
	Namespace string
	Dir       string
	Policy    string
	// Extra flags, passed through as given (--car_prefill_lambda=…).
	Extra []string
}

// startKvcar writes the discovery config and starts kvcar with the
// policy under test, logging to a file in a.Dir.
func startKvcar(ctx context.Context, c clusterConfig, a kvcarArgs) (*kvcarProc, error) {
	cfgPath := filepath.Join(a.Dir, "kv_events_discovery_config.json")
	// discovery.block_size is what the index uses; it must be the
	// engines' block size.
	cfg := fmt.Sprintf(`{"discovery":{"enabled":true,"block_size":%d,"topic":"xllm-kv","event_port_offset":%d,"replay_port_offset":%d,"refresh_interval_ms":100}}`,
		c.BlockSize, enginesim.DefaultEventPortOffset, enginesim.DefaultReplayPortOffset)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("kvcar config: %w", err)
	}
	port := a.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(a.Dir, "kvcar-"+strings.ToLower(a.Policy)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kvcar log: %w", err)
	}
	defer logFile.Close()
	args := []string{
		"--port=" + strconv.Itoa(port), "--host=127.0.0.1", "--advertise_host=127.0.0.1",
		"--etcd_addr=" + strings.Join(a.Etcd, ","), "--etcd_namespace=" + a.Namespace,
		"--kv_events_config_file=" + cfgPath, "--load_balance_policy=" + a.Policy, "--log_level=warn",
	}
	args = append(args, a.Extra...)
	cmd := exec.CommandContext(ctx, a.Binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (build it with make build, or pass --kvcar): %w", a.Binary, err)
	}
	p := &kvcarProc{cmd: cmd, base: "http://127.0.0.1:" + strconv.Itoa(port), log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// stop ends kvcar with SIGTERM and waits for it.
func (p *kvcarProc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		return fmt.Errorf("kvcar did not stop within 15s after SIGTERM: %w", err)
	}
	return nil
}

// exited reports kvcar's exit when it has exited.
func (p *kvcarProc) exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		if err == nil {
			err = errors.New("exit status 0")
		}
		return true, err
	default:
		return false, nil
	}
}

// logTail returns the last lines of kvcar's log, for error messages.
func (p *kvcarProc) logTail(lines int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// waitReady waits until kvcar has synchronised every stream, every
// engine's heartbeat has been taken (so CAR and SLO_AWARE have loads),
// and a request through kvcar is answered. The probe request's prompt is
// shorter than a block, so no engine caches anything from it.
func waitReady(ctx context.Context, hc *http.Client, p *kvcarProc, engines []*enginesim.Engine, streams int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ok, err := p.exited(); ok {
			return fmt.Errorf("kvcar exited: %w\n%s", err, p.logTail(20))
		}
		last = readyOnce(ctx, hc, p.base, engines, streams)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("kvcar not ready within %v: %w\n%s", timeout, last, p.logTail(20))
}

func readyOnce(ctx context.Context, hc *http.Client, base string, engines []*enginesim.Engine, streams int) error {
	synced, err := syncedStreams(ctx, hc, base)
	if err != nil {
		return err
	}
	if synced != streams {
		return fmt.Errorf("%d of %d streams synchronised", synced, streams)
	}
	for _, e := range engines {
		if st := e.LastHeartbeatStatus(); st != http.StatusOK {
			return fmt.Errorf("engine %s: last heartbeat status %d", e.Name(), st)
		}
	}
	body := completionBody([]uint32{1}, 1)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("probe request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("probe request: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe request: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// syncedStreams counts the streams kvcar reports synchronised.
func syncedStreams(ctx context.Context, hc *http.Client, base string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/internal/kv-cache/query",
		strings.NewReader(`{"token_ids":[]}`))
	if err != nil {
		return 0, fmt.Errorf("query: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("query: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("query: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var out struct {
		Matches []struct {
			Synchronized bool `json:"synchronized"`
		} `json:"matches"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("query: %w", err)
	}
	n := 0
	for _, m := range out.Matches {
		if m.Synchronized {
			n++
		}
	}
	return n, nil
}

// freePort returns a loopback TCP port free right now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
