package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
)

// streamEntry is what the tests read of one streams listing entry.
type streamEntry struct {
	InstanceName   string `json:"instance_name"`
	ReplayEndpoint string `json:"replay_endpoint"`
	Incarnation    string `json:"incarnation"`
	SyncMode       string `json:"sync_mode"`
	Topic          string `json:"topic"`
	Synchronized   bool   `json:"synchronized"`
	Complete       bool   `json:"complete"`
	PartialStarts  uint64 `json:"partial_starts"`
	DeviceBlocks   int    `json:"device_blocks"`
	Error          string `json:"error"`
}

// streamsOf reads the streams listing of kvcar's internal listener.
func streamsOf(t *testing.T, internal string) []streamEntry {
	t.Helper()
	code, body := get(t, internal, "/v1/internal/kv-cache/streams", "")
	if code != http.StatusOK {
		t.Fatalf("streams: %d %s", code, body)
	}
	var out struct {
		Streams []streamEntry `json:"streams"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("streams %s: %v", body, err)
	}
	return out.Streams
}

// TestRouteCARToVLLMSidecarEngine is issue 11's done-condition end to end
// (R-DISC-2, R-CAR-2, R-CAR-10): a vLLM server registered as
// xllm-service's vllm_sidecar registers it (XLLM:DEFAULT:<ip:port>,
// backend_type "vllm", HTTP heartbeats to the internal listener), next
// to an xLLM engine, is discovered with discovery.vllm_sync_mode, its
// stream synchronised, and a completion whose prompt shares the prefix
// only it caches is routed there by CAR over the HTTP relay with a
// positive hit ratio. Were vLLM instances skipped by discovery, the
// prompt would have no hit anywhere.
//
// live: vLLM's default --kv-events-config (no replay endpoint, topic
// ""); kvcar joins after the server published, so the view is partial.
// history: a replay endpoint at kvcar's replay port and a per-pod topic;
// the server published before kvcar knew it, and the buffered history
// from sequence 0 gives a complete view.
func TestRouteCARToVLLMSidecarEngine(t *testing.T) {
	for _, mode := range []string{"live", "history"} {
		t.Run(mode, func(t *testing.T) { testRouteToVLLM(t, mode) })
	}
}

func testRouteToVLLM(t *testing.T, mode string) {
	const heartbeat = 50 * time.Millisecond
	etcd := startEtcd(t)
	vllmTopic := ""
	if mode == "history" {
		vllmTopic = "kv@{name}"
	}
	cfg := writeConfig(t, fmt.Sprintf(`{"discovery":{"enabled":true,"block_size":16,"topic":%q,"refresh_interval_ms":50,
		"vllm_sync_mode":%q,"vllm_topic":%q}}`, devcluster.Topic, mode, vllmTopic))
	addrs := startKVCar(t, "--etcd_addr="+strings.Join(etcd.Endpoints(), ","), "--advertise_host=127.0.0.1",
		"--kv_events_config_file="+cfg, "--load_balance_policy=CAR", "--car_prefill_lambda=0.9", "--expose_routing_headers")

	base := enginesim.Config{BlockSize: 16, DeviceBlocks: 256, TimeScale: 0.001}
	xl := startEngine(t, devcluster.Discoverable(base, etcd.Endpoints(), "", heartbeat))

	port, err := enginesim.FreeDiscoveryPort(1, enginesim.DefaultEventPortOffset, enginesim.DefaultReplayPortOffset)
	if err != nil {
		t.Fatal(err)
	}
	name := "127.0.0.1:" + strconv.Itoa(port)
	vc := base
	vc.HTTPAddr = name
	vc.Replay = enginesim.ReplayNone
	if mode == "history" {
		vc.Replay, vc.ReplayTopicFrames, vc.Topic = enginesim.ReplayHistory, true, "kv@"+name
	}
	vl := startEngine(t, devcluster.VLLMSidecar(vc, etcd.Endpoints(), "", heartbeat, "http://"+addrs.internal))
	prefix := make([]uint32, 64)
	for i := range prefix {
		prefix[i] = uint32(1000 + i)
	}
	if mode == "history" {
		// Published at once, most likely before kvcar subscribes: only
		// the replay brings it, and either way it is sequence 0.
		if _, _, err := vl.Prefill(0, prefix); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []*enginesim.Engine{xl, vl} {
		waitUntil(t, "heartbeat of "+e.Name()+" accepted", 10*time.Second, func() bool { return e.LastHeartbeatStatus() == http.StatusOK })
	}
	waitUntil(t, "vLLM instance discovered", 10*time.Second, func() bool {
		for _, s := range streamsOf(t, addrs.internal) {
			if s.InstanceName == name {
				return true
			}
		}
		return false
	})
	if mode == "live" {
		// The server published five batches before kvcar subscribed:
		// the first message kvcar sees is not sequence 0.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := vl.WaitSubscribed(ctx, 0, 1); err != nil {
			t.Fatal(err)
		}
		if err := vl.SkipSeq(0, 5); err != nil {
			t.Fatal(err)
		}
		if _, _, err := vl.Prefill(0, prefix); err != nil {
			t.Fatal(err)
		}
	}
	// A different prefix on the xLLM engine, so that CAR has a cached
	// prefix on each.
	other := make([]uint32, 64)
	for i := range other {
		other[i] = uint32(5000 + i)
	}
	if _, _, err := xl.Prefill(0, other); err != nil {
		t.Fatal(err)
	}

	waitUntil(t, "both streams synchronised with their prefixes", 10*time.Second, func() bool {
		ss := streamsOf(t, addrs.internal)
		n := 0
		for _, s := range ss {
			if s.Synchronized && s.DeviceBlocks == 4 {
				n++
			}
		}
		return len(ss) == 2 && n == 2
	})
	for _, s := range streamsOf(t, addrs.internal) {
		switch s.InstanceName {
		case name:
			wantReplay := mode == "history"
			if s.SyncMode != mode || s.Complete != (mode == "history") || (s.PartialStarts > 0) == (mode == "history") ||
				(s.ReplayEndpoint != "") != wantReplay || s.Topic != vc.Topic || s.Incarnation != vl.IncarnationID() || s.Error != "" {
				t.Fatalf("vLLM stream in %s mode: %+v", mode, s)
			}
		case xl.Name():
			if s.SyncMode != "snapshot" || !s.Complete {
				t.Fatalf("xLLM stream: %+v", s)
			}
		default:
			t.Fatalf("unexpected stream %+v", s)
		}
	}

	ctx := ctxFor(t)
	f := &xllmFleet{addr: addrs.public, internal: addrs.internal, engines: []*enginesim.Engine{xl, vl}}
	prompt := idsPrompt(1000, 80) // the vLLM engine's 64 tokens and 16 more
	resp := f.post(t, ctx, "/v1/completions", prompt)
	a := whole(t, resp)
	hit, _ := strconv.ParseFloat(resp.Header.Get("X-Kvcar-Hit-Ratio"), 64)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Prefill-Name") != name || hit <= 0 {
		t.Fatalf("prompt cached on the vLLM engine: %d to %q with hit ratio %q: %+v", resp.StatusCode,
			resp.Header.Get("X-Prefill-Name"), resp.Header.Get("X-Kvcar-Hit-Ratio"), a)
	}
	// The HTTP relay returns the engine's own answer, kvcar_engine
	// included; baidu_std would have left a record on the engine.
	if a.Engine == nil || a.Engine.Instance != name || a.Engine.DeviceHitTokens != 64 {
		t.Fatalf("vLLM engine's answer: %+v", a.Engine)
	}
	if _, overRPC := f.served(a.ID); overRPC {
		t.Fatalf("request %s to the vLLM engine went over baidu_std", a.ID)
	}

	resp = f.post(t, ctx, "/v1/completions", idsPrompt(5000, 80))
	a = whole(t, resp)
	eu, overRPC := f.served(a.ID)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Prefill-Name") != xl.Name() || !overRPC || eu.DeviceHitTokens != 64 {
		t.Fatalf("prompt cached on the xLLM engine: %d to %q, over baidu_std %v %+v", resp.StatusCode,
			resp.Header.Get("X-Prefill-Name"), overRPC, eu)
	}
}
