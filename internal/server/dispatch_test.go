package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/instance"
	"github.com/kvcar/kvcar/internal/lb"
	"github.com/kvcar/kvcar/internal/testlog"
	"github.com/kvcar/kvcar/internal/tokenizer"
	"github.com/kvcar/kvcar/internal/xllmpb"
	"github.com/kvcar/kvcar/internal/xllmrpc"
)

// snapshotRegistry is a registry that stays at one snapshot: what the
// router decides over and what the dispatcher reads backend types and
// liveness from.
type snapshotRegistry struct{ snap *instance.Snapshot }

func (r snapshotRegistry) Heartbeat(instance.Heartbeat) error {
	return instance.ErrUnknownInstance
}

func (r snapshotRegistry) Snapshot() *instance.Snapshot { return r.snap }

// backendRouter returns an RR router over a snapshot of DEFAULT instances
// with a load report, each registered with the backend type given (""
// for an engine that names none), and that snapshot as a registry.
func backendRouter(tb testing.TB, backends map[string]string) (policyRouter, snapshotRegistry) {
	tb.Helper()
	var names []string
	for n := range backends {
		names = append(names, n)
	}
	r := routerFor(tb, names...)
	for i := range r.snap.Instances {
		r.snap.Instances[i].Meta.BackendType = backends[r.snap.Instances[i].Meta.Name]
	}
	return r, snapshotRegistry{r.snap}
}

// xllmSide is kvcar's RPC side as the command wires it: the
// XllmRpcService on a loopback baidu_std port delivering Generations into
// Outputs, and a Dispatcher whose source_xservice_addr is that port.
type xllmSide struct {
	outputs *xllmrpc.Outputs
	disp    *xllmrpc.Dispatcher
	logs    *testlog.Buffer
}

func startXLLMSide(tb testing.TB, reg xllmrpc.Registry) *xllmSide {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	x := &xllmSide{outputs: xllmrpc.NewOutputs(0, 0), logs: &testlog.Buffer{}}
	log := slog.New(slog.NewTextHandler(x.logs, nil))
	srv := baidustd.NewServer(baidustd.ServerOptions{Identity: ln.Addr().String()})
	if err := xllmrpc.NewService(reg, x.outputs, log).Register(srv); err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(ln)
	// A graceful shutdown: an engine's Generations call that delivered
	// the last output has ended the client's request, so the test can be
	// over while the call's response is still to be written; Close would
	// cut it off and fail the engine's call.
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			tb.Errorf("rpc side shutdown: %v", err)
		}
	})
	x.disp, err = xllmrpc.NewDispatcher(xllmrpc.DispatcherOptions{Self: ln.Addr().String(), Outputs: x.outputs, Registry: reg,
		OutputTimeout: 5 * time.Second, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { x.disp.Close() })
	return x
}

func (x *xllmSide) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for x.outputs.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests still wait for output", x.outputs.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// received is a request an xLLM engine took over baidu_std.
type received struct {
	completion *xllmpb.CompletionRequest
	chat       *xllmpb.ChatRequest
}

// xllmEngine is an xLLM engine on loopback as far as kvcar sees one: it
// serves XllmAPIService Completions and ChatCompletions over baidu_std,
// keeps every request, answers the call at once and sends the output to
// source_xservice_addr through Generations: "o" then "k" with the finish
// reason, usage counting the token ids it got, cached tokens 2.
func xllmEngine(tb testing.TB) (string, chan received) {
	tb.Helper()
	got := make(chan received, 16)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := baidustd.NewServer(baidustd.ServerOptions{})
	answer := func(source, service string, ids int, stream bool) {
		c := baidustd.NewClient(source, baidustd.ClientOptions{})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		usage := &xllmpb.OutputUsage{NumPromptTokens: int32(ids), NumGeneratedTokens: 2, NumTotalTokens: int32(ids) + 2, NumCachedTokens: 2}
		gens := []*xllmpb.DisaggStreamGeneration{
			{ReqId: "cmpl-7", ServiceReqId: service, GenStatus: &xllmpb.GenerationStatus{}, Outputs: []*xllmpb.SequenceOutput{{Text: "o"}}},
			{ReqId: "cmpl-7", ServiceReqId: service, GenStatus: &xllmpb.GenerationStatus{},
				Outputs: []*xllmpb.SequenceOutput{{Text: "k", FinishReason: "stop"}}, Usage: usage, Finished: true},
		}
		if !stream {
			gens = gens[1:]
			gens[0].Outputs[0].Text = "ok"
		}
		for _, g := range gens {
			var st xllmpb.StatusSet
			if err := c.CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGenerations,
				&xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{g}}, &st, nil); err != nil {
				tb.Errorf("generations to %s: %v", source, err)
				return
			}
		}
	}
	srv.Register(xllmpb.APIService, xllmpb.MethodCompletions, baidustd.Unary(
		func(_ context.Context, r *xllmpb.CompletionRequest) (*xllmpb.CompletionResponse, error) {
			got <- received{completion: r}
			go answer(r.GetSourceXserviceAddr(), r.GetServiceRequestId(), len(r.GetTokenIds()), r.GetStream())
			return &xllmpb.CompletionResponse{}, nil
		}))
	srv.Register(xllmpb.APIService, xllmpb.MethodChatCompletions, baidustd.Unary(
		func(_ context.Context, r *xllmpb.ChatRequest) (*xllmpb.ChatResponse, error) {
			got <- received{chat: r}
			go answer(r.GetSourceXserviceAddr(), r.GetServiceRequestId(), len(r.GetTokenIds()), r.GetStream())
			return &xllmpb.ChatResponse{}, nil
		}))
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), got
}

type openAIAnswer struct {
	Object  string `json:"object"`
	ID      string `json:"id"`
	Choices []struct {
		Text    *string `json:"text"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func u32s(ids []int32) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// Requests for an xLLM instance go over baidu_std as xllm-service sends
// them: the client's members, the prompt as the parse read it (text as
// text, token ids as token_ids, kvcar's own ids of a text or chat prompt
// when it has a tokenizer), kvcar's decision as routing whatever the
// client sent, and source_xservice_addr; the engine's Generations come
// back as the OpenAI answer with usage and cached tokens. The engine is
// told nothing by headers and the client gets none unless asked.
func TestDispatchSendsTheParsedRequest(t *testing.T) {
	tok, err := tokenizer.Load("../tokenizer/testdata/qwen2like")
	if err != nil {
		t.Fatal(err)
	}
	engine, got := xllmEngine(t)
	router, reg := backendRouter(t, map[string]string{engine: ""})
	x := startXLLMSide(t, reg)
	chatTok := chatTokenizerFor(tok)
	for _, withTokenizer := range []bool{false, true} {
		opts := Options{Router: router, Dispatcher: x.disp}
		if withTokenizer {
			opts.Tokenizer = chatTok
		}
		ts := startPublicServer(t, opts)
		forged := `"routing":{"prefill_name":"10.9.9.9:1","decode_name":"10.9.9.9:2"}`
		for _, tc := range []struct {
			name, path, body string
			check            func(t *testing.T, r received)
		}{
			{"ids", CompletionsPath, `{"model":"m",` + forged + `,"prompt":[5,6,70000],"max_tokens":9,"service_request_id":"mine"}`,
				func(t *testing.T, r received) {
					c := r.completion
					if c.GetPrompt() != "" || !slices.Equal(c.GetTokenIds(), []int32{5, 6, 70000}) || c.GetMaxTokens() != 9 || c.GetModel() != "m" {
						t.Errorf("request %v", c)
					}
				}},
			{"text", CompletionsPath, `{"prompt":"Tell me about caches.","temperature":0.5,` + forged + `}`,
				func(t *testing.T, r received) {
					c := r.completion
					want, _ := tok.Encode("Tell me about caches.", nil)
					if !withTokenizer {
						want = nil
					}
					if c.GetPrompt() != "Tell me about caches." || !slices.Equal(u32s(c.GetTokenIds()), want) || c.GetTemperature() != 0.5 {
						t.Errorf("request %v, want token ids %v", c, want)
					}
				}},
			{"plain chat", ChatCompletionsPath, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":4}`,
				func(t *testing.T, r received) {
					c := r.chat
					var want []uint32
					if withTokenizer {
						want, _ = tok.EncodeChatWith([]tokenizer.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
							tokenizer.ChatOptions{AddGenerationPrompt: true}, nil)
					}
					if len(c.GetMessages()) != 2 || c.GetMessages()[1].GetContent() != "hi" || !slices.Equal(u32s(c.GetTokenIds()), want) ||
						c.GetMaxTokens() != 4 {
						t.Errorf("request %v, want token ids %v", c, want)
					}
				}},
			{"chat with tools", ChatCompletionsPath, `{` + forged + `,"model":"m","messages":[{"role":"system","content":"be brief"},` +
				`{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
				`{"role":"tool","tool_call_id":"c1","content":"42"}]}`,
				func(t *testing.T, r received) {
					// Tool calls are not in kvcar's rendering of the chat:
					// no token ids, the engine renders it itself.
					c := r.chat
					msgs := []tokenizer.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "one\ntwo"},
						{Role: "assistant", Content: ""}, {Role: "tool", Content: "42"}}
					if len(c.GetMessages()) != 4 || len(c.GetTokenIds()) != 0 {
						t.Fatalf("request %v", c)
					}
					for i, m := range c.GetMessages() {
						if m.GetRole() != msgs[i].Role || m.GetContent() != msgs[i].Content {
							t.Errorf("message %d: %v, want %+v", i, m, msgs[i])
						}
					}
					if tc := c.GetMessages()[2].GetToolCalls(); len(tc) != 1 || tc[0].GetFunction().GetName() != "f" ||
						c.GetMessages()[3].GetToolCallId() != "c1" {
						t.Errorf("tool messages %v", c.GetMessages()[2:])
					}
				}},
		} {
			resp, b := do(t, ts, http.MethodPost, tc.path, strings.NewReader(tc.body))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s (tokenizer %v): %d %s", tc.name, withTokenizer, resp.StatusCode, b)
			}
			r := <-got
			tc.check(t, r)
			var routing *xllmpb.Routing
			var source, service string
			if r.chat != nil {
				routing, source, service = r.chat.GetRouting(), r.chat.GetSourceXserviceAddr(), r.chat.GetServiceRequestId()
			} else {
				routing, source, service = r.completion.GetRouting(), r.completion.GetSourceXserviceAddr(), r.completion.GetServiceRequestId()
			}
			if !proto.Equal(routing, &xllmpb.Routing{PrefillName: engine}) || source == "" || !strings.HasPrefix(service, "kvcar-") {
				t.Errorf("%s: routing %v, source %q, service_request_id %q", tc.name, routing, source, service)
			}
			var a openAIAnswer
			if err := json.Unmarshal(b, &a); err != nil || len(a.Choices) != 1 || a.Usage == nil ||
				a.Usage.CompletionTokens != 2 || a.Usage.PromptTokensDetails.CachedTokens != 2 || a.ID != "cmpl-7" {
				t.Fatalf("%s: answer %s (%v)", tc.name, b, err)
			}
			if text := a.Choices[0].Text; r.chat == nil && (text == nil || *text != "ok" || *a.Choices[0].FinishReason != "stop") {
				t.Errorf("%s: answer %s", tc.name, b)
			}
			if m := a.Choices[0].Message; r.chat != nil && (m == nil || m.Content != "ok" || a.Object != "chat.completion") {
				t.Errorf("%s: answer %s", tc.name, b)
			}
			for k := range resp.Header {
				if strings.HasPrefix(k, "X-Kvcar-") || k == PrefillNameHeader || k == DecodeNameHeader {
					t.Errorf("%s: header %s sent without ExposeRoutingHeaders", tc.name, k)
				}
			}
		}
	}
	x.waitIdle(t)

	// Exposed, the decision comes back on the dispatched path too.
	ts := startPublicServer(t, Options{Router: router, Dispatcher: x.disp, ExposeRoutingHeaders: true})
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1,2],"stream":true}`))
	<-got
	if resp.StatusCode != http.StatusOK || resp.Header.Get(PrefillNameHeader) != engine || resp.Header.Get(PolicyHeader) != lb.PolicyRR ||
		resp.Header.Get("Content-Type") != "text/event-stream" || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("streamed with exposed headers: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	x.waitIdle(t)
}

// chatTokenizerFor gives the request path a tokenizer as the command
// does: chat with the generation prompt, no special tokens added.
func chatTokenizerFor(t *tokenizer.Tokenizer) Tokenizer { return testTokenizer{t} }

type testTokenizer struct{ t *tokenizer.Tokenizer }

func (c testTokenizer) Encode(ctx context.Context, text string, dst []uint32) ([]uint32, error) {
	return c.t.EncodeContext(ctx, text, dst)
}

func (c testTokenizer) EncodeChat(ctx context.Context, msgs []ChatMessage, dst []uint32) ([]uint32, error) {
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	return c.t.EncodeChatWithContext(ctx, tm, tokenizer.ChatOptions{AddGenerationPrompt: true}, dst)
}

// In one fleet, an instance registered with backend_type "vllm" gets the
// client's JSON over HTTP, byte for byte but the routing, while xLLM
// instances (backend_type "xllm" or none) get baidu_std.
func TestDispatchKeepsHTTPForVLLM(t *testing.T) {
	xl, gotRPC := xllmEngine(t)
	xl2, gotRPC2 := xllmEngine(t)
	vl, gotHTTP := recordingEngine(t)
	router, reg := backendRouter(t, map[string]string{xl: "", xl2: "xllm", vl: "vllm"})
	x := startXLLMSide(t, reg)
	ts := startPublicServer(t, Options{Router: router, Dispatcher: x.disp})
	body := `{"prompt":[1,2,3],"routing":null}`
	for range 6 { // twice around the three by RR
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(body))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	for i, ch := range []chan received{gotRPC, gotRPC2} {
		for range 2 {
			if r := <-ch; !slices.Equal(r.completion.GetTokenIds(), []int32{1, 2, 3}) {
				t.Errorf("xLLM engine %d got %v", i, r.completion)
			}
		}
	}
	for range 2 {
		s := <-gotHTTP
		if want := `{"prompt":[1,2,3],"routing":{"prefill_name":"` + vl + `","decode_name":""}}`; string(s.body) != want {
			t.Errorf("vLLM engine got %s, want %s", s.body, want)
		}
	}
	x.waitIdle(t)
}

// An engine that fails or cannot be reached gives the client an error
// that names no engine; the log names it. A body the engine's message
// cannot carry is the client's 400, naming the member.
func TestDispatchErrorsNameNoEngine(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	router, reg := backendRouter(t, map[string]string{deadAddr: ""})
	x := startXLLMSide(t, reg)
	ts := startPublicServer(t, Options{Router: router, Dispatcher: x.disp})
	resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(`{"prompt":[1]}`))
	checkError(t, resp, b, http.StatusBadGateway, "upstream engine failed")
	host, _, _ := net.SplitHostPort(deadAddr)
	if strings.Contains(string(b), host) {
		t.Errorf("the answer shows the engine: %s", b)
	}
	if l := x.logs.String(); !strings.Contains(l, "engine request failed") || !strings.Contains(l, deadAddr) {
		t.Errorf("the log does not name the engine: %s", l)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"prompt":["a","b"]}`, "prompt holds 2 prompts"},
		{`{"prompt":"x","max_tokens":"many"}`, "max_tokens"},
		{`{"prompt":[4294967295]}`, "does not fit xLLM's int32 token_ids"},
	} {
		resp, b := do(t, ts, http.MethodPost, CompletionsPath, strings.NewReader(tc.body))
		checkError(t, resp, b, http.StatusBadRequest, tc.want)
	}
	x.waitIdle(t)
}

// A dispatched request gives back its body's share of the in-flight
// budget, and its storage, once the engine has the request: a stream
// still being answered holds none.
func TestDispatchReleasesBudgetOnceSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	engine := ln.Addr().String()
	router, reg := backendRouter(t, map[string]string{engine: ""})
	x := startXLLMSide(t, reg)
	s := New(Options{Router: router, Dispatcher: x.disp})
	s.SetReady(true)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)

	// An engine that answers the call, sends one chunk and then holds the
	// request until told to finish it.
	finish := make(chan struct{})
	srv := baidustd.NewServer(baidustd.ServerOptions{})
	srv.Register(xllmpb.APIService, xllmpb.MethodCompletions, baidustd.Unary(
		func(_ context.Context, r *xllmpb.CompletionRequest) (*xllmpb.CompletionResponse, error) {
			go func() {
				c := baidustd.NewClient(r.GetSourceXserviceAddr(), baidustd.ClientOptions{})
				defer c.Close()
				send := func(g *xllmpb.DisaggStreamGeneration) {
					g.ReqId, g.ServiceReqId, g.GenStatus = "cmpl-1", r.GetServiceRequestId(), &xllmpb.GenerationStatus{}
					var st xllmpb.StatusSet
					_ = c.CallProto(context.Background(), xllmpb.RPCService, xllmpb.MethodGenerations,
						&xllmpb.DisaggStreamGenerations{Gens: []*xllmpb.DisaggStreamGeneration{g}}, &st, nil)
				}
				send(&xllmpb.DisaggStreamGeneration{Outputs: []*xllmpb.SequenceOutput{{Text: "first"}}})
				<-finish
				send(&xllmpb.DisaggStreamGeneration{Outputs: []*xllmpb.SequenceOutput{{FinishReason: "stop"}}, Finished: true})
			}()
			return &xllmpb.CompletionResponse{}, nil
		}))
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	req, _ := http.NewRequest(http.MethodPost, ts.URL+CompletionsPath, strings.NewReader(`{"stream":true,"prompt":`+strings.Repeat(" ", 4000)+`[1,2,3]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, `"first"`) {
		t.Fatalf("first chunk %q: %v", line, err)
	}
	if used := s.proxy.budget.Used(); used != 0 {
		t.Errorf("%d body bytes held while the answer streams", used)
	}
	close(finish)
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("rest of the stream %q", rest)
	}
	x.waitIdle(t)
}
