// Command kvcar-demo runs a small local deployment: an embedded etcd,
// emulated xLLM engines and one vLLM server (registered as xllm-service's
// vllm_sidecar registers it, followed live) that register in it,
// heartbeat and publish KV events over TCP, the kvcar binary discovering and indexing them, and a
// load generator that asks kvcar where each prompt's prefix is cached,
// sends it there, and prints what kvcar predicted next to what the engine
// actually reused. With --tokenizer_path (make run fetches Qwen3's
// tokenizer files) kvcar and the engines share a real model's tokenizer
// and chat template, and multi-turn chat and text requests are routed by
// their token ids too.
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
	"strconv"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/tokenizer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "kvcar-demo:", err)
		os.Exit(1)
	}
}

type options struct {
	kvcar        string
	port         int
	internalPort int
	requests     int
	seed         uint64
	duration     time.Duration
	tokenizer    string
	out          io.Writer
}

// run runs the demo, printing to out, until ctx ends or the duration
// after the load has passed.
func run(ctx context.Context, args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("kvcar-demo", flag.ContinueOnError)
	fs.SetOutput(out)
	o := options{out: out}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary")
	fs.IntVar(&o.port, "port", 8888, "HTTP port for kvcar")
	fs.IntVar(&o.internalPort, "internal_port", 8890, "port of kvcar's internal listener on loopback (query API, status page, metrics)")
	fs.IntVar(&o.requests, "requests", 40, "prompts the load generator sends")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.DurationVar(&o.duration, "duration", 0, "how long to keep serving after the load (0: until interrupted)")
	fs.StringVar(&o.tokenizer, "tokenizer_path", "", "model tokenizer directory for kvcar and the engines, so chat and text requests are routed by their token ids; empty: only token-id prompts are")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var tok *tokenizer.Tokenizer
	// The demo shows each request's target and hit ratio, which kvcar sends
	// back only when asked to.
	kvcarArgs := []string{"--load_balance_policy=CAR", "--expose_routing_headers"}
	if o.tokenizer != "" {
		if tok, err = tokenizer.Load(o.tokenizer); err != nil {
			return fmt.Errorf("--tokenizer_path: %w", err)
		}
		if !tok.HasChatTemplate() {
			return fmt.Errorf("--tokenizer_path %s: no chat template", o.tokenizer)
		}
		kvcarArgs = append(kvcarArgs, "--tokenizer_path="+o.tokenizer)
		fmt.Fprintf(o.out, "tokenizer %s: %d tokens, with chat template\n", o.tokenizer, tok.VocabSize())
	} else {
		fmt.Fprintln(o.out, "no tokenizer: chat and text requests would be routed by load only (make run fetches one; see --tokenizer_path)")
	}

	const blockSize = 16
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return fmt.Errorf("embedded etcd: %w", err)
	}
	defer etcd.Close()
	fmt.Fprintf(out, "embedded etcd on %s\n", etcd.Endpoint())

	var cfgs []enginesim.Config
	for _, dp := range []int{1, 1, 1, 2} {
		cfgs = append(cfgs, devcluster.Discoverable(enginesim.Config{DPSize: dp, BlockSize: blockSize, DeviceBlocks: 256, HostBlocks: 512, Tokenizer: tok},
			etcd.Endpoints(), "", 0))
	}
	engines, err := devcluster.StartEngines(cfgs)
	if err != nil {
		return err
	}
	defer engines.Close()
	for _, e := range engines {
		fmt.Fprintf(out, "engine %s: %d DP rank(s), KV events on %s, replay on %s\n", e.Name(), e.DPSize(), e.EventEndpoint(0), e.ReplayEndpoint(0))
	}

	dir, err := os.MkdirTemp("", "kvcar-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfgPath, err := devcluster.WriteConfig(dir, devcluster.DiscoveryConfig(blockSize, 200*time.Millisecond))
	if err != nil {
		return err
	}
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: o.kvcar, Port: o.port, InternalPort: o.internalPort, Etcd: etcd.Endpoints(), ConfigFile: cfgPath,
		Args: kvcarArgs, Stdout: out, Stderr: os.Stderr,
	})
	if err != nil {
		return fmt.Errorf("%w (run make build first)", err)
	}
	defer func() { err = errors.Join(err, kv.Stop()) }()

	base := kv.URL()
	if err := kv.WaitSynced(ctx, engines.Streams(), 30*time.Second); err != nil {
		return err
	}
	// A vLLM server beside the xLLM engines, registered as xllm-service's
	// vllm_sidecar registers it and with vLLM's default
	// --kv-events-config: no replay endpoint, so kvcar follows it live.
	// Its heartbeats go to kvcar's internal listener, known only now.
	vllm, err := devcluster.StartEngines([]enginesim.Config{devcluster.VLLMSidecar(
		enginesim.Config{BlockSize: blockSize, DeviceBlocks: 256, HostBlocks: 512, Tokenizer: tok, Replay: enginesim.ReplayNone},
		etcd.Endpoints(), "", 0, kv.InternalURL())})
	if err != nil {
		return fmt.Errorf("vLLM engine: %w", err)
	}
	defer vllm.Close()
	vl := vllm[0]
	engines = append(engines, vl)
	fmt.Fprintf(out, "engine %s: vLLM (backend_type vllm, registered as the vllm_sidecar does, HTTP heartbeats to %s), live sync, KV events on %s, no replay endpoint\n",
		vl.Name(), kv.InternalURL(), vl.EventEndpoint(0))
	st, err := kv.WaitStream(ctx, vl.Name(), 30*time.Second)
	if err != nil {
		return err
	}
	// A live stream is synchronised by its first message, which only
	// counts once kvcar's subscription has reached the engine.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = vl.WaitSubscribed(sctx, 0, 1)
	cancel()
	if err != nil {
		return fmt.Errorf("vLLM engine %s: kvcar did not subscribe: %w", vl.Name(), err)
	}
	if err := engines.WaitHeartbeats(ctx, 30*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nkvcar is serving on %s with %d discovered streams from %d emulated engines (vLLM engine %s in %s mode, synchronised by its first KV event)\n",
		base, engines.Streams(), len(engines), vl.Name(), st.SyncMode)
	printTryIt(out, base, kv.InternalURL())

	if err := load(ctx, out, base, engines, vl, blockSize, o); err != nil {
		return err
	}
	if tok != nil {
		if err := chatLoad(ctx, base, engines, tok, o); err != nil {
			return err
		}
	}
	if err := printStreams(ctx, out, kv); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nkvcar keeps serving on %s; ", base)
	if o.duration > 0 {
		fmt.Fprintf(out, "stopping in %v\n", o.duration)
		select {
		case <-ctx.Done():
		case <-time.After(o.duration):
		}
	} else {
		fmt.Fprintln(out, "press Ctrl-C to stop")
		<-ctx.Done()
	}
	return nil
}

// load sends completions that share system prompts and grow as
// multi-turn sessions to kvcar, which routes each (CAR), sends it to the
// engine over baidu_std and answers from the engine's output; it prints
// where each went and what the engine reused.
func load(ctx context.Context, out io.Writer, base string, engines devcluster.Engines, vllm *enginesim.Engine, blockSize int, o options) error {
	rng := rand.New(rand.NewPCG(o.seed, 0))
	systems := make([][]uint32, 3)
	for i := range systems {
		systems[i] = randTokens(rng, 8*blockSize)
	}
	// The first system prompt goes straight to the vLLM engine, as a
	// client of that server would send it: its KV events synchronise
	// kvcar's live stream, and CAR then finds the prefix there.
	warm, err := complete(ctx, "http://"+vllm.Name(), engines, systems[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "warm-up: %d tokens (system prompt 1) sent straight to the vLLM engine %s, which cached %d of them\n",
		len(systems[0]), vllm.Name(), len(systems[0])/blockSize*blockSize-warm.Engine.DeviceHitTokens)
	sessions := make([][]uint32, 8)
	var reused, total int
	for i := range o.requests {
		s := rng.IntN(len(sessions))
		if sessions[s] == nil || rng.IntN(5) == 0 {
			sessions[s] = append([]uint32(nil), systems[rng.IntN(len(systems))]...)
		}
		sessions[s] = append(sessions[s], randTokens(rng, (1+rng.IntN(3))*blockSize)...)
		prompt := sessions[s]

		res, err := complete(ctx, base, engines, prompt)
		if err != nil {
			return err
		}
		reused += res.Engine.DeviceHitTokens + res.Engine.HostHitTokens
		total += len(prompt)
		via := ""
		if res.Relayed != nil {
			via = "  (vLLM, HTTP relay)"
		}
		fmt.Fprintf(out, "request %3d: %5d tokens -> %s dp%d  kvcar hit ratio %.2f, engine reused %5d (device %d, host %d)%s\n",
			i+1, len(prompt), res.prefill, res.Engine.DPRank, res.hitRatio,
			res.Engine.DeviceHitTokens+res.Engine.HostHitTokens, res.Engine.DeviceHitTokens, res.Engine.HostHitTokens, via)
		// Give the events of this prefill time to reach kvcar, as the
		// next turn of a session follows its answer.
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(out, "\n%d requests, %d prompt tokens: the engines reused %d (%.1f%% of prompt tokens)\n",
		o.requests, total, reused, 100*float64(reused)/float64(max(total, 1)))
	return nil
}

type completion struct {
	prefill  string
	hitRatio float64
	ID       string `json:"id"`
	Usage    struct {
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	// Engine is what the engine did for the request: its DP rank and the
	// tokens it reused per tier.
	Engine enginesim.EngineUsage
	// Relayed is the report an emulated engine adds to the answers it
	// sends through kvcar's HTTP relay.
	Relayed *enginesim.EngineUsage `json:"kvcar_engine"`
}

func complete(ctx context.Context, base string, engines devcluster.Engines, prompt []uint32) (completion, error) {
	return post(ctx, base+"/v1/completions", engines, map[string]any{"model": "enginesim", "max_tokens": 4, "prompt": prompt})
}

// post sends one OpenAI request through kvcar and reads where it went and
// what the engine reused: the answer's cached tokens, which the engine
// reported in its output, and the engine's own record of the request,
// kept under the answer's id, for the DP rank and the split per tier.
func post(ctx context.Context, url string, engines devcluster.Engines, request map[string]any) (completion, error) {
	body, _ := json.Marshal(request)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
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
		return completion{}, fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		return completion{}, fmt.Errorf("%s answer: %w", url, err)
	}
	c.prefill = resp.Header.Get("X-Prefill-Name")
	c.hitRatio, _ = strconv.ParseFloat(resp.Header.Get("X-Kvcar-Hit-Ratio"), 64)
	if c.Relayed != nil {
		// A vLLM engine, reached over the HTTP relay: its own answer
		// says what it did, and its usage has no cached tokens (vLLM
		// reports them only with --enable-prompt-tokens-details).
		c.Engine = *c.Relayed
		return c, nil
	}
	var ok bool
	if c.Engine, ok = engines.Served(c.ID); !ok {
		return completion{}, fmt.Errorf("%s: no engine served %q over baidu_std", url, c.ID)
	}
	if reused := c.Engine.DeviceHitTokens + c.Engine.HostHitTokens; reused != c.Usage.PromptTokensDetails.CachedTokens {
		return completion{}, fmt.Errorf("%s: the answer says %d cached tokens, the engine reused %d", url, c.Usage.PromptTokensDetails.CachedTokens, reused)
	}
	return c, nil
}

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150_000))
	}
	return t
}

// printTryIt prints commands for a new user to copy: the OpenAI path on
// kvcar's public listener, the query API and metrics on its internal one
// (loopback, no token in this deployment), and the status page. The
// command's test runs what it prints, so keep every JSON body sent with
// its Content-Type: curl -d alone sends a form type, which kvcar refuses.
func printTryIt(out io.Writer, public, internal string) {
	fmt.Fprintf(out, "send requests:  curl -sS %s/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"enginesim\",\"prompt\":[1,2,3],\"max_tokens\":4}'\n", public)
	fmt.Fprintf(out, "query endpoint: curl -sS %s/v1/internal/kv-cache/query -H 'Content-Type: application/json' -d '{\"token_ids\":[]}'\n", internal)
	fmt.Fprintf(out, "metrics:        curl -sS %s/metrics\n", internal)
	fmt.Fprintf(out, "status page:    %s/debug/kvcar (open it in a browser)\n\n", internal)
}

// printStreams prints every stream kvcar follows: its instance, sync
// mode and whether its view is synchronised and complete.
func printStreams(ctx context.Context, out io.Writer, kv *devcluster.KVCar) error {
	states, err := kv.StreamStates(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nkvcar's streams:")
	for _, s := range states {
		fmt.Fprintf(out, "  %s dp%d: %s mode, synchronized %v, complete %v, %d device and %d host blocks\n",
			s.Instance, s.DPRank, s.SyncMode, s.Synchronized, s.Complete, s.DeviceBlocks, s.HostBlocks)
	}
	return nil
}
