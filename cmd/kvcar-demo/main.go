// Command kvcar-demo runs a small local deployment: an embedded etcd,
// emulated xLLM engines that register in it, heartbeat and publish KV
// events over TCP, the kvcar binary discovering and indexing them, and a
// load generator that asks kvcar where each prompt's prefix is cached,
// sends it there, and prints what kvcar predicted next to what the engine
// actually reused.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "kvcar-demo:", err)
		os.Exit(1)
	}
}

type options struct {
	kvcar    string
	port     int
	requests int
	seed     uint64
	duration time.Duration
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvcar-demo", flag.ContinueOnError)
	o := options{}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary")
	fs.IntVar(&o.port, "port", 8888, "HTTP port for kvcar")
	fs.IntVar(&o.requests, "requests", 40, "prompts the load generator sends")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.DurationVar(&o.duration, "duration", 0, "how long to keep serving after the load (0: until interrupted)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	const blockSize = 16
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return fmt.Errorf("embedded etcd: %w", err)
	}
	defer etcd.Close()
	fmt.Printf("embedded etcd on %s\n", etcd.Endpoint())

	engines, err := startEngines(blockSize, etcd.Endpoints())
	if err != nil {
		return err
	}
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()

	dir, err := os.MkdirTemp("", "kvcar-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfgPath := filepath.Join(dir, "kv_events_discovery_config.json")
	cfg := fmt.Sprintf(`{"discovery":{"enabled":true,"block_size":%d,"topic":"xllm-kv","event_port_offset":10000,"replay_port_offset":30000,"refresh_interval_ms":200}}`, blockSize)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}

	cmd := exec.CommandContext(ctx, o.kvcar, fmt.Sprintf("--port=%d", o.port), "--advertise_host=127.0.0.1", "--load_balance_policy=CAR",
		"--etcd_addr="+strings.Join(etcd.Endpoints(), ","), "--kv_events_config_file="+cfgPath)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s (run make build first): %w", o.kvcar, err)
	}
	defer cmd.Wait()

	base := fmt.Sprintf("http://127.0.0.1:%d", o.port)
	if err := waitReady(ctx, base, len(streamsOf(engines))); err != nil {
		return err
	}
	// CAR schedules only instances with a first load report.
	for _, e := range engines {
		for e.LastHeartbeatStatus() != http.StatusOK {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	fmt.Printf("\nkvcar is serving on %s with %d discovered streams from %d emulated engines\n", base, len(streamsOf(engines)), len(engines))
	fmt.Printf("send requests:  curl -sS %s/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"enginesim\",\"prompt\":[1,2,3],\"max_tokens\":4}'\n", base)
	fmt.Printf("query endpoint: curl -sS %s/v1/internal/kv-cache/query -d '{\"token_ids\":[]}'\n", base)
	fmt.Printf("metrics:        curl -sS %s/metrics\n\n", base)

	if err := load(ctx, base, blockSize, o); err != nil {
		return err
	}
	fmt.Printf("\nkvcar keeps serving on %s; ", base)
	if o.duration > 0 {
		fmt.Printf("stopping in %v\n", o.duration)
		select {
		case <-ctx.Done():
		case <-time.After(o.duration):
		}
	} else {
		fmt.Println("press Ctrl-C to stop")
		<-ctx.Done()
	}
	return nil
}

func startEngines(blockSize int, etcd []string) ([]*enginesim.Engine, error) {
	var engines []*enginesim.Engine
	for i, dp := range []int{1, 1, 1, 2} {
		e, err := enginesim.New(enginesim.Config{
			DPSize: dp, BlockSize: blockSize, DeviceBlocks: 256, HostBlocks: 512, Topic: "xllm-kv",
			DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
			Etcd:             &enginesim.EtcdConfig{Endpoints: etcd, Type: enginesim.TypeDefault},
			Heartbeat:        &enginesim.HeartbeatConfig{},
			Logger:           slog.New(slog.DiscardHandler),
		})
		if err == nil {
			err = e.Start()
		}
		if err != nil {
			for _, o := range engines {
				o.Close()
			}
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		fmt.Printf("engine %s: %d DP rank(s), KV events on %s, replay on %s\n", e.Name(), dp, e.EventEndpoint(0), e.ReplayEndpoint(0))
		engines = append(engines, e)
	}
	return engines, nil
}

type streamRef struct {
	e  *enginesim.Engine
	dp int
}

func streamsOf(engines []*enginesim.Engine) []streamRef {
	var out []streamRef
	for _, e := range engines {
		for dp := range e.DPSize() {
			out = append(out, streamRef{e, dp})
		}
	}
	return out
}

type match struct {
	InstanceName         string `json:"instance_name"`
	DPRank               int    `json:"dp_rank"`
	Synchronized         bool   `json:"synchronized"`
	DeviceHitTokens      int    `json:"device_hit_tokens"`
	HostOnlyHitTokens    int    `json:"host_only_hit_tokens"`
	ReusablePrefixTokens int    `json:"reusable_prefix_tokens"`
}

func queryKV(ctx context.Context, base string, tokens []uint32) ([]match, error) {
	body, _ := json.Marshal(map[string][]uint32{"token_ids": tokens})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/internal/kv-cache/query", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Matches []match `json:"matches"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("query: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	return out.Matches, nil
}

func waitReady(ctx context.Context, base string, streams int) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ms, err := queryKV(ctx, base, []uint32{})
		if err == nil && len(ms) == streams {
			synced := 0
			for _, m := range ms {
				if m.Synchronized {
					synced++
				}
			}
			if synced == streams {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("kvcar did not synchronise every stream within 30s")
}

// load sends completions that share system prompts and grow as
// multi-turn sessions to kvcar, which routes each (CAR) and relays the
// engine's answer; it prints where each went and what the engine reused.
func load(ctx context.Context, base string, blockSize int, o options) error {
	rng := rand.New(rand.NewPCG(o.seed, 0))
	systems := make([][]uint32, 3)
	for i := range systems {
		systems[i] = randTokens(rng, 8*blockSize)
	}
	sessions := make([][]uint32, 8)
	var reused, total int
	for i := range o.requests {
		s := rng.IntN(len(sessions))
		if sessions[s] == nil || rng.IntN(5) == 0 {
			sessions[s] = append([]uint32(nil), systems[rng.IntN(len(systems))]...)
		}
		sessions[s] = append(sessions[s], randTokens(rng, (1+rng.IntN(3))*blockSize)...)
		prompt := sessions[s]

		res, err := complete(ctx, base, prompt)
		if err != nil {
			return err
		}
		reused += res.Engine.DeviceHitTokens + res.Engine.HostHitTokens
		total += len(prompt)
		fmt.Printf("request %3d: %5d tokens -> %s dp%d  kvcar hit ratio %.2f, engine reused %5d (device %d, host %d)\n",
			i+1, len(prompt), res.prefill, res.Engine.DPRank, res.hitRatio,
			res.Engine.DeviceHitTokens+res.Engine.HostHitTokens, res.Engine.DeviceHitTokens, res.Engine.HostHitTokens)
		// Give the events of this prefill time to reach kvcar, as the
		// next turn of a session follows its answer.
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Printf("\n%d requests, %d prompt tokens: the engines reused %d (%.1f%% of prompt tokens)\n",
		o.requests, total, reused, 100*float64(reused)/float64(max(total, 1)))
	return nil
}

type completion struct {
	prefill  string
	hitRatio float64
	Engine   enginesim.EngineUsage `json:"kvcar_engine"`
}

func complete(ctx context.Context, base string, prompt []uint32) (completion, error) {
	body, _ := json.Marshal(map[string]any{"model": "enginesim", "max_tokens": 4, "prompt": prompt})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return completion{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return completion{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return completion{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return completion{}, fmt.Errorf("completion: %s: %s", resp.Status, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		return completion{}, fmt.Errorf("completion answer: %w", err)
	}
	c.prefill = resp.Header.Get("X-Prefill-Name")
	c.hitRatio, _ = strconv.ParseFloat(resp.Header.Get("X-Kvcar-Hit-Ratio"), 64)
	return c, nil
}

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150_000))
	}
	return t
}
