package xllmrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/lb"
	"github.com/kvcar/kvcar/internal/testlog"
)

// e2e is kvcar's RPC side as kvcar runs it: a real embedded etcd, the
// instance registry holding the master key with the rpc address, the
// XllmRpcService on a loopback port and a Dispatcher, behind a real HTTP
// server whose handler routes each request with CAR over the registry
// and dispatches it. Engines are enginesim in its xLLM mode: they
// register in etcd, heartbeat over baidu_std to the master key's
// address, take Completions over baidu_std and return Generations.
type e2e struct {
	*cluster
	logs     *testlog.Buffer
	disp     *Dispatcher
	http     *httptest.Server
	policy   lb.Policy
	lastPick chan lb.Decision
}

func startE2E(t testing.TB, outputTimeout time.Duration) *e2e {
	t.Helper()
	x := &e2e{cluster: startCluster(t, ""), lastPick: make(chan lb.Decision, 64), logs: &testlog.Buffer{}}
	var err error
	x.disp, err = NewDispatcher(DispatcherOptions{Self: x.rpcAddr, Outputs: x.outputs, Registry: x.reg,
		OutputTimeout: outputTimeout, Logger: slog.New(slog.NewTextHandler(x.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.disp.Close() })
	if x.policy, err = lb.New(lb.PolicyCAR, lb.Options{}); err != nil {
		t.Fatal(err)
	}
	x.http = httptest.NewServer(http.HandlerFunc(x.handle))
	t.Cleanup(x.http.Close)
	return x
}

// handle is the request path as the HTTP server will wire it: route with
// the policy over the registry, then Serve.
func (x *e2e) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeHTTPError(w, http.StatusBadRequest, err.Error())
		return
	}
	var ids struct {
		TokenIDs []uint32 `json:"kvcar_token_ids"`
	}
	_ = json.Unmarshal(body, &ids)
	dec, err := x.policy.Route(lb.Request{TokenIDs: ids.TokenIDs, PromptTokens: 8}, x.reg.Snapshot())
	if err != nil {
		writeHTTPError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	x.lastPick <- dec
	_ = x.disp.Serve(r.Context(), Request{Chat: r.URL.Path == "/v1/chat/completions", Body: body, TokenIDs: ids.TokenIDs,
		Prefill: dec.Prefill, Decode: dec.Decode}, w)
}

// engine starts an emulated xLLM engine of type typ registered in x's
// etcd and heartbeating to its master.
func (x *e2e) engine(t *testing.T, typ enginesim.InstanceType, mod func(*enginesim.Config)) *enginesim.Engine {
	t.Helper()
	cfg := enginesim.Config{HTTPAddr: "127.0.0.1:0", TimeScale: 0.001, DeviceBlocks: 64, BlockSize: 4,
		Etcd:      &enginesim.EtcdConfig{Endpoints: x.etcd.Endpoints(), Type: typ},
		Heartbeat: &enginesim.HeartbeatConfig{Interval: 50 * time.Millisecond}}
	if mod != nil {
		mod(&cfg)
	}
	e, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	// CAR routes only instances with a load report: wait for the
	// engine's baidu_std heartbeats to reach the registry.
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := x.reg.WaitFor(ctx, func(s *instance.Snapshot) bool {
		in, ok := s.Lookup(e.Name())
		return ok && in.LoadUsable() && in.LoadSource == instance.LoadHeartbeat
	}); err != nil {
		t.Fatalf("no heartbeat from %s over baidu_std: %v (engine saw status %d, master %q)", e.Name(), err,
			e.LastHeartbeatStatus(), e.HeartbeatMaster())
	}
	return e
}

func (x *e2e) post(t *testing.T, ctx context.Context, path string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.http.URL+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type openAIResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeWhole(t *testing.T, resp *http.Response) openAIResponse {
	t.Helper()
	defer resp.Body.Close()
	var r openAIResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// events reads an SSE body to its end.
func events(t *testing.T, resp *http.Response) (chunks []openAIResponse, done bool) {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		var c openAIResponse
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		chunks = append(chunks, c)
	}
	return chunks, done
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// R-CAR-2, R-CAR-10: an xLLM engine that heartbeats over baidu_std is
// routed by CAR, takes the request over baidu_std and its Generations
// become the client's answer, whole and streamed, for both endpoints.
func TestDispatchEndToEnd(t *testing.T) {
	x := startE2E(t, 0)
	e := x.engine(t, enginesim.TypeDefault, nil)
	ctx := ctxFor(t)

	resp := x.post(t, ctx, "/v1/completions", map[string]any{"model": "m", "prompt": []int{1, 2, 3, 4, 5, 6, 7, 8}, "max_tokens": 3})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	r := decodeWhole(t, resp)
	if dec := <-x.lastPick; dec.Prefill != e.Name() || dec.Policy != lb.PolicyCAR {
		t.Errorf("decision %+v", dec)
	}
	if r.Object != "text_completion" || r.Model != "m" || !strings.HasPrefix(r.ID, "cmpl-") || len(r.Choices) != 1 ||
		*r.Choices[0].Text != "tok1 tok2 tok3" || *r.Choices[0].FinishReason != "length" ||
		r.Usage == nil || r.Usage.PromptTokens != 8 || r.Usage.CompletionTokens != 3 || r.Usage.TotalTokens != 11 {
		t.Fatalf("completion %+v", r)
	}

	// Streamed chat with usage: role chunk, one content chunk per token,
	// the finish chunk, the usage chunk, [DONE].
	resp = x.post(t, ctx, "/v1/chat/completions", map[string]any{"model": "m", "stream": true, "max_tokens": 2,
		"stream_options": map[string]any{"include_usage": true}, "messages": []map[string]any{{"role": "user", "content": "hello"}}})
	<-x.lastPick
	chunks, done := events(t, resp)
	if !done || len(chunks) != 5 {
		t.Fatalf("%d chunks, done %v: %+v", len(chunks), done, chunks)
	}
	if c := chunks[0]; c.Object != "chat.completion.chunk" || c.Choices[0].Delta.Role != "assistant" || !strings.HasPrefix(c.ID, "chatcmpl-") {
		t.Errorf("first chunk %+v", c)
	}
	if *chunks[1].Choices[0].Delta.Content != "tok1" || *chunks[2].Choices[0].Delta.Content != " tok2" ||
		*chunks[3].Choices[0].FinishReason != "length" || chunks[4].Usage == nil || chunks[4].Usage.CompletionTokens != 2 ||
		len(chunks[4].Choices) != 0 {
		t.Errorf("chunks %+v", chunks)
	}

	// Streamed completion without usage.
	resp = x.post(t, ctx, "/v1/completions", map[string]any{"prompt": "a b c", "stream": true, "max_tokens": 2})
	<-x.lastPick
	chunks, done = events(t, resp)
	if !done || len(chunks) != 3 || *chunks[0].Choices[0].Text != "tok1" || *chunks[2].Choices[0].FinishReason != "length" {
		t.Fatalf("streamed completion: %v %+v", done, chunks)
	}
	waitOutputsEmpty(t, x)
	waitEngine(t, e, "three completed", func(st enginesim.EngineStats) bool { return st.Completed == 3 && st.Misrouted == 0 })
}

// waitEngine waits for the engine's counters: it counts a request once
// the service has taken its last generation.
func waitEngine(t *testing.T, e *enginesim.Engine, what string, ok func(enginesim.EngineStats) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for st := e.Stats(); !ok(st); st = e.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s: %+v", e.Name(), what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitOutputsEmpty(t *testing.T, x *e2e) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for x.outputs.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still waiting for output", x.outputs.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// PD: CAR picks a prefill and a decode instance; the request goes to the
// prefill instance with the decode name, and the output comes from the
// decode instance.
func TestDispatchPrefillDecode(t *testing.T) {
	x := startE2E(t, 0)
	p := x.engine(t, enginesim.TypePrefill, nil)
	d := x.engine(t, enginesim.TypeDecode, nil)
	ctx := ctxFor(t)
	resp := x.post(t, ctx, "/v1/completions", map[string]any{"prompt": []int{1, 2, 3, 4}, "max_tokens": 4, "stream": true})
	if dec := <-x.lastPick; dec.Prefill != p.Name() || dec.Decode != d.Name() {
		t.Fatalf("decision %+v", dec)
	}
	chunks, done := events(t, resp)
	var text string
	for _, c := range chunks {
		if c.Choices[0].Text != nil {
			text += *c.Choices[0].Text
		}
	}
	if !done || text != "tok1 tok2 tok3 tok4" {
		t.Fatalf("PD stream: %q, done %v", text, done)
	}
	resp = x.post(t, ctx, "/v1/chat/completions", map[string]any{"max_tokens": 3,
		"messages": []map[string]any{{"role": "user", "content": "hi there"}}})
	<-x.lastPick
	r := decodeWhole(t, resp)
	if r.Choices[0].Message == nil || r.Choices[0].Message.Content != "tok1 tok2 tok3" || r.Usage.CompletionTokens != 3 {
		t.Fatalf("PD whole chat: %+v", r)
	}
	waitEngine(t, p, "prefilled both", func(st enginesim.EngineStats) bool { return st.Requests == 2 && st.Completed == 0 })
	waitEngine(t, d, "decoded both", func(st enginesim.EngineStats) bool { return st.Decoded == 2 && st.Completed == 2 && st.Requests == 0 })
	waitOutputsEmpty(t, x)
}

// A client that goes away cancels its request: kvcar forgets it and the
// engine, told at its next Generations call, stops it and frees the slot.
func TestDispatchClientCancellation(t *testing.T) {
	x := startE2E(t, 0)
	e := x.engine(t, enginesim.TypeDefault, func(c *enginesim.Config) {
		c.BatchSlots, c.DecodePerToken = 1, 20*time.Second // 20 ms a token at TimeScale 0.001
	})
	ctx, cancel := context.WithCancel(context.Background())
	resp := x.post(t, ctx, "/v1/completions", map[string]any{"prompt": []int{1, 2, 3}, "max_tokens": 10000, "stream": true})
	<-x.lastPick
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("no first chunk: %v", err)
	}
	cancel()
	resp.Body.Close()
	waitOutputsEmpty(t, x)
	waitEngine(t, e, "request stopped", func(st enginesim.EngineStats) bool { return st.Cancelled == 1 && st.Running == 0 })
}

// Errors reach the client: the engine's gen_status as an HTTP error, an
// engine that never reports as a timeout, a body kvcar cannot send as
// 400; the client's texts name no engine, the log does; no request is
// left behind.
func TestDispatchErrors(t *testing.T) {
	x := startE2E(t, 300*time.Millisecond)
	e := x.engine(t, enginesim.TypeDefault, nil)
	ctx := ctxFor(t)

	e.SetFailRequests(http.StatusServiceUnavailable)
	r := decodeWhole(t, x.post(t, ctx, "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 2}))
	<-x.lastPick
	if r.Error == nil || r.Error.Code != http.StatusServiceUnavailable || r.Error.Message != "upstream engine failed (UNAVAILABLE)" {
		t.Errorf("engine failure: %+v", r.Error)
	}
	if l := x.logs.String(); !strings.Contains(l, "injected engine failure") || !strings.Contains(l, e.Name()) {
		t.Errorf("the log lacks the engine's failure: %s", l)
	}
	e.SetFailRequests(0)

	r = decodeWhole(t, x.post(t, ctx, "/v1/completions", map[string]any{"prompt": 12}))
	<-x.lastPick
	if r.Error == nil || r.Error.Code != http.StatusBadRequest || !strings.Contains(r.Error.Message, "prompt") {
		t.Errorf("bad prompt: %+v", r.Error)
	}

	// An engine that stays registered but reports nothing within the
	// output timeout: its decode takes an hour a token.
	slow := x.engine(t, enginesim.TypeDefault, func(c *enginesim.Config) { c.DecodePerToken = time.Hour })
	rec := httptest.NewRecorder()
	err := x.disp.Serve(ctx, Request{Body: []byte(`{"prompt":"a","max_tokens":2}`), Prefill: slow.Name()}, rec)
	if rec.Code != http.StatusGatewayTimeout || err == nil || !strings.Contains(rec.Body.String(), `"upstream engine timed out"`) ||
		strings.Contains(rec.Body.String(), slow.Name()) || !strings.Contains(err.Error(), "no output from instance "+slow.Name()+" for 300ms") {
		t.Fatalf("silent engine: %d %s (%v)", rec.Code, rec.Body.String(), err)
	}
	waitOutputsEmpty(t, x)
}

// An engine that dies with a request in flight: the registry sees its
// key go and the request ends with 502 at once, not at the output
// timeout; a stream already begun ends with an error event.
func TestDispatchDeadEngine(t *testing.T) {
	ctx := ctxFor(t)
	x2 := startE2E(t, time.Minute)
	dying := x2.engine(t, enginesim.TypeDefault, func(c *enginesim.Config) { c.DecodePerToken = 20 * time.Second })
	answer := x2.postAsync(ctx, "/v1/completions", map[string]any{"prompt": []int{1}, "max_tokens": 60000})
	<-x2.lastPick
	time.Sleep(100 * time.Millisecond)
	began := time.Now()
	if err := dying.Close(); err != nil {
		t.Fatal(err)
	}
	r := decodeWhole(t, answer.get(t))
	if r.Error == nil || r.Error.Code != http.StatusBadGateway || r.Error.Message != "upstream engine failed" {
		t.Errorf("dead engine: %+v", r.Error)
	}
	if l := x2.logs.String(); !strings.Contains(l, "engine request failed") || !strings.Contains(l, "instance "+dying.Name()) {
		t.Errorf("the log does not say the engine left: %s", l)
	}
	if el := time.Since(began); el > 10*time.Second {
		t.Errorf("dead engine noticed after %v", el)
	}
	waitOutputsEmpty(t, x2)

	// Once a stream has begun, an error ends it with an error event and
	// no [DONE].
	dying = x2.engine(t, enginesim.TypeDefault, func(c *enginesim.Config) { c.DecodePerToken = 20 * time.Second })
	resp := x2.post(t, ctx, "/v1/completions", map[string]any{"prompt": []int{1}, "max_tokens": 60000, "stream": true})
	<-x2.lastPick
	go func() {
		time.Sleep(100 * time.Millisecond)
		dying.Close()
	}()
	chunks, done := events(t, resp)
	last := chunks[len(chunks)-1]
	if done || len(chunks) < 2 || last.Error == nil || last.Error.Code != http.StatusBadGateway || chunks[0].Choices[0].Text == nil {
		t.Errorf("stream cut by a dead engine: done %v, %d chunks, last %+v", done, len(chunks), last)
	}
	waitOutputsEmpty(t, x2)
}

type pendingResponse chan struct {
	resp *http.Response
	err  error
}

// postAsync posts on a goroutine of its own: an unstreamed answer comes
// only when the request ends.
func (x *e2e) postAsync(ctx context.Context, path string, body any) pendingResponse {
	ch := make(pendingResponse, 1)
	b, _ := json.Marshal(body)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.http.URL+path, bytes.NewReader(b))
		var resp *http.Response
		if err == nil {
			resp, err = http.DefaultClient.Do(req)
		}
		ch <- struct {
			resp *http.Response
			err  error
		}{resp, err}
	}()
	return ch
}

func (p pendingResponse) get(t *testing.T) *http.Response {
	t.Helper()
	r := <-p
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.resp
}
