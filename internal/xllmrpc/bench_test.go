package xllmrpc

import (
	"context"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/closedloop"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

// The recorded engine heartbeat message (golden heartbeat.req.bin).
const benchHeartbeat = "0a0f3132372e302e302e313a31383030301a070807150000803e22040878101e3205696e632d31"

// benchCluster is startCluster for benchmarks: one registered instance,
// "127.0.0.1:18000" incarnation "inc-1", the name in the recorded
// heartbeat.
func benchCluster(b *testing.B) *cluster {
	b.Helper()
	c := startCluster(b, "127.0.0.1:8889")
	c.register(b, instance.Default, "127.0.0.1:18000", "inc-1", nil)
	return c
}

// Heartbeats over baidu_std, as engines send them: each goroutine one
// engine's connection, calls one after the other; b.N heartbeats in all.
// ns/op is wall time per heartbeat at that concurrency, so 1e9/ns is the
// rate one kvcar sustains; allocs/op counts client and server together,
// both in this process.
func BenchmarkHeartbeatOverBaiduStd(b *testing.B) {
	c := benchCluster(b)
	msg, _ := hex.DecodeString(benchHeartbeat)
	for _, conns := range []int{1, 16, 128} {
		b.Run(connsName(conns), func(b *testing.B) {
			clients := make([]*baidustd.Client, conns)
			for i := range clients {
				clients[i] = baidustd.NewClient(c.rpcAddr, baidustd.ClientOptions{})
				defer clients[i].Close()
				if _, err := clients[i].Call(context.Background(), xllmpb.RPCService, xllmpb.MethodHeartbeat, msg, nil); err != nil {
					b.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			per := b.N / conns
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range conns {
				n := per
				if i == 0 {
					n += b.N % conns
				}
				wg.Go(func() {
					var st xservicepb.Status
					for range n {
						r, err := clients[i].Call(context.Background(), xllmpb.RPCService, xllmpb.MethodHeartbeat, msg, nil)
						if err != nil || proto.Unmarshal(r.Message, &st) != nil || !st.Ok {
							b.Error("heartbeat not taken", err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "heartbeats/s")
		})
	}
}

func connsName(n int) string { return "conns=" + itoa(n) }

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// The service's own cost of one heartbeat, without the network: decode
// the recorded message, apply it to the registry, encode the Status.
func BenchmarkHeartbeatHandler(b *testing.B) {
	c := benchCluster(b)
	msg, _ := hex.DecodeString(benchHeartbeat)
	h := baidustd.Unary(NewService(c.reg, c.outputs, nil).heartbeat)
	req := &baidustd.Request{Service: xllmpb.RPCService, Method: xllmpb.MethodHeartbeat, Message: msg}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// dispatchRig is one engine serving requests with no emulated cost, and
// the two ways kvcar can reach it: baidu_std through the Dispatcher, and
// an HTTP relay (httputil.ReverseProxy standing in for kvcar's relay).
type dispatchRig struct {
	viaRPC  *httptest.Server
	viaHTTP *httptest.Server
}

func newDispatchRig(b *testing.B) *dispatchRig {
	b.Helper()
	x := startE2E(b, 0)
	e, err := enginesim.New(enginesim.Config{HTTPAddr: "127.0.0.1:0", TimeScale: 1e-9, DeviceBlocks: 4096, BlockSize: 16,
		BatchSlots: 256, MaxQueue: 4096})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	// The engine is not registered in etcd: a dispatcher without the
	// registry's liveness checks.
	disp, err := NewDispatcher(DispatcherOptions{Self: x.rpcAddr, Outputs: x.outputs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { disp.Close() })
	rig := &dispatchRig{}
	rig.viaRPC = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_ = disp.Serve(r.Context(), Request{Body: body, Prefill: e.Name()}, w)
	}))
	b.Cleanup(rig.viaRPC.Close)
	target, _ := url.Parse("http://" + e.HTTPAddr())
	relay := httputil.NewSingleHostReverseProxy(target)
	relay.Transport = &http.Transport{MaxIdleConnsPerHost: 128}
	rig.viaHTTP = httptest.NewServer(relay)
	b.Cleanup(rig.viaHTTP.Close)
	return rig
}

// Dispatch overhead: a one-token completion of a 64-token prompt through
// kvcar to an engine that costs nothing, over baidu_std (Completions
// plus one Generations call back) against an HTTP relay, at concurrency
// 1 and 64. Reports p50 and p99 latency per request.
func BenchmarkDispatch(b *testing.B) {
	rig := newDispatchRig(b)
	ids := make([]int, 64)
	for i := range ids {
		ids[i] = i + 1
	}
	body := []byte(`{"model":"m","max_tokens":1,"prompt":[` + joinInts(ids) + `]}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	for _, path := range []struct{ name, url string }{{"baidu_std", rig.viaRPC.URL}, {"http_relay", rig.viaHTTP.URL}} {
		for _, conc := range []int{1, 64} {
			b.Run(path.name+"/concurrency="+itoa(conc), func(b *testing.B) { closedloop.Run(b, client, path.url+"/v1/completions", body, conc) })
		}
	}
}

// Streamed output over baidu_std: 16 tokens of a 64-token prompt, each a
// Generations call from the engine that kvcar writes to the client as an
// SSE event, at concurrency 16. ns/op is wall time per request with the
// engine, kvcar and the client on the same cores, so its changes are
// the costs per token of whichever side changed.
func BenchmarkDispatchStreamed(b *testing.B) {
	rig := newDispatchRig(b)
	ids := make([]int, 64)
	for i := range ids {
		ids[i] = i + 1
	}
	body := []byte(`{"model":"m","max_tokens":16,"stream":true,"prompt":[` + joinInts(ids) + `]}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	b.Run("concurrency=16", func(b *testing.B) { closedloop.Run(b, client, rig.viaRPC.URL+"/v1/completions", body, 16) })
}

func joinInts(v []int) string {
	var b []byte
	for i, n := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, n)
	}
	return string(b)
}

// BenchmarkPackedIDs measures writing a prompt's token ids into the
// xLLM request, ids drawn at random from a 151,936-token vocabulary (one
// to three bytes each, mostly three), in a reused buffer.
func BenchmarkPackedIDs(b *testing.B) {
	for _, n := range []int{2048, 16384} {
		b.Run("ids="+itoa(n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			ids := make([]uint32, n)
			for i := range ids {
				ids[i] = uint32(rng.IntN(151_936))
			}
			var dst []byte
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				dst = appendPackedIDs(dst[:0], completionTokenIDsField, ids)
			}
		})
	}
}

// Generations over baidu_std, as an engine returns a request's output:
// each goroutine one engine's connection, calling with the recorded
// message's shape (two outputs with text, token ids and finish reasons,
// and usage) for a request of its own that kvcar is waiting for, which
// takes what was delivered after every call. ns/op is wall time per
// call at that concurrency; allocs/op counts client and server together,
// both in this process.
func BenchmarkGenerationsOverBaiduStd(b *testing.B) {
	c := benchCluster(b)
	for _, conns := range []int{1, 16} {
		b.Run(connsName(conns), func(b *testing.B) {
			type engine struct {
				client *baidustd.Client
				msg    []byte
				q      *outputQueue
			}
			engines := make([]engine, conns)
			for i := range engines {
				id := "bench-" + itoa(i)
				q, err := c.outputs.open(id)
				if err != nil {
					b.Fatal(err)
				}
				defer c.outputs.close(id, q)
				msg, err := proto.Marshal(&xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{{
					ReqId: "cmpl-" + itoa(i), ServiceReqId: id, GenStatus: &xllmpb.GenerationStatus{},
					Outputs: []*xllmpb.SequenceOutput{
						{Text: "Hello", TokenIds: []int32{9906}, FinishReason: "stop"},
						{Index: 1, Text: "Hi", TokenIds: []int32{13347}, FinishReason: "stop"},
					},
					Usage: &xllmpb.OutputUsage{NumPromptTokens: 4, NumGeneratedTokens: 2, NumTotalTokens: 6}, Finished: true,
				}}})
				if err != nil {
					b.Fatal(err)
				}
				cl := baidustd.NewClient(c.rpcAddr, baidustd.ClientOptions{})
				defer cl.Close()
				engines[i] = engine{client: cl, msg: msg, q: q}
			}
			var wg sync.WaitGroup
			per := b.N / conns
			b.ReportAllocs()
			b.ResetTimer()
			for i := range engines {
				n := per
				if i == 0 {
					n += b.N % conns
				}
				e := engines[i]
				wg.Go(func() {
					var st xllmpb.StatusSet
					for range n {
						r, err := e.client.Call(context.Background(), xllmpb.RPCService, xllmpb.MethodGenerations, e.msg, nil)
						if err != nil || proto.Unmarshal(r.Message, &st) != nil || len(st.AllStatus) != 1 || !st.AllStatus[0].Ok {
							b.Error("generation not taken", err)
							return
						}
						if gens, err := e.q.take(); err != nil || len(gens) != 1 {
							b.Errorf("took %d generations (%v), want 1", len(gens), err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
