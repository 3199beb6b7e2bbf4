package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
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

// startEngines starts a fresh set of engines, registered in etcd under
// namespace when etcd is not empty (kvcar discovers them there). Each
// serves its OpenAI path on a free loopback port from which the
// discovery rule derives its KV endpoints.
func startEngines(c clusterConfig, etcd []string, namespace string) (devcluster.Engines, error) {
	var cfgs []enginesim.Config
	for i, dp := range c.EngineDP {
		cfg := enginesim.Config{
			DPSize: dp, BlockSize: c.BlockSize, DeviceBlocks: c.DeviceBlocks,
			TimeScale: c.TimeScale, PrefillPerToken: c.PrefillPerToken, DecodePerToken: c.DecodePerToken,
			BatchSlots: c.BatchSlots,
			// The whole workload may queue on one engine.
			MaxQueue: 1 << 16,
		}
		if i < c.HostEngines {
			cfg.HostBlocks = c.HostBlocks
		}
		cfgs = append(cfgs, devcluster.Discoverable(cfg, etcd, namespace, c.Heartbeat))
	}
	return devcluster.StartEngines(cfgs)
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
// policy under test, logging to a file in a.Dir whose path it returns.
func startKvcar(c clusterConfig, a kvcarArgs) (*devcluster.KVCar, string, error) {
	cfgPath, err := devcluster.WriteConfig(a.Dir, devcluster.DiscoveryConfig(c.BlockSize, 100*time.Millisecond))
	if err != nil {
		return nil, "", err
	}
	logPath := filepath.Join(a.Dir, "kvcar-"+strings.ToLower(a.Policy)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", fmt.Errorf("kvcar log: %w", err)
	}
	// kvcar writes to its own descriptor of the file.
	defer logFile.Close()
	// The decision time is read from kvcar's X-Kvcar-Decision-Us header,
	// which binaries that have --expose_routing_headers send only with it
	// (bench adds it to Extra then).
	args := append([]string{"--host=127.0.0.1", "--load_balance_policy=" + a.Policy, "--log_level=warn"}, a.Extra...)
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: a.Binary, Port: a.Port, Etcd: a.Etcd, Namespace: a.Namespace, ConfigFile: cfgPath,
		Args: args, Stdout: logFile, Stderr: logFile,
	})
	if err != nil {
		return nil, "", fmt.Errorf("%w (build it with make build, or pass --kvcar)", err)
	}
	return kv, logPath, nil
}

// logTail returns the last lines of kvcar's log, for error messages.
func logTail(path string, lines int) string {
	b, err := os.ReadFile(path)
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
func waitReady(ctx context.Context, hc *http.Client, kv *devcluster.KVCar, logPath string, engines devcluster.Engines, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	fail := func(err error) error { return fmt.Errorf("kvcar not ready: %w\n%s", err, logTail(logPath, 20)) }
	if err := kv.WaitSynced(ctx, engines.Streams(), timeout); err != nil {
		return fail(err)
	}
	if err := engines.WaitHeartbeats(ctx, time.Until(deadline)); err != nil {
		return fail(err)
	}
	for {
		if err := kv.Exited(); err != nil {
			return fail(err)
		}
		err := probeRequest(ctx, hc, kv.URL())
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("not within %v: %w", timeout, err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func probeRequest(ctx context.Context, hc *http.Client, base string) error {
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
