package instance

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// metaJSON is InstanceMetaInfo as engines write it. Pointers tell a
// missing member from a zero one.
type metaJSON struct {
	Name          *string           `json:"name"`
	RPCAddress    *string           `json:"rpc_address"`
	Type          *int              `json:"type"`
	IncarnationID string            `json:"incarnation_id"`
	RegisterTsMs  int64             `json:"register_ts_ms"`
	DPSize        int32             `json:"dp_size"`
	ClusterIDs    []uint64          `json:"cluster_ids"`
	Addrs         []string          `json:"addrs"`
	Ports         []uint16          `json:"ports"`
	KVSplitSize   *int32            `json:"kv_split_size"`
	TTFT          []json.RawMessage `json:"ttft_profiling_data"`
	TPOT          []json.RawMessage `json:"tpot_profiling_data"`
	BackendType   *string           `json:"backend_type"`
}

// parseMeta decodes an InstanceMetaInfo value. name, rpc_address and
// type are required, as xllm-service requires them, and dp_size is at
// most MaxDPSize; members it does not know are ignored.
func parseMeta(value []byte) (Meta, error) {
	var j metaJSON
	if err := json.Unmarshal(value, &j); err != nil {
		return Meta{}, fmt.Errorf("instance meta: %w", err)
	}
	switch {
	case j.Name == nil || *j.Name == "":
		return Meta{}, errors.New("instance meta: name missing")
	case j.RPCAddress == nil:
		return Meta{}, errors.New("instance meta: rpc_address missing")
	case j.Type == nil:
		return Meta{}, errors.New("instance meta: type missing")
	case !Type(*j.Type).valid():
		return Meta{}, fmt.Errorf("instance meta: type %d is not 0 (DEFAULT), 1 (PREFILL), 2 (DECODE) or 3 (MIX)", *j.Type)
	case j.DPSize < 0 || j.DPSize > MaxDPSize:
		return Meta{}, fmt.Errorf("instance meta: dp_size %d is outside [0, %d]", j.DPSize, MaxDPSize)
	}
	m := Meta{
		Name:          *j.Name,
		RPCAddress:    *j.RPCAddress,
		Type:          Type(*j.Type),
		IncarnationID: j.IncarnationID,
		RegisterTsMs:  j.RegisterTsMs,
		DPSize:        int(j.DPSize),
		ClusterIDs:    j.ClusterIDs,
		Addrs:         j.Addrs,
		Ports:         j.Ports,
		KVSplitSize:   1,
		BackendType:   "xllm",
	}
	// proto3 writes an unset dp_size as 0: a single rank.
	if m.DPSize == 0 {
		m.DPSize = 1
	}
	if j.KVSplitSize != nil {
		m.KVSplitSize = int(*j.KVSplitSize)
	}
	if j.BackendType != nil && *j.BackendType != "" {
		m.BackendType = *j.BackendType
	}
	// Like xllm-service, keep the well-formed profiling points and skip
	// the others: the profile only tunes SLO_AWARE estimates.
	for _, raw := range j.TTFT {
		if p, ok := numbers(raw, 2); ok && integral(p[0]) {
			m.TTFTProfile = append(m.TTFTProfile, TTFTPoint{InputLen: int(p[0]), TTFTMs: p[1]})
		}
	}
	for _, raw := range j.TPOT {
		if p, ok := numbers(raw, 3); ok && integral(p[0]) && integral(p[1]) {
			m.TPOTProfile = append(m.TPOTProfile, TPOTPoint{AvgLen: int(p[0]), BatchSize: int(p[1]), TPOTMs: p[2]})
		}
	}
	return m, nil
}

func numbers(raw json.RawMessage, n int) ([]float64, bool) {
	var p []float64
	if err := json.Unmarshal(raw, &p); err != nil || len(p) != n {
		return nil, false
	}
	return p, true
}

func integral(f float64) bool {
	return f == math.Trunc(f) && math.Abs(f) <= math.MaxInt32
}

// loadJSON is a XLLM:LOADMETRICS value.
type loadJSON struct {
	WaitingRequests *uint64  `json:"waiting_requests_num"`
	GPUCacheUsage   *float64 `json:"gpu_cache_usage_perc"`
}

// parseLoadValue decodes a XLLM:LOADMETRICS value; both members are
// required, as xllm-service requires them.
func parseLoadValue(value []byte) (Load, error) {
	var j loadJSON
	if err := json.Unmarshal(value, &j); err != nil {
		return Load{}, fmt.Errorf("load metrics: %w", err)
	}
	if j.WaitingRequests == nil {
		return Load{}, errors.New("load metrics: waiting_requests_num missing")
	}
	if j.GPUCacheUsage == nil {
		return Load{}, errors.New("load metrics: gpu_cache_usage_perc missing")
	}
	return Load{WaitingRequests: *j.WaitingRequests, GPUCacheUsagePerc: *j.GPUCacheUsage}, nil
}

// encodeLoadValue is the XLLM:LOADMETRICS value the master writes.
func encodeLoadValue(l Load) ([]byte, error) {
	return json.Marshal(loadJSON{WaitingRequests: &l.WaitingRequests, GPUCacheUsage: &l.GPUCacheUsagePerc})
}

// validLoad reports whether l can be used for routing.
func validLoad(l Load) bool { return checkUsage(l.GPUCacheUsagePerc) == nil }
