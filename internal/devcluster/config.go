package devcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvcar/kvcar/internal/config"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/kvevent"
)

// Topic is the KV events topic the engines publish and the discovery
// config subscribes to.
const Topic = "xllm-kv"

// DiscoveryConfig returns kvcar's default KV events config with discovery
// of engines made Discoverable enabled, blockSize tokens per block and a
// registry check every refresh. Callers change the limits they measure.
func DiscoveryConfig(blockSize int, refresh time.Duration) config.Config {
	c := config.Default()
	c.Discovery.Enabled = true
	// The index uses discovery.block_size, so it must be the engines'.
	c.Discovery.BlockSize = blockSize
	c.Discovery.Topic = Topic
	// A VLLMSidecar engine with vLLM's default --kv-events-config: no
	// replay endpoint, topic "".
	c.Discovery.VLLMSyncMode = config.SyncLive
	c.Discovery.VLLMTopic = ""
	c.Discovery.EventPortOffset = enginesim.DefaultEventPortOffset
	c.Discovery.ReplayPortOffset = enginesim.DefaultReplayPortOffset
	c.Discovery.RefreshInterval = refresh
	return c
}

// WriteConfig writes c as a KV events config file in dir and returns its
// path. It parses the file back first, so that a limit out of range is
// reported here rather than by a kvcar exiting at start-up.
func WriteConfig(dir string, c config.Config) (string, error) {
	b, err := c.MarshalJSON()
	if err != nil {
		return "", fmt.Errorf("kv events config: %w", err)
	}
	if _, err := config.Parse(b); err != nil {
		return "", fmt.Errorf("kv events config: %w", err)
	}
	path := filepath.Join(dir, "kv_events_discovery_config.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("kv events config: %w", err)
	}
	return path, nil
}

// Discoverable returns c set up so that kvcar running DiscoveryConfig
// finds it: it publishes Topic on the ports the default discovery offsets
// derive from its HTTP port (a free loopback one unless c.HTTPAddr names
// one) and, when etcd is not empty, registers as a DEFAULT instance under
// namespace and reports its load to the master every heartbeat
// (enginesim's default interval when 0). Without etcd it serves HTTP
// only, for a caller that routes to it directly.
func Discoverable(c enginesim.Config, etcd []string, namespace string, heartbeat time.Duration) enginesim.Config {
	c.Topic = Topic
	c.DiscoveryOffsets = enginesim.DefaultDiscoveryOffsets()
	if len(etcd) > 0 {
		c.Etcd = &enginesim.EtcdConfig{Endpoints: etcd, Namespace: namespace, Type: enginesim.TypeDefault}
		c.Heartbeat = &enginesim.HeartbeatConfig{Interval: heartbeat}
	}
	return c
}

// VLLMShape is what vLLM 0.26 and later publish: tagged-map events with
// every field vLLM writes for plain text, "GPU"/"CPU" mediums and 32-byte
// sha256 block hashes.
var VLLMShape = kvevent.Shape{Hashes: kvevent.HashDigest32, UpperMedium: true, VLLMFields: true}

// sidecarMeta makes an engine's meta JSON the one xllm-service's
// vllm_sidecar puts in etcd: name, rpc_address, type 0, backend_type
// "vllm", incarnation_id and register_ts_ms, nothing of an xLLM engine's
// own fields.
func sidecarMeta() map[string]any {
	m := map[string]any{"backend_type": "vllm"}
	for _, k := range []string{"dp_size", "block_size", "cluster_ids", "addrs", "ports", "kv_split_size",
		"ttft_profiling_data", "tpot_profiling_data"} {
		m[k] = nil // removed from the generated meta
	}
	return m
}

// VLLMSidecar returns c set up as a vLLM server registered the way
// xllm-service's vllm_sidecar registers it: XLLM:DEFAULT:<ip:port> with
// backend_type "vllm" under namespace in etcd, load reported as HTTP
// heartbeats to serviceURL (kvcar's internal listener, "http://ip:port")
// every heartbeat, vLLM's event encoding on the ports the default
// discovery offsets derive from its HTTP port. c.Replay and c.Topic say
// what its --kv-events-config does (ReplayNone and "" are vLLM's
// defaults; kvcar's discovery.vllm_sync_mode and vllm_topic must agree).
func VLLMSidecar(c enginesim.Config, etcd []string, namespace string, heartbeat time.Duration, serviceURL string) enginesim.Config {
	c.Shape = VLLMShape
	c.DiscoveryOffsets = enginesim.DefaultDiscoveryOffsets()
	c.Etcd = &enginesim.EtcdConfig{Endpoints: etcd, Namespace: namespace, Type: enginesim.TypeDefault, ExtraMeta: sidecarMeta()}
	c.Heartbeat = &enginesim.HeartbeatConfig{Interval: heartbeat, HTTPURL: serviceURL}
	return c
}
