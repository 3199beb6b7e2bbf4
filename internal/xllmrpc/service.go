package xllmrpc

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmpb/xservicepb"
)

// Registry is what the RPC service needs of the instance registry.
type Registry interface {
	// Heartbeat applies an engine heartbeat; an error means it was not
	// taken (unknown instance, stale incarnation, invalid load).
	Heartbeat(hb instance.Heartbeat) error
	// Snapshot is the registry's current view.
	Snapshot() *instance.Snapshot
}

// Service is kvcar's XllmRpcService: what xllm-service serves on its rpc
// port to xLLM engines.
type Service struct {
	reg     Registry
	outputs *Outputs
	log     *slog.Logger
}

// NewService makes the service over reg, delivering Generations into
// outputs. log may be nil.
func NewService(reg Registry, outputs *Outputs, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{reg: reg, outputs: outputs, log: log}
}

// Register adds every XllmRpcService method to srv.
func (s *Service) Register(srv *baidustd.Server) error {
	for _, m := range []struct {
		name string
		h    baidustd.Handler
	}{
		{xllmpb.MethodHello, baidustd.Unary(s.hello)},
		{xllmpb.MethodHeartbeat, baidustd.Unary(s.heartbeat)},
		{xllmpb.MethodGenerations, baidustd.Unary(s.generations)},
		{xllmpb.MethodGetInstanceInfo, baidustd.Unary(s.getInstanceInfo)},
		{xllmpb.MethodGetStaticDecodeList, baidustd.Unary(s.getStaticDecodeList)},
		{xllmpb.MethodGetStaticPrefillList, baidustd.Unary(s.getStaticPrefillList)},
		{xllmpb.MethodRegisterInstance, baidustd.Unary(s.registerInstance)},
	} {
		if err := srv.Register(xllmpb.RPCService, m.name, m.h); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) hello(context.Context, *xservicepb.Empty) (*xservicepb.Status, error) {
	return &xservicepb.Status{Ok: true}, nil
}

// heartbeat takes an engine's heartbeat as the HTTP intake does
// (R-CAR-10): the registry applies it, the deprecated cache_event is
// ignored (R-CAR-11). As xllm-service, it answers Status{ok: false}
// rather than an error for an unknown instance, a stale incarnation or a
// heartbeat the registry refuses.
func (s *Service) heartbeat(_ context.Context, req *xservicepb.HeartbeatRequest) (*xservicepb.Status, error) {
	if req.GetName() == "" {
		s.log.Debug("heartbeat without a name refused")
		return &xservicepb.Status{}, nil
	}
	hb := instance.Heartbeat{Name: req.GetName(), IncarnationID: req.GetIncarnationId()}
	if l := req.GetLoadMetrics(); l != nil {
		hb.Load = &instance.Load{WaitingRequests: l.GetWaitingRequestsNum(), GPUCacheUsagePerc: float64(l.GetGpuCacheUsagePerc())}
	}
	if l := req.GetLatencyMetrics(); l != nil {
		hb.Latency = &instance.Latency{RecentMaxTTFT: l.GetRecentMaxTtft(), RecentMaxTBT: l.GetRecentMaxTbt()}
	}
	if err := s.reg.Heartbeat(hb); err != nil {
		level := slog.LevelWarn
		if errors.Is(err, instance.ErrUnknownInstance) || errors.Is(err, instance.ErrStaleIncarnation) {
			level = slog.LevelDebug // the engine re-registers; its next beat is taken
		}
		s.log.Log(context.Background(), level, "heartbeat refused", "instance", hb.Name, "err", err)
		return &xservicepb.Status{}, nil
	}
	return &xservicepb.Status{Ok: true}, nil
}

// generations hands each generation to the request waiting for it and
// answers one Status per generation, in order: false for a request that
// is unknown or has ended, which makes the engine stop it.
func (s *Service) generations(_ context.Context, req *xllmpb.DisaggStreamGenerations) (*xllmpb.StatusSet, error) {
	out := &xllmpb.StatusSet{AllStatus: make([]*xllmpb.Status, len(req.GetGens()))}
	for i, g := range req.GetGens() {
		ok := s.outputs.Deliver(g)
		if !ok {
			s.log.Debug("generation for no waiting request", "service_req_id", g.GetServiceReqId(), "req_id", g.GetReqId())
		}
		out.AllStatus[i] = &xllmpb.Status{Ok: ok}
	}
	return out, nil
}

// getInstanceInfo answers as xllm-service does: the registered meta of
// the instance, or an empty InstanceMetaInfo (type DEFAULT) when none is
// registered under that name.
func (s *Service) getInstanceInfo(_ context.Context, req *xservicepb.InstanceID) (*xservicepb.InstanceMetaInfo, error) {
	in, ok := s.reg.Snapshot().Lookup(req.GetName())
	if !ok {
		return &xservicepb.InstanceMetaInfo{Type: xservicepb.InstanceType_DEFAULT.Enum()}, nil
	}
	m := in.Meta
	resp := &xservicepb.InstanceMetaInfo{
		Name:          m.Name,
		RpcAddress:    m.RPCAddress,
		Type:          xservicepb.InstanceType(in.Type).Enum(),
		ClusterIds:    m.ClusterIDs,
		DpSize:        int32(m.DPSize),
		Addrs:         m.Addrs,
		IncarnationId: m.IncarnationID,
		RegisterTsMs:  uint64(max(m.RegisterTsMs, 0)),
		KvSplitSize:   int32(m.KVSplitSize),
	}
	for _, p := range m.Ports {
		resp.Ports = append(resp.Ports, uint32(p))
	}
	return resp, nil
}

// getStaticDecodeList lists every schedulable DECODE instance, as
// xllm-service does whatever instance asks.
func (s *Service) getStaticDecodeList(context.Context, *xservicepb.InstanceID) (*xservicepb.InstanceIDs, error) {
	return s.list(func(t instance.Type) bool { return t == instance.Decode }), nil
}

// getStaticPrefillList lists every schedulable PREFILL and DEFAULT
// instance.
func (s *Service) getStaticPrefillList(context.Context, *xservicepb.InstanceID) (*xservicepb.InstanceIDs, error) {
	return s.list(func(t instance.Type) bool { return t == instance.Prefill || t == instance.Default }), nil
}

func (s *Service) list(want func(instance.Type) bool) *xservicepb.InstanceIDs {
	out := &xservicepb.InstanceIDs{}
	for _, in := range s.reg.Snapshot().Instances {
		if want(in.Type) && in.Schedulable() {
			out.Names = append(out.Names, in.Meta.Name)
		}
	}
	return out
}

// errRegisterInstance is what brpc answers for a method the service
// declares but does not implement, as xllm-service leaves
// RegisterInstance: engines register through etcd.
var errRegisterInstance = errors.New("Method RegisterInstance() not implemented.")

func (s *Service) registerInstance(context.Context, *xservicepb.InstanceMetaInfo) (*xservicepb.StatusCode, error) {
	return nil, errRegisterInstance
}
