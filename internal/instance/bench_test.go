package instance

import (
	"fmt"
	"testing"
)

// benchInstances is the number of engines of the heartbeat profile:
// 128 engines, each heartbeating once a second.
const benchInstances = 128

// benchRegistry is a running registry with benchInstances registered
// instances, and their names.
func benchRegistry(b *testing.B) (*Registry, []string) {
	srv := startEtcd(b)
	cli := newClient(b, srv.Endpoint())
	names := make([]string, benchInstances)
	for i := range names {
		names[i] = fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)
		if _, err := cli.Put(b.Context(), engineKey("", Default, names[i]), engineMeta(names[i], Default, "inc").json(b)); err != nil {
			b.Fatal(err)
		}
	}
	reg := startRegistry(b, cli, fastOptions())
	if err := reg.WaitFor(b.Context(), func(s *Snapshot) bool { return len(s.Instances) == benchInstances }); err != nil {
		b.Fatal(err)
	}
	return reg.Registry, names
}

// BenchmarkHeartbeat measures the registry's share of heartbeat
// intake at 128 instances: every heartbeat carries a new load, as an
// engine under traffic reports.
func BenchmarkHeartbeat(b *testing.B) {
	reg, names := benchRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		n := names[i%len(names)]
		l := Load{WaitingRequests: uint64(i % 7), GPUCacheUsagePerc: float64(i%100) / 100}
		if err := reg.Heartbeat(Heartbeat{Name: n, IncarnationID: "inc", Load: &l, Latency: &Latency{RecentMaxTTFT: int64(i % 50)}}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSnapshotPublish measures one publication of the snapshot at
// 128 instances, what every change that must be seen at once costs.
func BenchmarkSnapshotPublish(b *testing.B) {
	reg, _ := benchRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		reg.mu.Lock()
		reg.dirty = true
		reg.flushLocked()
		reg.mu.Unlock()
	}
}

// BenchmarkParseHeartbeat measures decoding one HeartbeatRequest body
// as xLLM sends it.
func BenchmarkParseHeartbeat(b *testing.B) {
	body := []byte(`{"name":"10.0.0.1:8000","incarnation_id":"inc","load_metrics":{"waiting_requests_num":3,"gpu_cache_usage_perc":0.25},"latency_metrics":{"recent_max_ttft":120,"recent_max_tbt":30}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseHeartbeat(body); err != nil {
			b.Fatal(err)
		}
	}
}
