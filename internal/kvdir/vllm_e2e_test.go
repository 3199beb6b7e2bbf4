package kvdir

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// vllmShape is what vLLM 0.26 sends: tagged-map events with every field
// it writes for plain text, "GPU"/"CPU", 32-byte sha256 block hashes.
var vllmShape = kvevent.Shape{Hashes: kvevent.HashDigest32, UpperMedium: true, VLLMFields: true}

// sidecarRegister registers addr the way xllm-service's vllm_sidecar
// does: a lease, and under it XLLM:DEFAULT:<addr> holding
// {name, rpc_address, type 0, backend_type "vllm", incarnation_id,
// register_ts_ms}, kept alive without rewriting the key. It returns the
// incarnation id.
func sidecarRegister(t *testing.T, cli *clientv3.Client, addr string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lease, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	inc := "vllm-" + hex.EncodeToString(id[:])
	meta, err := json.Marshal(map[string]any{
		"name": addr, "rpc_address": addr, "type": 0, "backend_type": "vllm",
		"incarnation_id": inc, "register_ts_ms": time.Now().UnixMilli(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "XLLM:DEFAULT:"+addr, string(meta), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range ka { // drained until ctx ends
		}
	}()
	t.Cleanup(func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		_, _ = cli.Revoke(rctx, lease.ID)
		cancel()
		<-done
	})
	return inc
}

// vllmEngine starts an emulated vLLM server at 127.0.0.1:port whose KV
// event ports follow kvcar's discovery rule.
func vllmEngine(t *testing.T, port int, cfg enginesim.Config) *enginesim.Engine {
	t.Helper()
	cfg.BlockSize = testBlock
	if cfg.DeviceBlocks == 0 {
		cfg.DeviceBlocks = 64
	}
	cfg.Shape = vllmShape
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.DiscoveryOffsets = enginesim.DefaultDiscoveryOffsets()
	e, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// freeBase finds ports for ranks per-rank servers at base+r.
func freeBase(t *testing.T, ranks int) int {
	t.Helper()
	base, err := enginesim.FreeRankServersPort(ranks, enginesim.DefaultEventPortOffset, enginesim.DefaultReplayPortOffset)
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// The done-condition at the directory level (items 1, 2 and 4): a vLLM
// server registered by the sidecar with its default --kv-events-config
// (no replay endpoint, topic "") is discovered, reports nothing until it
// has sent something, then serves its prefix exactly; its stream says
// live and, seen from its first message, complete.
func TestVLLMSidecarInstanceLive(t *testing.T) {
	env := newDiscoveryEnvWith(t, 128, discoveryConfig4())
	e := vllmEngine(t, freeBase(t, 1), enginesim.Config{Replay: enginesim.ReplayNone})
	inc := sidecarRegister(t, env.client, e.Name())
	k := StreamKey{e.Name(), 0}
	eventually(t, "vLLM instance discovered", 10*time.Second, hasStreams(env, 1))
	s := env.dir.streamOf(k)
	if s.spec.SyncMode() != config.SyncLive || s.spec.ReplayEndpoint != "" || s.spec.Topic != "" || s.spec.Incarnation != inc {
		t.Fatalf("spec %#v", s.spec)
	}
	if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(1, 3*testBlock)
	if m := matchOf(t, env.dir, k, prompt); m.Synchronized {
		t.Fatalf("synchronised before the engine sent anything: %s", describe(m))
	}
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	m := waitCaughtUp(t, env.dir, e, 0)
	if !m.Complete || m.Incarnation != inc {
		t.Fatalf("match %s complete=%v incarnation %q", describe(m), m.Complete, m.Incarnation)
	}
	assertQueryMatchesOracle(t, env.dir, e, 0, prompt)
	assertQueryMatchesOracle(t, env.dir, e, 0, concat(prompt, seqTokens(900, testBlock)))
}

// A vLLM server with a replay endpoint at kvcar's replay port, a per-pod
// topic and vLLM 0.26's topic frames, that published before kvcar knew
// it: its history (from sequence 0) gives a complete view.
func TestVLLMSidecarInstanceHistory(t *testing.T) {
	d := discoveryConfig4()
	d.VLLMSyncMode, d.VLLMTopic = config.SyncHistory, "kv@{name}"
	env := newDiscoveryEnvWith(t, 128, d)
	port := freeBase(t, 1)
	name := fmt.Sprintf("127.0.0.1:%d", port)
	e := vllmEngine(t, port, enginesim.Config{Replay: enginesim.ReplayHistory, ReplayTopicFrames: true, Topic: "kv@" + name})
	prompt := seqTokens(1, 3*testBlock)
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	sidecarRegister(t, env.client, e.Name())
	k := StreamKey{e.Name(), 0}
	eventually(t, "vLLM instance discovered", 10*time.Second, hasStreams(env, 1))
	m := waitCaughtUp(t, env.dir, e, 0)
	if !m.Complete {
		t.Fatalf("history from sequence 0 is partial: %s", describe(m))
	}
	if s := env.dir.streamOf(k); s.spec.Topic != "kv@"+name || s.spec.ReplayEndpoint == "" {
		t.Fatalf("spec %#v", s.spec)
	}
	assertQueryMatchesOracle(t, env.dir, e, 0, prompt)
}

// Item 7: vLLM's external data parallelism runs rank r as its own HTTP
// server at port+r, registered by its own sidecar, tagging its batches
// with r and publishing at its configured endpoint port + r. Each rank
// is an instance with one stream; its batches' rank is accepted.
func TestVLLMPerRankServers(t *testing.T) {
	env := newDiscoveryEnvWith(t, 128, discoveryConfig4())
	base := freeBase(t, 2)
	var engines []*enginesim.Engine
	for r := range 2 {
		e := vllmEngine(t, base+r, enginesim.Config{Replay: enginesim.ReplayNone, DPRankBase: r})
		sidecarRegister(t, env.client, e.Name())
		engines = append(engines, e)
	}
	eventually(t, "both rank servers discovered", 10*time.Second, hasStreams(env, 2))
	for r, e := range engines {
		if got, want := e.EventEndpoint(0), fmt.Sprintf("tcp://127.0.0.1:%d", base+enginesim.DefaultEventPortOffset+r); got != want {
			t.Fatalf("rank %d publishes at %s, want %s (vLLM's endpoint + rank)", r, got, want)
		}
		if err := e.WaitSubscribed(t.Context(), 0, 1); err != nil {
			t.Fatal(err)
		}
		prompt := seqTokens(1000*r, 2*testBlock)
		if _, _, err := e.Prefill(0, prompt); err != nil {
			t.Fatal(err)
		}
		waitCaughtUp(t, env.dir, e, 0)
		assertQueryMatchesOracle(t, env.dir, e, 0, prompt)
	}
	if st := env.dir.streamOf(StreamKey{engines[1].Name(), 0}).report(time.Now()); st.DecodeErrors != 0 || st.Error != "" {
		t.Fatalf("rank 1 server: %+v", st)
	}
}
