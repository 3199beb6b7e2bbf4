package xllmrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

const waitLimit = 15 * time.Second

func testLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("KVCAR_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// cluster is a real embedded etcd, a running instance registry on it and
// kvcar's RPC service on a loopback port.
type cluster struct {
	etcd    *etcdembed.Server
	cli     *clientv3.Client
	reg     *instance.Registry
	outputs *Outputs
	rpcAddr string
	srv     *baidustd.Server
}

// startCluster starts a cluster whose error texts carry identity; an
// empty identity makes the registry take part in the master election
// with the rpc address, as kvcar runs it, which is then the identity.
func startCluster(t testing.TB, identity string) *cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{etcd: etcd, cli: cli, outputs: NewOutputs(0, 0), rpcAddr: ln.Addr().String()}
	opts := instance.Options{Client: cli, Logger: testLogger()}
	if identity == "" {
		identity, opts.SelfAddr = c.rpcAddr, c.rpcAddr
	}
	if c.reg, err = instance.New(opts); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.reg.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-done })

	c.srv = baidustd.NewServer(baidustd.ServerOptions{Identity: identity, Logger: testLogger()})
	if err := NewService(c.reg, c.outputs, testLogger()).Register(c.srv); err != nil {
		t.Fatal(err)
	}
	go c.srv.Serve(ln)
	t.Cleanup(func() { c.srv.Close() })
	return c
}

// register puts an instance key as an engine writes it.
func (c *cluster) register(t testing.TB, typ instance.Type, name, incarnation string, extra map[string]any) {
	t.Helper()
	meta := map[string]any{"name": name, "rpc_address": name + "-rpc", "type": int(typ), "incarnation_id": incarnation}
	for k, v := range extra {
		meta[k] = v
	}
	b, _ := json.Marshal(meta)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.cli.Put(ctx, "XLLM:"+typ.String()+":"+name, string(b)); err != nil {
		t.Fatal(err)
	}
	c.wait(t, name+" registered", func(s *instance.Snapshot) bool { _, ok := s.Lookup(name); return ok })
}

func (c *cluster) wait(t testing.TB, what string, pred func(*instance.Snapshot) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := c.reg.WaitFor(ctx, pred); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (c *cluster) client(t *testing.T) *baidustd.Client {
	cl := baidustd.NewClient(c.rpcAddr, baidustd.ClientOptions{})
	t.Cleanup(func() { cl.Close() })
	return cl
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// golden reads a frame recorded between real brpc peers
// (internal/baidustd/testdata/README.md).
func golden(t *testing.T, version, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "baidustd", "testdata", version, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rawExchange(t *testing.T, addr string, req []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	h := make([]byte, baidustd.HeaderSize)
	if _, err := io.ReadFull(r, h); err != nil {
		t.Fatal(err)
	}
	body, _, err := baidustd.ParseHeader(h, baidustd.DefaultMaxBodySize)
	if err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, body)
	if _, err := io.ReadFull(r, rest); err != nil {
		t.Fatal(err)
	}
	return append(h, rest...)
}

// The recorded engine heartbeat, from either brpc version, is taken by
// the registry with its load and latency (R-CAR-10), and answered with
// the recorded bytes.
func TestRecordedHeartbeatReachesTheRegistry(t *testing.T) {
	c := startCluster(t, "127.0.0.1:28600")
	c.register(t, instance.Default, "127.0.0.1:18000", "inc-1", nil)
	for _, v := range []string{"brpc-1.12.1", "brpc-1.17.0"} {
		got := rawExchange(t, c.rpcAddr, golden(t, v, "heartbeat.req.bin"))
		if want := golden(t, v, "heartbeat.resp.bin"); !bytes.Equal(got, want) {
			t.Errorf("%s: answer\n got %x\nwant %x", v, got, want)
		}
	}
	c.wait(t, "load from the heartbeat", func(s *instance.Snapshot) bool {
		in, _ := s.Lookup("127.0.0.1:18000")
		return in.LoadUsable() && in.Load == instance.Load{WaitingRequests: 7, GPUCacheUsagePerc: 0.25} &&
			in.LoadSource == instance.LoadHeartbeat && in.HasLatency && in.Latency == instance.Latency{RecentMaxTTFT: 120, RecentMaxTBT: 30}
	})
	// The deprecated cache_event is ignored (R-CAR-11); the heartbeat is
	// taken all the same.
	got := rawExchange(t, c.rpcAddr, golden(t, "brpc-1.12.1", "heartbeat_cache_event.req.bin"))
	if want := golden(t, "brpc-1.12.1", "heartbeat_cache_event.resp.bin"); !bytes.Equal(got, want) {
		t.Errorf("cache_event heartbeat answer\n got %x\nwant %x", got, want)
	}
}

// As xllm-service, an unknown instance or a stale incarnation gets
// Status{ok: false}, not an RPC error.
func TestHeartbeatRefusals(t *testing.T) {
	c := startCluster(t, "h:1")
	c.register(t, instance.Prefill, "10.0.0.1:8000", "now", nil)
	cl := c.client(t)
	for name, req := range map[string]*xservicepb.HeartbeatRequest{
		"unknown":  {Name: "10.0.0.9:8000", IncarnationId: "now", LoadMetrics: &xservicepb.LoadMetrics{}},
		"stale":    {Name: "10.0.0.1:8000", IncarnationId: "before", LoadMetrics: &xservicepb.LoadMetrics{}},
		"nameless": {IncarnationId: "now"},
	} {
		var st xservicepb.Status
		if err := cl.CallProto(ctxT(t), xllmpb.RPCService, xllmpb.MethodHeartbeat, req, &st, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.Ok {
			t.Errorf("%s: heartbeat taken", name)
		}
	}
	in, _ := c.reg.Snapshot().Lookup("10.0.0.1:8000")
	if in.HasLoad {
		t.Fatalf("a refused heartbeat left a load: %+v", in)
	}
	var st xservicepb.Status
	err := cl.CallProto(ctxT(t), xllmpb.RPCService, xllmpb.MethodHeartbeat,
		&xservicepb.HeartbeatRequest{Name: "10.0.0.1:8000", IncarnationId: "now", LoadMetrics: &xservicepb.LoadMetrics{WaitingRequestsNum: 3}}, &st, nil)
	if err != nil || !st.Ok {
		t.Fatalf("current heartbeat: %v %v", err, st.Ok)
	}
}

func TestInstanceQueries(t *testing.T) {
	c := startCluster(t, "h:1")
	c.register(t, instance.Default, "10.0.0.1:1", "a", map[string]any{"dp_size": 2, "cluster_ids": []uint64{7}, "addrs": []string{"x"},
		"ports": []int{5, 6}, "kv_split_size": 3, "register_ts_ms": 99})
	c.register(t, instance.Prefill, "10.0.0.2:1", "b", nil)
	c.register(t, instance.Decode, "10.0.0.3:1", "c", nil)
	c.register(t, instance.Decode, "10.0.0.4:1", "d", nil)
	c.register(t, instance.Mix, "10.0.0.5:1", "e", nil)
	cl := c.client(t)
	ctx := ctxT(t)

	var info xservicepb.InstanceMetaInfo
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGetInstanceInfo, &xservicepb.InstanceID{Name: "10.0.0.1:1"}, &info, nil); err != nil {
		t.Fatal(err)
	}
	if info.Name != "10.0.0.1:1" || info.RpcAddress != "10.0.0.1:1-rpc" || info.GetType() != xservicepb.InstanceType_DEFAULT || info.Type == nil ||
		info.DpSize != 2 || info.IncarnationId != "a" || info.RegisterTsMs != 99 || info.KvSplitSize != 3 ||
		len(info.ClusterIds) != 1 || info.ClusterIds[0] != 7 || len(info.Addrs) != 1 || len(info.Ports) != 2 || info.Ports[1] != 6 {
		t.Errorf("instance info: %v", &info)
	}
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGetInstanceInfo, &xservicepb.InstanceID{Name: "10.0.0.3:1"}, &info, nil); err != nil ||
		info.GetType() != xservicepb.InstanceType_DECODE {
		t.Errorf("decode instance info: %v %v", err, &info)
	}
	// Unknown: an empty meta with type DEFAULT, as xllm-service answers.
	info = xservicepb.InstanceMetaInfo{}
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGetInstanceInfo, &xservicepb.InstanceID{Name: "nope:1"}, &info, nil); err != nil ||
		info.Name != "" || info.Type == nil || info.GetType() != xservicepb.InstanceType_DEFAULT {
		t.Errorf("unknown instance info: %v %v", err, &info)
	}

	var ids xservicepb.InstanceIDs
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGetStaticDecodeList, &xservicepb.InstanceID{Name: "10.0.0.2:1"}, &ids, nil); err != nil {
		t.Fatal(err)
	}
	if got := ids.Names; len(got) != 2 || got[0] != "10.0.0.3:1" || got[1] != "10.0.0.4:1" {
		t.Errorf("decode list %v", got)
	}
	ids.Reset()
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGetStaticPrefillList, &xservicepb.InstanceID{}, &ids, nil); err != nil {
		t.Fatal(err)
	}
	if got := ids.Names; len(got) != 2 || got[0] != "10.0.0.1:1" || got[1] != "10.0.0.2:1" {
		t.Errorf("prefill list %v (DEFAULT and PREFILL, never MIX)", got)
	}

	var st xservicepb.Status
	if err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodHello, &xservicepb.Empty{}, &st, nil); err != nil || !st.Ok {
		t.Errorf("Hello: %v %v", err, st.Ok)
	}
	err := cl.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodRegisterInstance, &xservicepb.InstanceMetaInfo{Name: "x:1"}, &xservicepb.StatusCode{}, nil)
	var be *baidustd.Error
	if !errors.As(err, &be) || be.Code != baidustd.EINTERNAL || be.Text != "[h:1]Method RegisterInstance() not implemented." {
		t.Errorf("RegisterInstance: %v", err)
	}
}

// The recorded Generations call reaches the request waiting for it and is
// answered with the recorded bytes; one for no waiting request is
// refused with Status{ok: false}.
func TestGenerationsDelivered(t *testing.T) {
	c := startCluster(t, "127.0.0.1:28600")
	q, err := c.outputs.open("svc-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"brpc-1.12.1", "brpc-1.17.0"} {
		got := rawExchange(t, c.rpcAddr, golden(t, v, "completions_generations.req.bin"))
		if want := golden(t, v, "completions_generations.resp.bin"); !bytes.Equal(got, want) {
			t.Errorf("%s: answer\n got %x\nwant %x", v, got, want)
		}
	}
	gens, err := q.take()
	if err != nil || len(gens) != 2 {
		t.Fatalf("queued %d generations, %v", len(gens), err)
	}
	g := gens[0]
	if g.ReqId != "cmpl-fake-1" || !g.Finished || len(g.Outputs) != 1 || g.Outputs[0].Text != " t100 t101" ||
		g.Outputs[0].FinishReason != "length" || g.Usage.GetNumTotalTokens() != 6 {
		t.Errorf("delivered %v", g)
	}
	if _, err := c.outputs.open("svc-1"); err == nil {
		t.Error("a second request with the same service_request_id was accepted")
	}
	c.outputs.close("svc-1", q)
	var set xllmpb.StatusSet
	err = c.client(t).CallProto(ctxT(t), xllmpb.RPCService, xllmpb.MethodGenerations, &xllmpb.DisaggStreamGenerations{
		Gens: []*xllmpb.DisaggStreamGeneration{{ServiceReqId: "svc-1"}, {ServiceReqId: "other"}}}, &set, nil)
	if err != nil || len(set.AllStatus) != 2 || set.AllStatus[0].Ok || set.AllStatus[1].Ok {
		t.Fatalf("generations for ended requests: %v %v", err, &set)
	}
	if c.outputs.Len() != 0 {
		t.Fatalf("%d requests left waiting", c.outputs.Len())
	}
}

// A Generations call whose message would decode to more than the rpc
// port's calls may hold is answered ELIMIT undecoded: 4 MiB of empty
// generations, 2 bytes each on the wire, decode to some 280 MB, past the
// default 128 MiB. Real calls (the recorded ones above) cost a few times
// their bytes.
func TestGenerationsDecodeBounded(t *testing.T) {
	c := startCluster(t, "127.0.0.1:28600")
	wire := bytes.Repeat([]byte{0x0a, 0x00}, 2<<20) // gens (1): empty, 2M times
	_, err := c.client(t).Call(ctxT(t), xllmpb.RPCService, xllmpb.MethodGenerations, wire, nil)
	var e *baidustd.Error
	if !errors.As(err, &e) || e.Code != baidustd.ELIMIT || !strings.Contains(e.Text, "request_size=4194304 may decode to") {
		t.Fatalf("got %v, want ELIMIT", err)
	}
}

// A request whose reader falls behind by more than its budget ends with
// an error instead of growing without bound; a single generation larger
// than the budget is no backlog.
func TestOutputBacklogBounded(t *testing.T) {
	big := &xllmpb.DisaggStreamGeneration{ServiceReqId: "r", Outputs: []*xllmpb.SequenceOutput{{Text: string(make([]byte, 400))}}}
	o := NewOutputs(5*heldBytes(big)/2, 0)
	q, err := o.open("r")
	if err != nil {
		t.Fatal(err)
	}
	if !o.Deliver(big) || !o.Deliver(big) {
		t.Fatal("within budget refused")
	}
	if o.Deliver(big) {
		t.Fatal("over budget taken")
	}
	if _, err := q.take(); !errors.Is(err, errBacklog) {
		t.Fatalf("take after overflow: %v", err)
	}
	if o.Deliver(&xllmpb.DisaggStreamGeneration{ServiceReqId: "r"}) {
		t.Fatal("a failed request took more")
	}
	// One generation past the bound is no backlog: an empty queue takes
	// it, and the next one while it waits ends the request.
	huge := &xllmpb.DisaggStreamGeneration{ServiceReqId: "h", Outputs: []*xllmpb.SequenceOutput{{Text: string(make([]byte, 4000))}}}
	qh, err := o.open("h")
	if err != nil {
		t.Fatal(err)
	}
	if !o.Deliver(huge) {
		t.Fatal("a generation larger than the bound refused by an empty queue")
	}
	if o.Deliver(&xllmpb.DisaggStreamGeneration{ServiceReqId: "h"}) {
		t.Fatal("a generation taken behind one past the bound")
	}
	if _, err := qh.take(); !errors.Is(err, errBacklog) {
		t.Fatalf("take after the backlog: %v", err)
	}
}
