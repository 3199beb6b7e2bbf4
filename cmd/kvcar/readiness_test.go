package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

// TestReadyOnlyOnceEtcdListedAndDiscovered covers issue 10 item 8 and
// R-API-1 through the command: while etcd does not answer, /ready stays
// 503 saying what kvcar waits for, and the query API is not served; once
// etcd answers, /ready turns 200 only after the first discovery pass, so
// that the first query a ready kvcar answers already lists the stream of
// the engine registered before it started.
func TestReadyOnlyOnceEtcdListedAndDiscovered(t *testing.T) {
	etcd := startEtcd(t)
	// The engine registers past the relay that Stall black-holes.
	e, err := enginesim.New(enginesim.Config{
		BlockSize: 16, DeviceBlocks: 64, Topic: "xllm-kv",
		DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
		Etcd:             &enginesim.EtcdConfig{Endpoints: []string{etcd.DirectEndpoint()}, Type: enginesim.TypeDefault},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	etcd.Stall()
	cfg := writeConfig(t, `{"discovery":{"enabled":true,"block_size":16,"topic":"xllm-kv","refresh_interval_ms":50}}`)
	addrs := startKVCarListening(t, "--etcd_addr="+etcd.Endpoint(), "--advertise_host=127.0.0.1", "--kv_events_config_file="+cfg)

	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, body := send(t, http.MethodGet, "http://"+addrs.public+"/ready", "", "")
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "etcd") {
			t.Fatalf("/ready while etcd is unreachable: %d %s, want 503 naming etcd", resp.StatusCode, body)
		}
		if code, body := query(t, addrs.internal, "", `{"token_ids":[]}`); code != http.StatusServiceUnavailable {
			t.Fatalf("query API while not ready: %d %s, want 503", code, body)
		}
	}

	if err := etcd.Heal(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "ready after etcd answers", 20*time.Second, func() bool {
		resp, _ := send(t, http.MethodGet, "http://"+addrs.public+"/ready", "", "")
		return resp.StatusCode == http.StatusOK
	})
	code, body := query(t, addrs.internal, "", `{"token_ids":[]}`)
	var got queryResponse
	if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil {
		t.Fatalf("query once ready: %d %s %v", code, body, err)
	}
	if len(got.Matches) != 1 || got.Matches[0].InstanceName != e.Name() {
		t.Fatalf("first query once ready: %s, want the stream of %s, discovered before readiness", body, e.Name())
	}
}
