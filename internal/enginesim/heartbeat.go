package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

// Heartbeat defaults. xLLM engines beat every few seconds; the emulation
// beats faster so that tests of kvcar's state machine stay short.
const (
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultHeartbeatTimeout  = time.Second
)

// HeartbeatPath is where the master service takes heartbeats.
const HeartbeatPath = "/v1/internal/heartbeat"

// maxHeartbeatReply bounds how much of a reply is read before the
// connection is reused.
const maxHeartbeatReply = 64 << 10

// HeartbeatConfig describes the engine's load reports to the master.
type HeartbeatConfig struct {
	// Interval is the time between heartbeats (DefaultHeartbeatInterval).
	Interval time.Duration
	// Timeout bounds each heartbeat request (DefaultHeartbeatTimeout).
	Timeout time.Duration
	// HTTPURL, when set, makes the heartbeats those of xllm-service's
	// vLLM sidecar: proto-JSON POSTs to HTTPURL + HeartbeatPath, HTTPURL
	// being the service's HTTP base URL ("http://10.0.0.5:8888"). Empty,
	// they are an xLLM engine's: XllmRpcService.Heartbeat over baidu_std
	// to the address in XLLM:SERVICE:MASTER.
	HTTPURL string
	// Token, when set, is sent as X-Internal-Token with HTTP heartbeats;
	// baidu_std heartbeats carry none, as an engine's carry none.
	Token string
}

func (c *HeartbeatConfig) validate(hasEtcd bool) error {
	if c == nil {
		return nil
	}
	switch {
	case !hasEtcd:
		return errors.New("enginesim: Heartbeat needs Etcd to find the master service")
	case c.Interval < 0:
		return fmt.Errorf("enginesim: Heartbeat.Interval %v is negative", c.Interval)
	case c.Timeout < 0:
		return fmt.Errorf("enginesim: Heartbeat.Timeout %v is negative", c.Timeout)
	}
	return nil
}

// LoadMetrics is the load an engine reports in its heartbeats.
type LoadMetrics struct {
	// WaitingRequests is the number of requests waiting for a batch
	// slot, plus the value set by SetWaiting.
	WaitingRequests uint64
	// GPUCacheUsage is the fraction of Device blocks in use, averaged over
	// the DP ranks as xLLM's block manager pool averages it.
	GPUCacheUsage float64
}

// SetWaiting sets a number of waiting requests that the heartbeats report
// on top of the inference requests really waiting for a slot: without
// traffic it is the whole report, with traffic it emulates requests that
// are not seen here. Restart empties it, as a new process starts with an
// empty queue.
func (e *Engine) SetWaiting(n uint64) { e.waiting.Store(n) }

// SetLatency sets the recent maximum TTFT and TBT the heartbeats report,
// in whole milliseconds.
func (e *Engine) SetLatency(ttft, tbt time.Duration) {
	e.ttftMs.Store(ttft.Milliseconds())
	e.tbtMs.Store(tbt.Milliseconds())
}

// SetHeartbeatPaused stops (true) or resumes heartbeats without stopping
// anything else, as a hung engine that still holds its lease would. Like
// the other fault settings it survives Restart.
func (e *Engine) SetHeartbeatPaused(paused bool) { e.hbPaused.Store(paused) }

// LoadMetrics returns the load a heartbeat would report now.
func (e *Engine) LoadMetrics() (LoadMetrics, error) {
	m := LoadMetrics{WaitingRequests: e.waiting.Load() + uint64(e.serve.waitingNow())}
	n := e.DPSize()
	var sum float64
	for dp := range n {
		var used, capacity int
		if err := e.do(dp, func(r *rank) error {
			used, capacity = r.cache.device.Len(), r.cache.devCap
			return nil
		}); err != nil {
			return m, err
		}
		sum += float64(used) / float64(capacity)
	}
	m.GPUCacheUsage = sum / float64(n)
	return m, nil
}

// LastHeartbeatStatus returns the outcome of the last heartbeat as an HTTP
// status: 200 when the master took it, 409 when it does not know this
// instance or this incarnation (a baidu_std Status{ok: false}), 0 before
// any reply or when the last attempt got none; other HTTP answers as
// they came.
func (e *Engine) LastHeartbeatStatus() int {
	e.hb.mu.Lock()
	defer e.hb.mu.Unlock()
	return e.hb.status
}

// HeartbeatMaster returns the master address the heartbeats go to, as last
// read from etcd; empty when there is none.
func (e *Engine) HeartbeatMaster() string {
	e.hb.mu.Lock()
	defer e.hb.mu.Unlock()
	return e.hb.master
}

// heartbeatState is what the heartbeat goroutine tells the rest of the
// engine; it outlives the goroutine so that it can be read after Close.
type heartbeatState struct {
	mu     sync.Mutex
	status int
	master string
}

func (s *heartbeatState) setMaster(m string) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed = s.master != m
	s.master = m
	return changed
}

func (s *heartbeatState) setStatus(code int) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed = s.status != code
	s.status = code
	return changed
}

// The proto-JSON of xllm-service's HeartbeatRequest. Integers go as JSON
// numbers, which proto-JSON parsers accept for 64-bit fields too.
type heartbeatRequest struct {
	Name           string           `json:"name"`
	IncarnationID  string           `json:"incarnation_id,omitempty"`
	LoadMetrics    heartbeatLoad    `json:"load_metrics"`
	LatencyMetrics heartbeatLatency `json:"latency_metrics"`
}

type heartbeatLoad struct {
	WaitingRequestsNum uint64  `json:"waiting_requests_num"`
	GPUCacheUsagePerc  float64 `json:"gpu_cache_usage_perc"`
}

type heartbeatLatency struct {
	RecentMaxTTFT int64 `json:"recent_max_ttft"`
	RecentMaxTBT  int64 `json:"recent_max_tbt"`
}

// heartbeatProto is the HeartbeatRequest an xLLM engine sends: load
// metrics always present (empty when both are 0), latency metrics only
// with samples.
func (e *Engine) heartbeatProto() (*xservicepb.HeartbeatRequest, error) {
	load, err := e.LoadMetrics()
	if err != nil {
		return nil, err
	}
	req := &xservicepb.HeartbeatRequest{
		Name:        e.Name(),
		LoadMetrics: &xservicepb.LoadMetrics{WaitingRequestsNum: load.WaitingRequests, GpuCacheUsagePerc: float32(load.GPUCacheUsage)},
	}
	if ttft, tbt := e.ttftMs.Load(), e.tbtMs.Load(); ttft != 0 || tbt != 0 {
		req.LatencyMetrics = &xservicepb.LatencyMetrics{RecentMaxTtft: ttft, RecentMaxTbt: tbt}
	}
	if !e.cfg.Etcd.OmitIncarnation {
		req.IncarnationId = e.IncarnationID()
	}
	return req, nil
}

func (e *Engine) heartbeatBody() ([]byte, error) {
	load, err := e.LoadMetrics()
	if err != nil {
		return nil, err
	}
	req := heartbeatRequest{
		Name:           e.Name(),
		LoadMetrics:    heartbeatLoad{WaitingRequestsNum: load.WaitingRequests, GPUCacheUsagePerc: load.GPUCacheUsage},
		LatencyMetrics: heartbeatLatency{RecentMaxTTFT: e.ttftMs.Load(), RecentMaxTBT: e.tbtMs.Load()},
	}
	if !e.cfg.Etcd.OmitIncarnation {
		req.IncarnationID = e.IncarnationID()
	}
	return json.Marshal(req)
}

// heartbeater is the goroutine that follows the master key and posts the
// heartbeats. It belongs to the running engine and ends in stop.
type heartbeater struct {
	e           *Engine
	cli         *clientv3.Client
	key         string
	interval    time.Duration
	etcdTimeout time.Duration
	timeout     time.Duration
	httpURL     string
	token       string
	transport   *http.Transport
	client      *http.Client
	log         *slog.Logger
	// rpc is the baidu_std client of the current master, owned by the
	// goroutine; replaced when the master changes.
	rpc *baidustd.Client

	cancel context.CancelFunc
	done   chan struct{}
}

func (e *Engine) startHeartbeat(cli *clientv3.Client) *heartbeater {
	c := e.cfg.Heartbeat
	interval, timeout := c.Interval, c.Timeout
	if interval == 0 {
		interval = DefaultHeartbeatInterval
	}
	if timeout == 0 {
		timeout = DefaultHeartbeatTimeout
	}
	// An own transport, so that closing it leaves no idle connections
	// behind the engine.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	ctx, cancel := context.WithCancel(context.Background())
	h := &heartbeater{
		e:           e,
		cli:         cli,
		key:         MasterKey(e.cfg.Etcd.Namespace),
		interval:    interval,
		etcdTimeout: e.cfg.Etcd.requestTimeout(),
		timeout:     timeout,
		httpURL:     c.HTTPURL,
		token:       c.Token,
		transport:   tr,
		client:      &http.Client{Transport: tr, Timeout: timeout},
		log:         e.cfg.Logger.With("engine", e.Name()),
		cancel:      cancel,
		done:        make(chan struct{}),
	}
	go h.run(ctx)
	return h
}

func (h *heartbeater) stop() {
	h.cancel()
	<-h.done
	h.transport.CloseIdleConnections()
}

// run beats once at once and then every interval, following the master
// key through a watch; a broken watch is set up again at the next tick.
func (h *heartbeater) run(ctx context.Context) {
	defer close(h.done)
	defer func() {
		if h.rpc != nil {
			h.rpc.Close()
		}
	}()
	t := time.NewTicker(h.interval)
	defer t.Stop()
	watch, stopWatch := h.follow(ctx)
	defer func() { stopWatch() }()
	h.beat(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case wr, ok := <-watch:
			if !ok || wr.Err() != nil {
				stopWatch()
				watch, stopWatch = nil, func() {}
				continue
			}
			for _, ev := range wr.Events {
				master := ""
				if ev.Type == clientv3.EventTypePut {
					master = string(ev.Kv.Value)
				}
				if h.e.hb.setMaster(master) {
					h.log.Info("master service changed", "master", master)
				}
			}
		case <-t.C:
			if watch == nil {
				watch, stopWatch = h.follow(ctx)
			}
			h.beat(ctx)
		}
	}
}

// follow reads the master key and watches it from just after that read,
// so that no change is missed. It returns a nil channel when etcd cannot
// be read.
func (h *heartbeater) follow(ctx context.Context) (clientv3.WatchChan, context.CancelFunc) {
	gctx, cancel := context.WithTimeout(ctx, h.etcdTimeout)
	resp, err := h.cli.Get(gctx, h.key)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("reading the master service failed", "key", h.key, "err", err)
		}
		return nil, func() {}
	}
	master := ""
	if len(resp.Kvs) > 0 {
		master = string(resp.Kvs[0].Value)
	}
	if h.e.hb.setMaster(master) {
		h.log.Info("master service", "master", master)
	}
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	return h.cli.Watch(wctx, h.key, clientv3.WithRev(resp.Header.Revision+1)), wcancel
}

func heartbeatURL(base string) string {
	if strings.Contains(base, "://") {
		return strings.TrimSuffix(base, "/") + HeartbeatPath
	}
	return "http://" + base + HeartbeatPath
}

// beat sends one heartbeat, the engine's way or the sidecar's, and
// records the outcome.
func (h *heartbeater) beat(ctx context.Context) {
	if h.e.hbPaused.Load() {
		return
	}
	if h.httpURL != "" {
		h.post(ctx, h.httpURL)
		return
	}
	master := h.e.HeartbeatMaster()
	if master == "" {
		return
	}
	h.call(ctx, master)
}

// call sends XllmRpcService.Heartbeat to master over its one pipelined
// connection, as XServiceClient::heartbeat does.
func (h *heartbeater) call(ctx context.Context, master string) {
	req, err := h.e.heartbeatProto()
	if err != nil {
		h.log.Warn("heartbeat skipped", "err", err)
		return
	}
	if h.rpc == nil || h.rpc.Addr() != master {
		if h.rpc != nil {
			h.rpc.Close()
		}
		h.rpc = baidustd.NewClient(master, baidustd.ClientOptions{DialTimeout: h.timeout, Logger: h.log})
	}
	cctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var st xservicepb.Status
	if err := h.rpc.CallProto(cctx, xllmpb.RPCService, xllmpb.MethodHeartbeat, req, &st, nil); err != nil {
		if h.e.hb.setStatus(0) && ctx.Err() == nil {
			h.log.Warn("heartbeat failed", "master", master, "err", err)
		}
		return
	}
	code := http.StatusOK
	if !st.Ok {
		code = http.StatusConflict
	}
	if h.e.hb.setStatus(code) && !st.Ok {
		// The service does not know this instance or this incarnation;
		// an engine only logs it and beats on.
		h.log.Warn("heartbeat refused", "master", master)
	}
}

// post sends the proto-JSON heartbeat to the HTTP intake at base, as
// xllm-service's vLLM sidecar does.
func (h *heartbeater) post(ctx context.Context, base string) {
	master := base
	body, err := h.e.heartbeatBody()
	if err != nil {
		h.log.Warn("heartbeat skipped", "err", err)
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, heartbeatURL(master), bytes.NewReader(body))
	if err != nil {
		h.log.Warn("heartbeat request", "master", master, "err", err)
		h.e.hb.setStatus(0)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if h.token != "" {
		req.Header.Set("X-Internal-Token", h.token)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		if h.e.hb.setStatus(0) && ctx.Err() == nil {
			h.log.Warn("heartbeat failed", "master", master, "err", err)
		}
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxHeartbeatReply))
	resp.Body.Close()
	if h.e.hb.setStatus(resp.StatusCode) && resp.StatusCode != http.StatusOK {
		// 409 is the service saying it does not know this instance or
		// this incarnation; an engine only logs it and beats on.
		h.log.Warn("heartbeat refused", "master", master, "status", resp.StatusCode)
	}
}
