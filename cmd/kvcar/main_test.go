package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

type queryResponse struct {
	IndexEnabled bool `json:"index_enabled"`
	Matches      []struct {
		InstanceName         string `json:"instance_name"`
		DPRank               int    `json:"dp_rank"`
		Synchronized         bool   `json:"synchronized"`
		Sequence             uint64 `json:"sequence"`
		DeviceHitTokens      int    `json:"device_hit_tokens"`
		HostOnlyHitTokens    int    `json:"host_only_hit_tokens"`
		ReusablePrefixTokens int    `json:"reusable_prefix_tokens"`
		DeviceBlocks         int    `json:"device_blocks"`
		HostBlocks           int    `json:"host_blocks"`
		Error                string `json:"error"`
	} `json:"matches"`
}

// startKVCar runs the real command in-process, both listeners on free
// ports, and returns their addresses once /ready says it is ready.
func startKVCar(t *testing.T, args ...string) listening {
	t.Helper()
	addrs := startKVCarListening(t, args...)
	waitUntil(t, "kvcar ready", 10*time.Second, func() bool {
		resp, _ := send(t, http.MethodGet, "http://"+addrs.public+"/ready", "", "")
		return resp.StatusCode == http.StatusOK
	})
	return addrs
}

// startKVCarListening is startKVCar returning as soon as kvcar listens,
// ready or not.
func startKVCarListening(t *testing.T, args ...string) listening {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan listening, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"--http_server_port=0", "--internal_port=0", "--rpc_server_port=0", "--log_level=warn"}, args...), t.Output(), ready)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("kvcar exited: %v", err)
		}
	})
	select {
	case addrs := <-ready:
		return addrs
	case err := <-errc:
		t.Fatalf("kvcar did not start: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("kvcar did not start within 10s")
	}
	return listening{}
}

// startEngine starts an emulated engine that the test closes at its end.
func startEngine(t *testing.T, c enginesim.Config) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// startStaticEngines starts an engine per config and returns them with
// the KV events config's static stream entries for all their DP ranks.
func startStaticEngines(t *testing.T, cfgs ...enginesim.Config) ([]*enginesim.Engine, []string) {
	t.Helper()
	var engines []*enginesim.Engine
	var streams []string
	for _, c := range cfgs {
		e := startEngine(t, c)
		engines = append(engines, e)
		for dp := range e.DPSize() {
			streams = append(streams, fmt.Sprintf(`{"instance_name":%q,"dp_rank":%d,"block_size":%d,"endpoint":%q,"replay_endpoint":%q,"topic":%q}`,
				e.Name(), dp, e.BlockSize(), e.EventEndpoint(dp), e.ReplayEndpoint(dp), c.Topic))
		}
	}
	return engines, streams
}

func writeConfig(t *testing.T, cfg string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kv_events.json")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// send makes one request with the internal token when given and returns
// the response (its body already read and closed) and the body.
func send(t *testing.T, method, url, token, body string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := sendCtx(context.Background(), method, url, token, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// sendCtx is send for goroutines other than the test's, which must not
// fail the test themselves: it returns the error instead.
func sendCtx(ctx context.Context, method, url, token, body string) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("X-Internal-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading the answer: %w", method, url, err)
	}
	return resp, b, nil
}

// postJSON posts a JSON body.
func postJSON(t *testing.T, url, token, body string) (*http.Response, []byte) {
	t.Helper()
	return send(t, http.MethodPost, url, token, body)
}

func query(t *testing.T, addr, token, body string) (int, []byte) {
	t.Helper()
	resp, b := postJSON(t, "http://"+addr+"/v1/internal/kv-cache/query", token, body)
	return resp.StatusCode, b
}

func tokensJSON(tokens []uint32) string {
	b, _ := json.Marshal(map[string][]uint32{"token_ids": tokens})
	return string(b)
}

// TestQueryEndToEnd covers R-API-1..5 through the real command: static
// streams from a config file, emulated engines over TCP, HTTP queries
// with auth, input validation, and hits equal to what the engines reuse.
func TestQueryEndToEnd(t *testing.T) {
	const block = 16
	engines, streams := startStaticEngines(t,
		enginesim.Config{Name: "127.0.0.1:8100", DPSize: 1, BlockSize: block, DeviceBlocks: 128, HostBlocks: 128, Topic: "xllm-kv"},
		enginesim.Config{Name: "127.0.0.1:8101", DPSize: 2, BlockSize: block, DeviceBlocks: 128, HostBlocks: 128, Topic: "xllm-kv"})
	cfg := writeConfig(t, `{"replay_timeout_ms":1000,"streams":[`+strings.Join(streams, ",")+`]}`)
	addr := startKVCar(t, "--kv_events_config_file="+cfg, "--internal_api_token=s3cret").internal

	prompt := make([]uint32, 5*block+3)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	if _, _, err := engines[0].Prefill(0, prompt); err != nil {
		t.Fatal(err)
	}
	if _, _, err := engines[1].Prefill(1, prompt[:2*block]); err != nil {
		t.Fatal(err)
	}

	// R-API-2: auth.
	for _, tok := range []string{"", "wrong", "s3cre", "s3crett"} {
		if code, body := query(t, addr, tok, `{"token_ids":[]}`); code != http.StatusUnauthorized || !strings.Contains(string(body), `"error"`) {
			t.Fatalf("token %q: %d %s", tok, code, body)
		}
	}

	var resp queryResponse
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := query(t, addr, "s3cret", tokensJSON(prompt))
		if code != http.StatusOK {
			t.Fatalf("query: %d %s", code, body)
		}
		resp = queryResponse{}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatalf("response %s: %v", body, err)
		}
		if len(resp.Matches) == 3 && resp.Matches[0].DeviceHitTokens == 5*block && resp.Matches[2].DeviceHitTokens == 2*block &&
			resp.Matches[1].Synchronized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hits not visible: %s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !resp.IndexEnabled {
		t.Fatal("index_enabled false")
	}
	want := []struct {
		e  *enginesim.Engine
		dp int
	}{{engines[0], 0}, {engines[1], 0}, {engines[1], 1}}
	for i, w := range want {
		m := resp.Matches[i]
		dev, host := w.e.Oracle(w.dp, prompt)
		if m.InstanceName != w.e.Name() || m.DPRank != w.dp || !m.Synchronized ||
			m.DeviceHitTokens != dev || m.HostOnlyHitTokens != host || m.ReusablePrefixTokens != dev+host || m.Error != "" {
			t.Errorf("match %d = %+v, engine reuses device=%d host=%d", i, m, dev, host)
		}
	}

	// R-API-3: empty token_ids gives status and resident counts.
	code, body := query(t, addr, "s3cret", `{"token_ids":[]}`)
	resp = queryResponse{}
	if err := json.Unmarshal(body, &resp); code != http.StatusOK || err != nil {
		t.Fatalf("status query: %d %s %v", code, body, err)
	}
	if resp.Matches[0].DeviceBlocks != 5 || resp.Matches[0].DeviceHitTokens != 0 || resp.Matches[2].DeviceBlocks != 2 {
		t.Fatalf("status: %s", body)
	}

	// R-API-5: bad input gets a 4xx naming the problem and changes nothing.
	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`not json`, 400, ""},
		{`{"token_ids":"1,2"}`, 400, "token_ids"},
		{`{"token_ids":[1,-2]}`, 400, "token_ids[1]"},
		{`{"token_ids":[4294967296]}`, 400, "token_ids[0]"},
		{`{"token_ids":[1.5]}`, 400, "token_ids[0]"},
		{`{"tokens":[1]}`, 400, "tokens"},
		{`{"token_ids":[1]} x`, 400, ""},
		{`{"token_ids":[` + strings.Repeat("1,", 6<<20) + `1]}`, 413, ""},
	} {
		code, body := query(t, addr, "s3cret", tc.body)
		if code != tc.code || !strings.Contains(string(body), tc.want) || !strings.Contains(string(body), `"message"`) {
			t.Errorf("body %.40q: %d %s", tc.body, code, body)
		}
	}
	code, body = query(t, addr, "s3cret", `{"token_ids":[]}`)
	after := queryResponse{}
	if err := json.Unmarshal(body, &after); code != 200 || err != nil || after.Matches[0].DeviceBlocks != 5 {
		t.Fatalf("directory changed by bad input: %s", body)
	}
}

// TestBadConfigFailsAtStartup covers R-CFG-5: a bad config stops the
// command before it serves, naming the key and the allowed range.
func TestBadConfigFailsAtStartup(t *testing.T) {
	cfg := writeConfig(t, `{"max_streams":500}`)
	err := run(context.Background(), []string{"--http_server_port=0", "--rpc_server_port=0", "--kv_events_config_file=" + cfg}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "max_streams") || !strings.Contains(err.Error(), "128") {
		t.Fatalf("err = %v", err)
	}
	if err := run(context.Background(), []string{"--port=70000"}, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "--port") {
		t.Fatalf("bad port: %v", err)
	}
}

// TestIndexDisabled covers R-CFG-1: without a config file kvcar serves
// and reports the index as disabled.
func TestIndexDisabled(t *testing.T) {
	addr := startKVCar(t).internal
	code, body := query(t, addr, "", `{"token_ids":[1,2,3]}`)
	if code != http.StatusOK || !strings.Contains(string(body), `"index_enabled":false`) {
		t.Fatalf("%d %s", code, body)
	}
}
