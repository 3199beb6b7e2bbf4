package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/etcdembed"
	"github.com/kvcar/kvcar/internal/leakcheck"
)

// xllmFleet is kvcar run as the command runs, with emulated engines that
// register in its etcd: xLLM engines (the default backend_type) that
// heartbeat over baidu_std to XLLM:SERVICE:MASTER, kvcar's rpc address,
// and take requests over baidu_std; vLLM engines (backend_type "vllm")
// that heartbeat over HTTP to the internal listener, as xllm-service's
// sidecar does, and take the OpenAI JSON.
type xllmFleet struct {
	etcd           *etcdembed.Server
	addr, internal string
	engines        []*enginesim.Engine
}

func startFleet(t *testing.T, flags ...string) *xllmFleet {
	t.Helper()
	noGoroutineLeft(t)
	f := &xllmFleet{etcd: startEtcd(t)}
	addrs := startKVCar(t, append([]string{"--etcd_addr=" + strings.Join(f.etcd.Endpoints(), ","), "--advertise_host=127.0.0.1",
		"--expose_routing_headers"}, flags...)...)
	f.addr, f.internal = addrs.public, addrs.internal
	return f
}

// noGoroutineLeft fails the test when a goroutine started during it
// outlives it. Registered before anything starts, it runs after the
// other cleanups have closed the engines, kvcar and etcd: each must
// have stopped and waited for its own goroutines by then (an engine for
// the requests it serves over baidu_std, kvcar for the requests it
// dispatched), and the test for those it started itself.
func noGoroutineLeft(t *testing.T) {
	t.Helper()
	base := leakcheck.Baseline()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections() // the test's own keep-alive connections
		if left := leakcheck.Leaked(base); left != "" {
			t.Errorf("goroutines still running after the engines, kvcar and etcd were closed:\n%s", left)
		}
	})
}

// engine starts an engine of type typ; vllm makes it the sidecar's kind.
func (f *xllmFleet) engine(t *testing.T, typ enginesim.InstanceType, vllm bool, mod func(*enginesim.Config)) *enginesim.Engine {
	t.Helper()
	ec := enginesim.Config{HTTPAddr: "127.0.0.1:0", BlockSize: 16, DeviceBlocks: 256, TimeScale: 0.001,
		Etcd:      &enginesim.EtcdConfig{Endpoints: f.etcd.Endpoints(), Type: typ, LeaseTTL: time.Second},
		Heartbeat: &enginesim.HeartbeatConfig{Interval: 50 * time.Millisecond}}
	if vllm {
		ec.Etcd.ExtraMeta = map[string]any{"backend_type": "vllm"}
		ec.Heartbeat.HTTPURL = "http://" + f.internal
	}
	if mod != nil {
		mod(&ec)
	}
	e := startEngine(t, ec)
	waitUntil(t, "heartbeat accepted", 10*time.Second, func() bool { return e.LastHeartbeatStatus() == http.StatusOK })
	if master := e.HeartbeatMaster(); !vllm && !strings.HasPrefix(master, "127.0.0.1:") {
		t.Fatalf("engine %s heartbeats to %q", e.Name(), master)
	}
	f.engines = append(f.engines, e)
	return e
}

// served finds what an engine did for the request an answer's id names:
// only a request that came over baidu_std has such a record.
func (f *xllmFleet) served(id string) (enginesim.EngineUsage, bool) {
	return devcluster.Engines(f.engines).Served(id)
}

// inFlight reads kvcar_xllm_requests_in_flight from /metrics.
func (f *xllmFleet) inFlight(t *testing.T) string {
	t.Helper()
	return gauge(t, f.internal, "kvcar_xllm_requests_in_flight")
}

// gauge reads a metric without labels from the /metrics of the internal
// listener at addr.
func gauge(t *testing.T, addr, name string) string {
	t.Helper()
	v, ok := sample(t, addr, name)
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return v
}

// sample reads the value of a metric without labels from the /metrics of
// the internal listener at addr; ok is false when kvcar serves none.
func sample(t *testing.T, addr, name string) (v string, ok bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v, true
		}
	}
	return "", false
}

// waitNoneInFlight waits until no request waits for output, and checks
// that the output queued for them all was let go.
func (f *xllmFleet) waitNoneInFlight(t *testing.T) {
	t.Helper()
	waitUntil(t, "no request left waiting for xLLM output", 5*time.Second, func() bool { return f.inFlight(t) == "0" })
	if q := gauge(t, f.internal, "kvcar_xllm_queued_output_bytes"); q != "0" {
		t.Fatalf("with no request in flight, %s bytes of output queued", q)
	}
}

type answer struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Engine *enginesim.EngineUsage `json:"kvcar_engine"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (f *xllmFleet) post(t *testing.T, ctx context.Context, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func whole(t *testing.T, resp *http.Response) answer {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
	return a
}

// sse reads a stream to its end: its chunks and whether [DONE] ended it.
func sse(t *testing.T, resp *http.Response) (chunks []answer, done bool) {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("content type %q: %s", ct, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var a answer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		chunks = append(chunks, a)
	}
	return chunks, done
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// R-CAR-2, R-CAR-10: kvcar serves an xLLM fleet as xllm-service does.
// Engines heartbeat over baidu_std to the rpc address in the master key,
// CAR routes each request, kvcar sends it over baidu_std and writes the
// engine's Generations as the OpenAI answer: completions and chat, whole
// and streamed, with usage (cached tokens included) and finish reasons.
// A vLLM engine in the same fleet keeps the HTTP relay.
func TestDispatchToXLLMEngines(t *testing.T) {
	f := startFleet(t, "--load_balance_policy=CAR", "--rpc_max_queued_output_bytes=8388608")
	if got := gauge(t, f.internal, "kvcar_xllm_queued_output_limit_bytes"); got != "8.388608e+06" {
		t.Fatalf("the output queues' bound is %s, want the flag's 8388608", got)
	}
	xl := f.engine(t, enginesim.TypeDefault, false, nil)
	ctx := ctxFor(t)

	resp := f.post(t, ctx, "/v1/completions", idsPrompt(100, 32))
	a := whole(t, resp)
	eu, overRPC := f.served(a.ID)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Prefill-Name") != xl.Name() || !overRPC || eu.PrefillName != xl.Name() {
		t.Fatalf("completion: %d %+v, served over baidu_std %v %+v", resp.StatusCode, a, overRPC, eu)
	}
	if a.Object != "text_completion" || len(a.Choices) != 1 || *a.Choices[0].Text != "tok1 tok2" || *a.Choices[0].FinishReason != "length" ||
		a.Usage == nil || a.Usage.PromptTokens != 32 || a.Usage.CompletionTokens != 2 || a.Usage.TotalTokens != 34 || a.Engine != nil {
		t.Fatalf("completion answer %+v", a)
	}
	// The same prompt again: the engine reuses its cache and says so.
	a = whole(t, f.post(t, ctx, "/v1/completions", idsPrompt(100, 32)))
	if a.Usage == nil || a.Usage.PromptTokensDetails == nil || a.Usage.PromptTokensDetails.CachedTokens != 32 {
		t.Fatalf("repeated completion: %+v", a.Usage)
	}

	// Streamed chat with usage: the role, a chunk per token, the finish
	// reason, the usage, [DONE].
	resp = f.post(t, ctx, "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":3,"stream_options":{"include_usage":true},`+
		`"messages":[{"role":"user","content":"hello there"}]}`)
	chunks, done := sse(t, resp)
	if !done || len(chunks) != 6 || chunks[0].Object != "chat.completion.chunk" || chunks[0].Choices[0].Delta.Role != "assistant" {
		t.Fatalf("streamed chat: done %v %+v", done, chunks)
	}
	var text string
	for _, c := range chunks[1:4] {
		text += *c.Choices[0].Delta.Content
	}
	if text != "tok1 tok2" && text != "tok1 tok2 tok3" || *chunks[4].Choices[0].FinishReason != "length" ||
		chunks[5].Usage == nil || chunks[5].Usage.CompletionTokens != 3 || len(chunks[5].Choices) != 0 {
		t.Fatalf("streamed chat chunks %+v", chunks)
	}
	if _, ok := f.served(chunks[0].ID); !ok {
		t.Errorf("chat %s was not served over baidu_std", chunks[0].ID)
	}

	// Whole chat; streamed completion without usage.
	a = whole(t, f.post(t, ctx, "/v1/chat/completions", `{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	if a.Object != "chat.completion" || a.Choices[0].Message == nil || a.Choices[0].Message.Content != "tok1 tok2" ||
		a.Choices[0].Message.Role != "assistant" || *a.Choices[0].FinishReason != "length" || a.Usage.CompletionTokens != 2 {
		t.Fatalf("whole chat %+v", a)
	}
	chunks, done = sse(t, f.post(t, ctx, "/v1/completions", strings.Replace(idsPrompt(7, 16), `"max_tokens":2`, `"max_tokens":2,"stream":true`, 1)))
	if !done || len(chunks) != 3 || *chunks[0].Choices[0].Text != "tok1" || *chunks[2].Choices[0].FinishReason != "length" {
		t.Fatalf("streamed completion: done %v %+v", done, chunks)
	}
	// The engine counts a request once kvcar has taken its last output.
	waitUntil(t, "five completed where they were routed", 5*time.Second, func() bool {
		st := xl.Stats()
		return st.Completed == 5 && st.Misrouted == 0
	})
	f.waitNoneInFlight(t)

	// A vLLM engine joins the fleet. A prompt cached nowhere goes by load,
	// ties rotating, so both get requests; each answer shows its path.
	vl := f.engine(t, enginesim.TypeDefault, true, nil)
	seen := map[string]bool{}
	waitUntil(t, "both engines answered", 10*time.Second, func() bool {
		a := whole(t, f.post(t, ctx, "/v1/completions", idsPrompt(len(seen)*1000+5000, 16)))
		switch {
		case a.Engine != nil && a.Engine.Instance == vl.Name():
			// The HTTP relay: the engine's own answer, its kvcar_engine
			// object included, and no baidu_std record.
			if _, ok := f.served(a.ID); ok {
				t.Fatalf("vLLM answer %s has a baidu_std record", a.ID)
			}
			seen["vllm"] = true
		case a.Engine == nil:
			if eu, ok := f.served(a.ID); !ok || eu.Instance != xl.Name() {
				t.Fatalf("xLLM answer %+v not served over baidu_std", a)
			}
			seen["xllm"] = true
		default:
			t.Fatalf("answer %+v", a)
		}
		return seen["vllm"] && seen["xllm"]
	})
	f.waitNoneInFlight(t)
}

// PD over baidu_std: CAR picks a prefill and a decode instance, kvcar
// sends the request to the prefill instance with the decode name, and the
// output arrives from the decode instance.
func TestDispatchPrefillDecode(t *testing.T) {
	f := startFleet(t, "--load_balance_policy=CAR")
	p := f.engine(t, enginesim.TypePrefill, false, nil)
	d := f.engine(t, enginesim.TypeDecode, false, nil)
	ctx := ctxFor(t)
	resp := f.post(t, ctx, "/v1/completions", strings.Replace(idsPrompt(1, 32), `"max_tokens":2`, `"max_tokens":4,"stream":true`, 1))
	if resp.Header.Get("X-Prefill-Name") != p.Name() || resp.Header.Get("X-Decode-Name") != d.Name() {
		t.Fatalf("decision %s / %s", resp.Header.Get("X-Prefill-Name"), resp.Header.Get("X-Decode-Name"))
	}
	chunks, done := sse(t, resp)
	var text string
	for _, c := range chunks {
		if len(c.Choices) > 0 && c.Choices[0].Text != nil {
			text += *c.Choices[0].Text
		}
	}
	if !done || text != "tok1 tok2 tok3 tok4" {
		t.Fatalf("PD stream %q, done %v", text, done)
	}
	a := whole(t, f.post(t, ctx, "/v1/chat/completions", `{"max_tokens":3,"messages":[{"role":"user","content":"hi there"}]}`))
	if a.Choices[0].Message == nil || a.Choices[0].Message.Content != "tok1 tok2 tok3" || a.Usage.CompletionTokens != 3 {
		t.Fatalf("PD chat %+v", a)
	}
	if eu, ok := f.served(a.ID); !ok || eu.Instance != p.Name() || eu.PrefillName != p.Name() || eu.DecodeName != d.Name() {
		t.Fatalf("prefill record %+v (%v)", eu, ok)
	}
	waitUntil(t, "prefilled on P, decoded on D", 5*time.Second, func() bool {
		ps, ds := p.Stats(), d.Stats()
		return ps.Requests == 2 && ps.Completed == 0 && ds.Decoded == 2 && ds.Completed == 2 && ds.Requests == 0
	})
	f.waitNoneInFlight(t)
}

// A client that goes away ends its request: kvcar refuses the engine's
// next Generations, the engine stops the request and frees its slot, and
// kvcar keeps nothing of it.
func TestDispatchClientCancellation(t *testing.T) {
	f := startFleet(t, "--load_balance_policy=RR")
	e := f.engine(t, enginesim.TypeDefault, false, func(c *enginesim.Config) {
		c.BatchSlots, c.DecodePerToken = 1, 20*time.Second // 20 ms a token at TimeScale 0.001
	})
	ctx, cancel := context.WithCancel(context.Background())
	resp := f.post(t, ctx, "/v1/completions", `{"prompt":[1,2,3],"max_tokens":10000,"stream":true}`)
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("no first chunk: %v", err)
	}
	if got := f.inFlight(t); got != "1" {
		t.Errorf("%s requests in flight while one streams", got)
	}
	cancel()
	resp.Body.Close()
	f.waitNoneInFlight(t)
	waitUntil(t, "the engine stopped the request", 5*time.Second, func() bool {
		st := e.Stats()
		return st.Cancelled == 1 && st.Running == 0 && st.Completed == 0
	})
	// The slot is free again: the next request is served.
	if a := whole(t, f.post(t, ctxFor(t), "/v1/completions", `{"prompt":[4,5],"max_tokens":1}`)); len(a.Choices) != 1 {
		t.Fatalf("after the cancellation: %+v", a)
	}
}

// An engine that dies with a request in flight: the client gets an error
// naming no engine soon after kvcar's registry sees it go, not at the
// 60 s output timeout; a stream already begun ends with an error event.
// Both ways an engine dies: its process ends (its lease is revoked), or
// it crashes (the lease runs out and its health check fails).
func TestDispatchEngineDies(t *testing.T) {
	f := startFleet(t, "--load_balance_policy=RR", "--instance_delete_probe_timeout_ms=100", "--instance_delete_probe_attempts=1")
	ctx := ctxFor(t)
	slow := func(c *enginesim.Config) { c.DecodePerToken = 20 * time.Second }
	for _, tc := range []struct {
		name string
		die  func(e *enginesim.Engine) error
	}{
		{"exits", func(e *enginesim.Engine) error { return e.Close() }},
		{"crashes", func(e *enginesim.Engine) error {
			e.SetHealthy(false)
			e.SetHeartbeatPaused(true)
			return e.LoseLease()
		}},
	} {
		for _, stream := range []bool{false, true} {
			e := f.engine(t, enginesim.TypeDefault, false, slow)
			body := `{"prompt":[1],"max_tokens":60000}`
			if stream {
				body = `{"prompt":[1],"max_tokens":60000,"stream":true}`
			}
			// An unstreamed answer comes only when the request ends: post
			// on a goroutine of its own, which never touches t (it may
			// outlive a failed test) and which the test waits for
			// however it ends.
			answered := postAsync(t, ctx, "http://"+f.addr+"/v1/completions", body)
			waitUntil(t, "the engine runs the request", 5*time.Second, func() bool { return e.Stats().Running == 1 })
			var resp *http.Response
			var br *bufio.Reader
			if stream {
				resp = answered.wait(t)
				br = bufio.NewReader(resp.Body)
				if _, err := br.ReadString('\n'); err != nil {
					t.Fatalf("%s: no first chunk: %v", tc.name, err)
				}
			}
			began := time.Now()
			if err := tc.die(e); err != nil {
				t.Fatal(err)
			}
			var last answer
			if stream {
				rest, _ := io.ReadAll(br)
				resp.Body.Close()
				events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
				if err := json.Unmarshal([]byte(strings.TrimPrefix(events[len(events)-1], "data: ")), &last); err != nil ||
					bytes.Contains(rest, []byte("[DONE]")) {
					t.Fatalf("%s: stream ended with %q", tc.name, rest)
				}
			} else {
				resp = answered.wait(t)
				last = whole(t, resp)
				if resp.StatusCode != http.StatusBadGateway {
					t.Errorf("%s: status %d", tc.name, resp.StatusCode)
				}
			}
			took := time.Since(began)
			if last.Error == nil || last.Error.Code != http.StatusBadGateway || last.Error.Message != "upstream engine failed" {
				t.Errorf("%s (stream %v): %+v", tc.name, stream, last.Error)
			}
			if resp.Header.Get("X-Prefill-Name") != e.Name() {
				t.Errorf("%s: routed to %s, not to %s", tc.name, resp.Header.Get("X-Prefill-Name"), e.Name())
			}
			if took > 10*time.Second {
				t.Errorf("%s (stream %v): the client waited %v", tc.name, stream, took)
			}
			t.Logf("%s (stream %v): error after %v", tc.name, stream, took.Round(10*time.Millisecond))
			f.waitNoneInFlight(t)
			e.Close()
		}
	}
}

// pending is a request posted on a goroutine of its own.
type pending struct {
	done chan struct{}
	resp *http.Response
	err  error
}

// postAsync posts body to url on a goroutine that ends when the answer's
// head arrives or the request is cancelled; the test's end cancels it
// and waits for it, so that it never outlives the test.
func postAsync(t *testing.T, ctx context.Context, url, body string) *pending {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	p := &pending{done: make(chan struct{})}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	go func() {
		defer close(p.done)
		p.resp, p.err = http.DefaultClient.Do(req)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
		if p.resp != nil {
			p.resp.Body.Close()
		}
	})
	return p
}

// wait returns the answer's head, failing the test when the request
// failed or nothing came within 30 s.
func (p *pending) wait(t *testing.T) *http.Response {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30s")
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.resp
}
