package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/tokenizer"
)

type cluster struct {
	etcd    *etcdembed.Server
	engines []*enginesim.Engine
	// addr is the public listener, internal the internal one.
	addr, internal string
}

// startCluster runs an embedded etcd, n emulated engines that register
// and heartbeat, and kvcar with discovery and the given flags; it returns
// once every engine's heartbeat is accepted and its stream synchronised.
func startCluster(t *testing.T, n int, mod func(*enginesim.Config), flags ...string) *cluster {
	t.Helper()
	noGoroutineLeft(t)
	c := &cluster{etcd: startEtcd(t)}
	cfg := writeConfig(t, `{"discovery":{"enabled":true,"block_size":16,"topic":"xllm-kv","refresh_interval_ms":50}}`)
	addrs := startKVCar(t, append([]string{"--etcd_addr=" + strings.Join(c.etcd.Endpoints(), ","), "--advertise_host=127.0.0.1",
		"--kv_events_config_file=" + cfg}, flags...)...)
	c.addr, c.internal = addrs.public, addrs.internal
	for range n {
		ec := enginesim.Config{
			BlockSize: 16, DeviceBlocks: 256, Topic: "xllm-kv", TimeScale: 0.001,
			DiscoveryOffsets: enginesim.DefaultDiscoveryOffsets(),
			Etcd:             &enginesim.EtcdConfig{Endpoints: c.etcd.Endpoints(), Type: enginesim.TypeDefault, LeaseTTL: time.Second},
			Heartbeat:        &enginesim.HeartbeatConfig{Interval: 50 * time.Millisecond},
		}
		if mod != nil {
			mod(&ec)
		}
		c.engines = append(c.engines, startEngine(t, ec))
	}
	for _, e := range c.engines {
		waitUntil(t, "heartbeat accepted", 10*time.Second, func() bool { return e.LastHeartbeatStatus() == http.StatusOK })
	}
	waitUntil(t, "all streams synchronised", 10*time.Second, func() bool {
		_, body := query(t, c.internal, "", `{"token_ids":[]}`)
		return strings.Count(string(body), `"synchronized":true`) == n
	})
	return c
}

type completion struct {
	status  int
	prefill string
	policy  string
	hit     string
	body    string
	engine  enginesim.EngineUsage
}

func (c *cluster) complete(t *testing.T, path, body string) completion {
	t.Helper()
	resp, b := postJSON(t, "http://"+c.addr+path, "", body)
	return c.completionOf(resp, b)
}

// completionOf reads an answer whose body b has been read.
func (c *cluster) completionOf(resp *http.Response, b []byte) completion {
	out := completion{status: resp.StatusCode, prefill: resp.Header.Get("X-Prefill-Name"), policy: resp.Header.Get("X-Kvcar-Policy"),
		hit: resp.Header.Get("X-Kvcar-Hit-Ratio"), body: string(b)}
	out.engine, _ = engineReport(b, c.engines)
	return out
}

// engineReport is what the engine did for the request an answer
// answers: the kvcar_engine object an answer relayed over HTTP carries,
// else the record the engine kept of a request it took over baidu_std,
// by the answer's id. ok is false when there is neither.
func engineReport(answer []byte, engines []*enginesim.Engine) (eu enginesim.EngineUsage, ok bool) {
	var parsed struct {
		ID     string                 `json:"id"`
		Engine *enginesim.EngineUsage `json:"kvcar_engine"`
	}
	if json.Unmarshal(answer, &parsed) != nil {
		return eu, false
	}
	if parsed.Engine != nil {
		return *parsed.Engine, true
	}
	return devcluster.Engines(engines).Served(parsed.ID)
}

func idsPrompt(from, n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(from + i)
	}
	return `{"model":"m","max_tokens":2,"prompt":[` + strings.Join(ids, ",") + `]}`
}

// TestRouteCAR covers R-CAR-2..3 end to end: a repeated prompt goes back
// to the instance that cached it, which then reuses its prefix; the
// decision travels to the engine as routing names.
func TestRouteCAR(t *testing.T) {
	c := startCluster(t, 3, nil, "--load_balance_policy=CAR", "--car_prefill_lambda=0.9", "--expose_routing_headers")
	first := c.complete(t, "/v1/completions", idsPrompt(1000, 64))
	if first.status != 200 || first.policy != "CAR" || first.engine.Instance != first.prefill || first.engine.PrefillName != first.prefill {
		t.Fatalf("first: %+v", first)
	}
	ids := make([]uint32, 64)
	for i := range ids {
		ids[i] = uint32(1000 + i)
	}
	waitUntil(t, "prefill events indexed", 5*time.Second, func() bool {
		_, body := query(t, c.internal, "", tokensJSON(ids))
		return strings.Contains(string(body), `"device_hit_tokens":64`)
	})
	for range 3 {
		again := c.complete(t, "/v1/completions", idsPrompt(1000, 64))
		if again.status != 200 || again.prefill != first.prefill || again.engine.DeviceHitTokens != 64 {
			t.Fatalf("repeat went to %s with %d hit tokens (first was %s): %s", again.prefill, again.engine.DeviceHitTokens, first.prefill, again.body)
		}
	}
}

// TestRouteRR covers R-CAR-9: RR rotates over the instances whatever the
// cache holds.
func TestRouteRR(t *testing.T) {
	c := startCluster(t, 3, nil, "--load_balance_policy=RR", "--expose_routing_headers")
	seen := map[string]int{}
	for i := range 6 {
		r := c.complete(t, "/v1/completions", idsPrompt(i*100, 32))
		if r.status != 200 || r.policy != "RR" {
			t.Fatalf("request %d: %+v", i, r)
		}
		seen[r.prefill]++
	}
	if len(seen) != 3 {
		t.Fatalf("RR used %d of 3 instances: %v", len(seen), seen)
	}
	for name, n := range seen {
		if n != 2 {
			t.Fatalf("RR sent %d of 6 requests to %s: %v", n, name, seen)
		}
	}
}

// TestRouteSLOAwareStreamingAndChat covers SLO_AWARE routing, SSE relay
// and chat requests routed by load without a tokenizer.
func TestRouteSLOAwareStreamingAndChat(t *testing.T) {
	c := startCluster(t, 2, nil, "--load_balance_policy=SLO_AWARE", "--expose_routing_headers")
	r := c.complete(t, "/v1/completions", strings.Replace(idsPrompt(5, 32), `"max_tokens":2`, `"max_tokens":3,"stream":true`, 1))
	if r.status != 200 || r.policy != "SLO_AWARE" || !strings.Contains(r.body, "data: ") || !strings.HasSuffix(strings.TrimSpace(r.body), "data: [DONE]") {
		t.Fatalf("stream: %d %q", r.status, r.body)
	}
	chat := c.complete(t, "/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hello there"}]}`)
	if chat.status != 200 || chat.prefill == "" {
		t.Fatalf("chat: %+v", chat)
	}
	models, err := http.Get("http://" + c.addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(models.Body)
	models.Body.Close()
	if models.StatusCode != 200 || !strings.Contains(string(b), `"object":"list"`) {
		t.Fatalf("models: %d %s", models.StatusCode, b)
	}
}

// TestRouteErrors covers clear errors on the request path: bad JSON and
// prompts get 400 naming the field, an engine error is relayed, and no
// instance gives 503.
func TestRouteErrors(t *testing.T) {
	c := startCluster(t, 1, nil, "--load_balance_policy=CAR", "--expose_routing_headers")
	for _, tc := range []struct {
		body, want string
		code       int
	}{
		{`{`, "invalid JSON: unexpected end of body", 400},
		{`{"model":"m"}`, "prompt", 400},
		{`{"prompt":[1,-5]}`, "prompt[1]", 400},
		{`{"prompt":{"a":1}}`, "prompt", 400},
	} {
		if r := c.complete(t, "/v1/completions", tc.body); r.status != tc.code || !strings.Contains(r.body, tc.want) {
			t.Errorf("%s: %d %s", tc.body, r.status, r.body)
		}
	}
	c.engines[0].SetFailRequests(http.StatusServiceUnavailable)
	if r := c.complete(t, "/v1/completions", idsPrompt(1, 16)); r.status != http.StatusServiceUnavailable || r.prefill != c.engines[0].Name() {
		t.Errorf("engine failure relayed as %d from %q: %s", r.status, r.prefill, r.body)
	}
	c.engines[0].SetFailRequests(0)
	if err := c.engines[0].Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "no instance left", 10*time.Second, func() bool {
		r := c.complete(t, "/v1/completions", idsPrompt(1, 16))
		return r.status == http.StatusServiceUnavailable && strings.Contains(r.body, "no instance can serve")
	})
}

// TestDirectoryFaultDoesNotBlockRouting covers R-CAR-8: with every stream
// unsynchronised (snapshots never answered), CAR still routes every
// request, on load alone.
func TestDirectoryFaultDoesNotBlockRouting(t *testing.T) {
	c := startCluster(t, 2, nil, "--load_balance_policy=CAR")
	// A first message gives each stream a live sequence, so the skip below
	// is a gap in the middle of the stream.
	for _, e := range c.engines {
		if _, _, err := e.Prefill(0, []uint32{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "first messages applied", 10*time.Second, func() bool {
		_, body := query(t, c.internal, "", `{"token_ids":[]}`)
		return strings.Count(string(body), `"device_blocks":1`) == 2
	})
	for _, e := range c.engines {
		if err := e.SetReplayMode(0, enginesim.ReplayIgnore); err != nil {
			t.Fatal(err)
		}
		if err := e.SkipSeq(0, 3); err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.Prefill(0, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "streams unsynchronised", 10*time.Second, func() bool {
		_, body := query(t, c.internal, "", `{"token_ids":[]}`)
		return strings.Count(string(body), `"synchronized":false`) == 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		if ctx.Err() != nil {
			t.Fatal("routing blocked")
		}
		if r := c.complete(t, "/v1/completions", idsPrompt(i*50, 32)); r.status != 200 {
			t.Fatalf("request %d during the directory fault: %d %s", i, r.status, r.body)
		}
	}
}

// TestMetricsEndpoint checks /metrics after routed traffic: stream,
// registry, routing and HTTP series are all served.
func TestMetricsEndpoint(t *testing.T) {
	c := startCluster(t, 1, nil, "--load_balance_policy=CAR")
	if r := c.complete(t, "/v1/completions", idsPrompt(1, 32)); r.status != 200 {
		t.Fatalf("completion: %d %s", r.status, r.body)
	}
	resp, err := http.Get("http://" + c.internal + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	for _, want := range []string{
		`kvcar_stream_synchronized{dp_rank="0",instance="` + c.engines[0].Name() + `"} 1`,
		`kvcar_instances{state="ACTIVE",type="DEFAULT"} 1`,
		`kvcar_instances_with_load 1`,
		`kvcar_service_is_master 1`,
		`kvcar_routing_decisions_total{policy="CAR",role="default"} 1`,
		`kvcar_routing_decision_seconds_count{policy="CAR"} 1`,
		`kvcar_http_requests_total{code="200",route="/v1/completions"} 1`,
		`kvcar_discovery_exclusions{reason="port_conflict"} 0`,
		`kvcar_stream_event_lag_seconds_count`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %s", want)
		}
	}
}

// TestRouteChatWithTokenizer covers the text path of R-CAR-2: with
// --tokenizer_path, kvcar applies the model's chat template and
// tokenizer, so a repeated conversation goes back to the instance that
// cached it, exactly as for token-id prompts.
func TestRouteChatWithTokenizer(t *testing.T) {
	const dir = "../../internal/tokenizer/testdata/qwen2like"
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 3, func(ec *enginesim.Config) { ec.Tokenizer = tok },
		"--load_balance_policy=CAR", "--car_prefill_lambda=0.9", "--tokenizer_path="+dir, "--expose_routing_headers")
	chat := `{"model":"m","max_tokens":2,"messages":[{"role":"system","content":"` + strings.Repeat("You are a careful assistant. ", 12) +
		`"},{"role":"user","content":"Tell me about prefix caches and routing."}]}`
	first := c.complete(t, "/v1/chat/completions", chat)
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	var again completion
	waitUntil(t, "repeat routed to the cached instance with a hit", 10*time.Second, func() bool {
		again = c.complete(t, "/v1/chat/completions", chat)
		// A non-zero hit ratio proves kvcar's own token ids (template +
		// tokenizer) matched the blocks the engine announced.
		return again.status == 200 && again.prefill == first.prefill && again.engine.DeviceHitTokens > 0 &&
			again.hit != "" && again.hit != "0.0000"
	})
	if first.engine.DeviceHitTokens != 0 {
		t.Fatalf("first request hit %d tokens on an empty cache", first.engine.DeviceHitTokens)
	}
}
