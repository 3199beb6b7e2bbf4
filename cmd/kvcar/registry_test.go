package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
)

func startEtcd(t *testing.T) *etcdembed.Server {
	t.Helper()
	etcd, err := etcdembed.Start(context.Background(), etcdembed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	return etcd
}

func post(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	resp, b := postJSON(t, url, token, body)
	return resp.StatusCode, string(b)
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDiscoveryAndHeartbeats covers R-DISC-1..3 and R-CAR-10/11 through
// the command: an engine registered in etcd is discovered and indexed,
// its heartbeats reach the master kvcar, and the heartbeat endpoint
// answers 409 for an unknown instance or a stale incarnation and 401
// without the token.
func TestDiscoveryAndHeartbeats(t *testing.T) {
	etcd := startEtcd(t)
	cfg := writeConfig(t, `{"discovery":{"enabled":true,"block_size":16,"topic":"xllm-kv","refresh_interval_ms":50}}`)
	addr := startKVCar(t, "--etcd_addr="+strings.Join(etcd.Endpoints(), ","), "--advertise_host=127.0.0.1",
		"--kv_events_config_file="+cfg, "--internal_api_token=tok").internal

	e, err := enginesim.New(enginesim.Config{
		BlockSize: 16, DeviceBlocks: 64, Topic: "xllm-kv",
		DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
		Etcd:             &enginesim.EtcdConfig{Endpoints: etcd.Endpoints(), Type: enginesim.TypeDefault, LeaseTTL: time.Second},
		Heartbeat:        &enginesim.HeartbeatConfig{Interval: 50 * time.Millisecond, Token: "tok"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitUntil(t, "heartbeats accepted by the master", 10*time.Second, func() bool { return e.LastHeartbeatStatus() == http.StatusOK })

	prompt := make([]uint32, 3*16)
	for i := range prompt {
		prompt[i] = uint32(i + 7)
	}
	if _, _, err := e.Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "discovered stream reports the prefill", 10*time.Second, func() bool {
		_, body := query(t, addr, "tok", tokensJSON(prompt))
		return strings.Contains(string(body), `"instance_name":"`+e.Name()+`"`) && strings.Contains(string(body), `"device_hit_tokens":48`)
	})

	hb := "http://" + addr + "/v1/internal/heartbeat"
	load := `"load_metrics":{"waiting_requests_num":3,"gpu_cache_usage_perc":0.5}`
	for _, tc := range []struct {
		token, body string
		code        int
	}{
		{"", `{"name":"` + e.Name() + `",` + load + `}`, http.StatusUnauthorized},
		{"tok", `{"name":"10.9.9.9:1",` + load + `}`, http.StatusConflict},
		{"tok", `{"name":"` + e.Name() + `","incarnation_id":"stale",` + load + `}`, http.StatusConflict},
		{"tok", `{"name":"` + e.Name() + `","incarnation_id":"` + e.IncarnationID() + `",` + load + `,"cache_event":{"stored_cache":[1,2]}}`, http.StatusOK},
		{"tok", `{"name":` + `7}`, http.StatusBadRequest},
	} {
		if code, body := post(t, hb, tc.token, tc.body); code != tc.code {
			t.Errorf("heartbeat %s: %d %s, want %d", tc.body, code, body, tc.code)
		}
	}
}

// TestMasterFailover covers R-CAR-11: of two kvcar replicas on one etcd
// one holds XLLM:SERVICE:MASTER; when it stops, the other takes over.
func TestMasterFailover(t *testing.T) {
	etcd := startEtcd(t)
	client, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	master := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := client.Get(ctx, "XLLM:SERVICE:MASTER")
		if err != nil || len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	start := func() (string, context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		ready, errc := make(chan listening, 1), make(chan error, 1)
		// The master key holds the rpc address, as xllm-service's does.
		rpcPort := freeTCPPort(t)
		go func() {
			errc <- run(ctx, []string{"--http_server_port=0", "--internal_port=0", "--rpc_server_port=" + rpcPort, "--log_level=error", "--advertise_host=127.0.0.1",
				"--etcd_addr=" + strings.Join(etcd.Endpoints(), ",")}, t.Output(), ready)
		}()
		select {
		case <-ready:
			return "127.0.0.1:" + rpcPort, cancel, errc
		case err := <-errc:
			t.Fatalf("kvcar: %v", err)
		}
		return "", nil, nil
	}
	a, stopA, errA := start()
	waitUntil(t, "first replica elected", 10*time.Second, func() bool { return master() == a })
	b, stopB, errB := start()
	defer func() { stopB(); <-errB }()
	// The second replica must not take over while the first is alive.
	time.Sleep(300 * time.Millisecond)
	if m := master(); m != a {
		t.Fatalf("master %q while %q alive", m, a)
	}
	began := time.Now()
	stopA()
	if err := <-errA; err != nil {
		t.Fatalf("first replica: %v", err)
	}
	waitUntil(t, "second replica takes over", 10*time.Second, func() bool { return master() == b })
	t.Logf("failover took %v", time.Since(began).Round(time.Millisecond))

}

// TestRegistryStallReported: when the path to etcd black-holes, kvcar
// keeps serving and says so: /v1/internal/instances reports the watch
// not live with how long etcd has been silent, the status page shows it,
// and once the path is back the registry follows etcd again.
func TestRegistryStallReported(t *testing.T) {
	etcd := startEtcd(t)
	addr := startKVCar(t, "--etcd_addr="+etcd.Endpoint(), "--internal_api_token="+statusToken).internal
	type watchAnswer struct {
		Watch *struct {
			Live             bool     `json:"live"`
			LastContactAgeMs *float64 `json:"last_contact_age_ms"`
			Stalls           uint64   `json:"stalls"`
		} `json:"watch"`
	}
	watch := func() watchAnswer {
		var w watchAnswer
		getJSON(t, addr, "/v1/internal/instances", &w)
		if w.Watch == nil {
			t.Fatal("instances answer without watch state")
		}
		return w
	}
	waitUntil(t, "registry watch live", 10*time.Second, func() bool { return watch().Watch.Live })

	etcd.Stall()
	waitUntil(t, "stall reported", 15*time.Second, func() bool {
		w := watch().Watch
		return !w.Live && w.Stalls > 0 && w.LastContactAgeMs != nil && *w.LastContactAgeMs > 1000
	})
	if code, page := get(t, addr, "/debug/kvcar", statusToken); code != http.StatusOK || !strings.Contains(page, "etcd silent") {
		t.Fatalf("status page during the stall: %d, want the silence shown\n%s", code, page)
	}
	if err := etcd.Heal(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "registry watch live after the stall", 15*time.Second, func() bool { return watch().Watch.Live })
}
