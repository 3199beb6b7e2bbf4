// Command kvcar-scale measures how many streams one kvcar process
// sustains: it starts an embedded etcd and N emulated engines that
// register, heartbeat and publish KV events at a steady rate, runs the
// kvcar binary with discovery, and reports the time until every stream is
// synchronised, kvcar's CPU use and memory under the load, event
// throughput, and query latency over HTTP.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/kvdir"
	"github.com/kvcar/kvcar/internal/kvevent"
)

type options struct {
	kvcar        string
	port         int
	internalPort int
	streams      int
	rate         float64
	duration     time.Duration
	blockSize    int
	promptBlocks int
	queries      int
	seed         uint64
	adversarial  bool
	maxBlocks    int
	maxMessage   int
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "kvcar-scale:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) (err error) {
	fs := flag.NewFlagSet("kvcar-scale", flag.ContinueOnError)
	o := options{}
	self, _ := os.Executable()
	fs.StringVar(&o.kvcar, "kvcar", filepath.Join(filepath.Dir(self), "kvcar"), "path of the kvcar binary")
	fs.IntVar(&o.port, "port", 18888, "HTTP port for kvcar")
	fs.IntVar(&o.internalPort, "internal_port", 18890, "port of kvcar's internal listener on loopback: the timed queries, /debug/pprof")
	fs.IntVar(&o.streams, "streams", 128, "emulated engines (one DP rank, so one stream, each)")
	fs.Float64Var(&o.rate, "rate", 5, "prefills per second per engine")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "length of the measured load window")
	fs.IntVar(&o.blockSize, "block_size", 128, "tokens per block")
	fs.IntVar(&o.promptBlocks, "prompt_blocks", 8, "new blocks per prefill")
	fs.IntVar(&o.queries, "queries", 200, "HTTP queries timed at the end (8k-token prompts)")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.BoolVar(&o.adversarial, "adversarial", false, "engines publish to exhaust kvcar's limits: messages at and over max_message_bytes, chains past max_blocks_per_stream, repeated AllBlocksCleared")
	fs.IntVar(&o.maxBlocks, "max_blocks_per_stream", 262144, "kvcar's max_blocks_per_stream")
	fs.IntVar(&o.maxMessage, "max_message_bytes", 8<<20, "kvcar's max_message_bytes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.streams < 1 || o.streams > 128 {
		return fmt.Errorf("--streams = %d: must be in [1, 128]", o.streams)
	}

	etcd, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return err
	}
	defer etcd.Close()

	var cfgs []enginesim.Config
	for range o.streams {
		cfgs = append(cfgs, devcluster.Discoverable(enginesim.Config{BlockSize: o.blockSize, DeviceBlocks: 8192}, etcd.Endpoints(), "", time.Second))
	}
	engines, err := devcluster.StartEngines(cfgs)
	if err != nil {
		return err
	}
	defer engines.Close()

	dir, err := os.MkdirTemp("", "kvcar-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := devcluster.DiscoveryConfig(o.blockSize, 200*time.Millisecond)
	cfg.MaxStreams, cfg.MaxBlocksPerStream, cfg.MaxMessageBytes, cfg.MaxBufferedBytes = 128, o.maxBlocks, o.maxMessage, 2*o.maxMessage
	cfgPath, err := devcluster.WriteConfig(dir, cfg)
	if err != nil {
		return err
	}
	began := time.Now()
	kv, err := devcluster.StartKVCar(devcluster.KVCarOptions{
		Binary: o.kvcar, Port: o.port, InternalPort: o.internalPort, Etcd: etcd.Endpoints(), ConfigFile: cfgPath,
		Args: []string{"--log_level=warn"}, Stdout: os.Stdout, Stderr: os.Stderr,
	})
	if err != nil {
		return fmt.Errorf("%w (run make build first)", err)
	}
	defer func() { err = errors.Join(err, kv.Stop()) }()
	// Queries and profiles are on the internal listener.
	base := kv.InternalURL()
	if err := kv.WaitSynced(ctx, o.streams, 60*time.Second); err != nil {
		return err
	}
	syncTook := time.Since(began)

	cpu0, err := devcluster.CPUTime(kv.Pid())
	if err != nil {
		return err
	}
	self0, err := devcluster.CPUTime(os.Getpid())
	if err != nil {
		return err
	}
	t0 := time.Now()
	var blocks int64
	if o.adversarial {
		blocks = attack(ctx, engines, o)
	} else {
		blocks = drive(ctx, engines, o)
	}
	wall := time.Since(t0)
	cpu1, err := devcluster.CPUTime(kv.Pid())
	if err != nil {
		return err
	}
	self1, err := devcluster.CPUTime(os.Getpid())
	if err != nil {
		return err
	}
	rss, hwm, err := devcluster.Memory(kv.Pid())
	if err != nil {
		return err
	}
	lat, srv, synced, resident, err := timeQueries(ctx, base, o)
	if err != nil {
		return err
	}

	fmt.Printf("\nkvcar-scale: %d streams, %.1f prefills/s each of %d new %d-token blocks, %v window\n",
		o.streams, o.rate, o.promptBlocks, o.blockSize, wall.Round(time.Millisecond))
	fmt.Printf("| measure | value |\n|---|---|\n")
	fmt.Printf("| kvcar start to all %d streams synchronised | %v |\n", o.streams, syncTook.Round(time.Millisecond))
	what := "blocks stored by the engines during the window"
	if o.adversarial {
		what = "blocks sent in at-limit messages and over-long chains (over-limit messages not counted)"
	}
	fmt.Printf("| %s | %d (%.0f blocks/s) |\n", what, blocks, float64(blocks)/wall.Seconds())
	fmt.Printf("| kvcar CPU during the window | %.1f%% of one core |\n", 100*(cpu1-cpu0).Seconds()/wall.Seconds())
	fmt.Printf("| this driver's CPU (etcd + emulated engines) in the window, on the same 2 cores | %.1f%% of one core |\n", 100*(self1-self0).Seconds()/wall.Seconds())
	fmt.Printf("| kvcar resident memory (now / peak) | %.1f MiB / %.1f MiB |\n", float64(rss)/(1<<20), float64(hwm)/(1<<20))
	bound := kvdir.LimitsFromConfig(&cfg).MemoryBound().Process(o.streams)
	fmt.Printf("| memory the config allows above kvcar's own (kvdir.MemoryBound for %d streams) | %.1f MiB |\n", o.streams, float64(bound)/(1<<20))
	fmt.Printf("| streams synchronised after the window | %d of %d |\n", synced, o.streams)
	fmt.Printf("| resident Device blocks kvcar reports | %d |\n", resident)
	fmt.Printf("| HTTP query, 8k tokens over all streams, kvcar's own time (Server-Timing): p50 / p99 | %v / %v |\n", srv[len(srv)/2], srv[len(srv)*99/100])
	fmt.Printf("| same, seen by this driver's client (includes its own CPU contention): p50 / p99 | %v / %v |\n", lat[len(lat)/2], lat[len(lat)*99/100])
	return nil
}

// attack makes every engine publish what costs a subscriber the most:
// messages just under and just over max_message_bytes, chains longer
// than max_blocks_per_stream, and AllBlocksCleared, in turn, as fast as
// it can for o.duration.
func attack(ctx context.Context, engines []*enginesim.Engine, o options) int64 {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	// Bytes of msgpack per block: ~3 per token plus the hash.
	perBlock := 3*o.blockSize + 9
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.seed, uint64(i+1)))
			for step := 0; ctx.Err() == nil; step++ {
				var err error
				switch step % 4 {
				case 0:
					err = e.SendOversize(0, o.maxMessage-perBlock*4)
					total.Add(int64(o.maxMessage / perBlock))
				case 1:
					err = e.SendOversize(0, 2*o.maxMessage) // refused by libzmq, link dropped
				case 2:
					n := min(o.maxBlocks+64, (o.maxMessage/perBlock)-8)
					_, err = e.StoreChain(0, tokens(rng, n*o.blockSize), kvevent.Device)
					total.Add(int64(n))
				default:
					err = e.Clear(0)
				}
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return total.Load()
}

// drive makes every engine prefill at o.rate for o.duration: a shared
// system prompt plus fresh blocks, so the engines store and evict.
func drive(ctx context.Context, engines []*enginesim.Engine, o options) int64 {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
	)
	system := tokens(rand.New(rand.NewPCG(o.seed, 0)), 4*o.blockSize)
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.seed, uint64(i+1)))
			tick := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
			defer tick.Stop()
			var n int64
			for {
				select {
				case <-ctx.Done():
					mu.Lock()
					total += n
					mu.Unlock()
					return
				case <-tick.C:
				}
				prompt := append(slices.Clip(system), tokens(rng, o.promptBlocks*o.blockSize)...)
				if _, _, err := e.Prefill(0, prompt); err == nil {
					n += int64(o.promptBlocks)
				}
			}
		}()
	}
	wg.Wait()
	return total
}

func tokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(150_000))
	}
	return t
}

type match struct {
	Synchronized bool `json:"synchronized"`
	DeviceBlocks int  `json:"device_blocks"`
}

func queryKV(ctx context.Context, base string, ids []uint32) ([]match, error) {
	ms, _, err := queryTimed(ctx, base, ids)
	return ms, err
}

// queryTimed also returns kvcar's own time for the query, from its
// Server-Timing header.
func queryTimed(ctx context.Context, base string, ids []uint32) ([]match, time.Duration, error) {
	body, _ := json.Marshal(map[string][]uint32{"token_ids": ids})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/internal/kv-cache/query", bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, 0, fmt.Errorf("query: %s: %s", resp.Status, b)
	}
	var out struct {
		Matches []match `json:"matches"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, 0, err
	}
	var server time.Duration
	if v, ok := strings.CutPrefix(resp.Header.Get("Server-Timing"), "kvcar;dur="); ok {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			server = time.Duration(ms * float64(time.Millisecond))
		}
	}
	return out.Matches, server, nil
}

func timeQueries(ctx context.Context, base string, o options) (client, server []time.Duration, synced, resident int, err error) {
	rng := rand.New(rand.NewPCG(o.seed, 999))
	prompt := tokens(rng, 8192)
	for range o.queries {
		t := time.Now()
		_, st, err := queryTimed(ctx, base, prompt)
		if err != nil {
			return nil, nil, 0, 0, err
		}
		client = append(client, time.Since(t))
		server = append(server, st)
	}
	slices.Sort(client)
	slices.Sort(server)
	ms, err := queryKV(ctx, base, []uint32{})
	if err != nil {
		return nil, nil, 0, 0, err
	}
	for _, m := range ms {
		if m.Synchronized {
			synced++
		}
		resident += m.DeviceBlocks
	}
	return client, server, synced, resident, nil
}
