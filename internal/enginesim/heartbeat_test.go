package enginesim

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

const (
	testBeat = 20 * time.Millisecond
	beatWait = 5 * time.Second
)

// beat is one heartbeat as a master service received it.
type beat struct {
	body        map[string]any
	token       string
	contentType string
}

func (b beat) load(k string) any    { return b.body["load_metrics"].(map[string]any)[k] }
func (b beat) latency(k string) any { return b.body["latency_metrics"].(map[string]any)[k] }

// master is a real HTTP server in the role of kvcar's master service: it
// records every heartbeat and answers with a fixed status.
type master struct {
	srv  *httptest.Server
	mu   sync.Mutex
	code int
	got  []beat
}

func startMaster(t *testing.T, code int) *master {
	t.Helper()
	m := &master{code: code}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+HeartbeatPath, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m.mu.Lock()
		m.got = append(m.got, beat{body: body, token: r.Header.Get("X-Internal-Token"), contentType: r.Header.Get("Content-Type")})
		code := m.code
		m.mu.Unlock()
		w.WriteHeader(code)
		_, _ = w.Write([]byte("{}"))
	})
	m.srv = httptest.NewServer(mux)
	t.Cleanup(m.srv.Close)
	return m
}

func (m *master) addr() string { return m.srv.Listener.Addr().String() }

func (m *master) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.got)
}

// waitBeat waits for a heartbeat from name that satisfies ok.
func (m *master) waitBeat(t *testing.T, name string, ok func(beat) bool) beat {
	t.Helper()
	var found beat
	waitFor(t, beatWait, "heartbeat from "+name+" at "+m.addr(), func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		for i := len(m.got) - 1; i >= 0; i-- {
			if b := m.got[i]; b.body["name"] == name && ok(b) {
				found = b
				return true
			}
		}
		return false
	})
	return found
}

func anyBeat(beat) bool { return true }

// quiet shows that no more than inFlight heartbeats reach m during
// several intervals.
func (m *master) quiet(t *testing.T, inFlight int) {
	t.Helper()
	n := m.count()
	time.Sleep(10 * testBeat)
	if got := m.count(); got-n > inFlight {
		t.Fatalf("%d heartbeats reached %s while it should be quiet", got-n, m.addr())
	}
}

func heartbeatEngine(t *testing.T, te *testEtcd, ns string, mod func(*Config)) *Engine {
	t.Helper()
	return registeredEngine(t, te, ns, TypePrefill, func(c *Config) {
		c.DeviceBlocks = 8
		c.Heartbeat = &HeartbeatConfig{Interval: testBeat, Token: "secret"}
		if mod != nil {
			mod(c)
		}
	})
}

// rpcMaster is a real baidu_std server in the role of the master
// service's XllmRpcService: it records every Heartbeat and answers with
// a fixed Status.
type rpcMaster struct {
	srv  *baidustd.Server
	a    string
	mu   sync.Mutex
	ok   bool
	got  []*xservicepb.HeartbeatRequest
	conn map[string]bool // remote addresses the heartbeats came from
}

func startRPCMaster(t *testing.T, ok bool) *rpcMaster {
	t.Helper()
	m := &rpcMaster{ok: ok, conn: map[string]bool{}, srv: baidustd.NewServer(baidustd.ServerOptions{})}
	err := m.srv.Register(xllmpb.RPCService, xllmpb.MethodHeartbeat, func(ctx context.Context, r *baidustd.Request) (baidustd.Response, error) {
		var req xservicepb.HeartbeatRequest
		if err := proto.Unmarshal(r.Message, &req); err != nil {
			return baidustd.Response{}, err
		}
		m.mu.Lock()
		m.got = append(m.got, &req)
		m.conn[r.RemoteAddr.String()] = true
		ok := m.ok
		m.mu.Unlock()
		b, _ := proto.Marshal(&xservicepb.Status{Ok: ok})
		return baidustd.Response{Message: b}, nil
	})
	must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	m.a = ln.Addr().String()
	go m.srv.Serve(ln)
	t.Cleanup(func() { m.srv.Close() })
	return m
}

func (m *rpcMaster) addr() string { return m.a }

func (m *rpcMaster) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.got)
}

func (m *rpcMaster) waitBeat(t *testing.T, name string, ok func(*xservicepb.HeartbeatRequest) bool) *xservicepb.HeartbeatRequest {
	t.Helper()
	var found *xservicepb.HeartbeatRequest
	waitFor(t, beatWait, "heartbeat from "+name+" at "+m.addr(), func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		for i := len(m.got) - 1; i >= 0; i-- {
			if b := m.got[i]; b.Name == name && ok(b) {
				found = b
				return true
			}
		}
		return false
	})
	return found
}

func anyRPCBeat(*xservicepb.HeartbeatRequest) bool { return true }

func (m *rpcMaster) quiet(t *testing.T, inFlight int) {
	t.Helper()
	n := m.count()
	time.Sleep(10 * testBeat)
	if got := m.count(); got-n > inFlight {
		t.Fatalf("%d heartbeats reached %s while it should be quiet", got-n, m.addr())
	}
}

// R-CAR-10, R-CAR-3: heartbeats go as an xLLM engine sends them,
// XllmRpcService.Heartbeat over baidu_std to the master named in etcd,
// on one connection, with the engine's name and incarnation, and report
// the load the cache model really has: Device usage follows Prefill,
// waiting follows the queue.
func TestHeartbeatReportsLoadRCAR10(t *testing.T) {
	te := startEtcd(t)
	m := startRPCMaster(t, true)
	te.put(t, MasterKey("hb"), m.addr())
	e := heartbeatEngine(t, te, "hb", nil)

	first := m.waitBeat(t, e.Name(), anyRPCBeat)
	if first.IncarnationId != e.IncarnationID() {
		t.Fatalf("heartbeat %v, engine incarnation %s", first, e.IncarnationID())
	}
	// An idle engine: load_metrics present and empty, no latency samples.
	if lm := first.LoadMetrics; lm == nil || lm.WaitingRequestsNum != 0 || lm.GpuCacheUsagePerc != 0 || first.LatencyMetrics != nil {
		t.Fatalf("idle engine reported %v", first)
	}
	waitFor(t, beatWait, "status 200", func() bool { return e.LastHeartbeatStatus() == http.StatusOK })
	if e.HeartbeatMaster() != m.addr() {
		t.Fatalf("master %q, want %q", e.HeartbeatMaster(), m.addr())
	}

	_, _, err := e.Prefill(0, tokens(0, 2*testBS))
	must(t, err)
	e.SetWaiting(3)
	e.SetLatency(120*time.Millisecond, 15*time.Millisecond)
	m.waitBeat(t, e.Name(), func(b *xservicepb.HeartbeatRequest) bool {
		return b.LoadMetrics.GetWaitingRequestsNum() == 3 && b.LoadMetrics.GetGpuCacheUsagePerc() == 0.25 &&
			b.LatencyMetrics.GetRecentMaxTtft() == 120 && b.LatencyMetrics.GetRecentMaxTbt() == 15
	})
	if lm, err := e.LoadMetrics(); err != nil || lm != (LoadMetrics{WaitingRequests: 3, GPUCacheUsage: 0.25}) {
		t.Fatalf("LoadMetrics = %+v, %v", lm, err)
	}
	m.mu.Lock()
	conns := len(m.conn)
	m.mu.Unlock()
	if conns != 1 {
		t.Fatalf("heartbeats came on %d connections, want one", conns)
	}

	// A new process reports its new incarnation and an empty queue.
	must(t, e.Restart())
	m.waitBeat(t, e.Name(), func(b *xservicepb.HeartbeatRequest) bool {
		return b.IncarnationId == e.IncarnationID() && b.LoadMetrics.GetWaitingRequestsNum() == 0 &&
			b.LoadMetrics.GetGpuCacheUsagePerc() == 0
	})

	// An engine without incarnation support sends none.
	old := heartbeatEngine(t, te, "hb", func(c *Config) { c.Etcd.OmitIncarnation = true })
	if b := m.waitBeat(t, old.Name(), anyRPCBeat); b.IncarnationId != "" {
		t.Fatalf("incarnation_id %q sent by an engine that omits it", b.IncarnationId)
	}
}

// R-CAR-10, R-CAR-11: the engine follows the master key as it changes,
// records the master's answer (Status{ok: false}, reported as 409:
// unknown instance or incarnation), stops when there is no master and
// can be paused.
func TestHeartbeatFollowsMasterRCAR10(t *testing.T) {
	te := startEtcd(t)
	a, b := startRPCMaster(t, true), startRPCMaster(t, false)
	key := MasterKey("follow")
	te.put(t, key, a.addr())
	e := heartbeatEngine(t, te, "follow", nil)
	a.waitBeat(t, e.Name(), anyRPCBeat)

	te.put(t, key, b.addr())
	b.waitBeat(t, e.Name(), anyRPCBeat)
	waitFor(t, beatWait, "status 409", func() bool { return e.LastHeartbeatStatus() == http.StatusConflict })
	if e.HeartbeatMaster() != b.addr() {
		t.Fatalf("master %q, want %q", e.HeartbeatMaster(), b.addr())
	}
	a.quiet(t, 0)

	_, err := te.cli.Delete(te.ctx(t), key)
	must(t, err)
	waitFor(t, beatWait, "master to go", func() bool { return e.HeartbeatMaster() == "" })
	b.quiet(t, 0)

	te.put(t, key, a.addr())
	a.waitBeat(t, e.Name(), anyRPCBeat)
	e.SetHeartbeatPaused(true)
	a.quiet(t, 1) // one heartbeat may have started before the pause
	e.SetHeartbeatPaused(false)
	n := a.count()
	waitFor(t, beatWait, "heartbeats after resume", func() bool { return a.count() > n })

	// A master that goes away: no answer (0), then its return is
	// noticed on the next beats.
	a.srv.Close()
	waitFor(t, beatWait, "status 0 with the master down", func() bool { return e.LastHeartbeatStatus() == 0 })
}

// With HTTPURL the engine beats as xllm-service's vLLM sidecar does: the
// proto-JSON HeartbeatRequest posted to the service's HTTP intake with
// the token, whatever the master key says.
func TestHTTPHeartbeatsAsTheSidecarRCAR10(t *testing.T) {
	te := startEtcd(t)
	m := startMaster(t, http.StatusOK)
	te.put(t, MasterKey("sidecar"), "127.0.0.1:1") // the rpc address, unused here
	e := heartbeatEngine(t, te, "sidecar", func(c *Config) { c.Heartbeat.HTTPURL = "http://" + m.addr() })

	first := m.waitBeat(t, e.Name(), anyBeat)
	if first.body["incarnation_id"] != e.IncarnationID() || first.token != "secret" || first.contentType != "application/json" {
		t.Fatalf("heartbeat %+v, engine incarnation %s", first, e.IncarnationID())
	}
	if first.load("waiting_requests_num") != 0.0 || first.load("gpu_cache_usage_perc") != 0.0 {
		t.Fatalf("idle engine reported %v", first.body)
	}
	waitFor(t, beatWait, "status 200", func() bool { return e.LastHeartbeatStatus() == http.StatusOK })
	e.SetWaiting(2)
	m.waitBeat(t, e.Name(), func(b beat) bool { return b.load("waiting_requests_num") == 2.0 })
	m.mu.Lock()
	m.code = http.StatusConflict
	m.mu.Unlock()
	waitFor(t, beatWait, "status 409", func() bool { return e.LastHeartbeatStatus() == http.StatusConflict })
}

// gpu_cache_usage_perc is the mean over DP ranks of Device blocks in use,
// as xLLM's block manager pool computes it.
func TestLoadMetricsMeanOverRanks(t *testing.T) {
	e := startEngine(t, Config{DPSize: 2, DeviceBlocks: 4})
	_, _, err := e.Prefill(0, tokens(0, 4*testBS))
	must(t, err)
	_, _, err = e.Prefill(1, tokens(100, testBS))
	must(t, err)
	lm, err := e.LoadMetrics()
	must(t, err)
	if want := (1.0 + 0.25) / 2; math.Abs(lm.GPUCacheUsage-want) > 1e-12 || lm.WaitingRequests != 0 {
		t.Fatalf("LoadMetrics = %+v, want usage %v", lm, want)
	}
}
