package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// outputSink is a real baidu_std server in the role of the service that
// receives an engine's Generations: it records every generation with the
// connection it came on, and refuses those of the request ids in refuse.
type outputSink struct {
	srv   *baidustd.Server
	addr  string
	mu    sync.Mutex
	got   []sunk
	calls []int // generations in each call, in order
	stop  map[string]bool
}

type sunk struct {
	gen  *xllmpb.DisaggStreamGeneration
	conn string
}

func startSink(t *testing.T) *outputSink {
	t.Helper()
	s := &outputSink{srv: baidustd.NewServer(baidustd.ServerOptions{}), stop: map[string]bool{}}
	must(t, s.srv.Register(xllmpb.RPCService, xllmpb.MethodGenerations, func(_ context.Context, r *baidustd.Request) (baidustd.Response, error) {
		var req xllmpb.DisaggStreamGenerations
		if err := proto.Unmarshal(r.Message, &req); err != nil {
			return baidustd.Response{}, err
		}
		set := &xllmpb.StatusSet{}
		s.mu.Lock()
		s.calls = append(s.calls, len(req.Gens))
		for _, g := range req.Gens {
			s.got = append(s.got, sunk{gen: g, conn: r.RemoteAddr.String()})
			set.AllStatus = append(set.AllStatus, &xllmpb.Status{Ok: !s.stop[g.ServiceReqId]})
		}
		s.mu.Unlock()
		b, _ := proto.Marshal(set)
		return baidustd.Response{Message: b}, nil
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	s.addr = ln.Addr().String()
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
	return s
}

// callSizes returns how many generations each call carried.
func (s *outputSink) callSizes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *outputSink) refuse(id string) {
	s.mu.Lock()
	s.stop[id] = true
	s.mu.Unlock()
}

// wait returns the generations of service request id once pred holds
// for them.
func (s *outputSink) wait(t *testing.T, id string, what string, pred func([]sunk) bool) []sunk {
	t.Helper()
	var out []sunk
	waitFor(t, reqTimeout, what, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		out = out[:0]
		for _, g := range s.got {
			if g.gen.ServiceReqId == id {
				out = append(out, g)
			}
		}
		return pred(out)
	})
	return out
}

func finished(gs []sunk) bool { return len(gs) > 0 && gs[len(gs)-1].gen.Finished }

func rpcClient(t *testing.T, addr string) *baidustd.Client {
	c := baidustd.NewClient(addr, baidustd.ClientOptions{})
	t.Cleanup(func() { c.Close() })
	return c
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	t.Cleanup(cancel)
	return ctx
}

func complete(t *testing.T, c *baidustd.Client, req *xllmpb.CompletionRequest) {
	t.Helper()
	var resp xllmpb.CompletionResponse
	must(t, c.CallProto(rpcCtx(t), xllmpb.APIService, xllmpb.MethodCompletions, req, &resp, nil))
	if proto.Size(&resp) != 0 {
		t.Fatalf("Completions answered %v, want an empty response", &resp)
	}
}

func ids(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i + 1)
	}
	return out
}

// An xLLM engine answers Completions at once and streams the output to
// source_xservice_addr through Generations: one per token, the last with
// the finish reason, usage and finished. HTTP keeps working on the same
// port.
func TestRPCCompletionsStreamGenerations(t *testing.T) {
	e := inferEngine(t, nil)
	sink := startSink(t)
	c := rpcClient(t, e.HTTPAddr())
	complete(t, c, &xllmpb.CompletionRequest{Model: "m", ServiceRequestId: ptr("s1"), TokenIds: ids(2 * testBS),
		MaxTokens: ptr(uint32(3)), Stream: ptr(true), SourceXserviceAddr: &sink.addr,
		Routing: &xllmpb.Routing{PrefillName: e.Name()}})
	gs := sink.wait(t, "s1", "three streamed generations", finished)
	firstID := gs[0].gen.ReqId
	if len(gs) != 3 {
		t.Fatalf("%d generations, want 3", len(gs))
	}
	for i, g := range gs {
		o := g.gen.Outputs
		if !strings.HasPrefix(g.gen.ReqId, "cmpl-") || g.gen.GenStatus == nil || g.gen.GenStatus.StatusCode != 0 || len(o) != 1 ||
			o[0].Text != fillerToken(i+1) || len(o[0].TokenIds) != 1 || g.gen.FinishedOnPrefillInstance {
			t.Errorf("generation %d: %v", i, g.gen)
		}
		if last := i == 2; g.gen.Finished != last || (o[0].FinishReason == "length") != last || (g.gen.Usage != nil) != last {
			t.Errorf("generation %d: finished %v finish %q usage %v", i, g.gen.Finished, o[0].FinishReason, g.gen.Usage)
		}
	}
	if u := gs[2].gen.Usage; u.NumPromptTokens != 2*testBS || u.NumGeneratedTokens != 3 || u.NumTotalTokens != 2*testBS+3 {
		t.Errorf("usage %v", u)
	}
	// The same prompt again hits the engine's own cache.
	complete(t, c, &xllmpb.CompletionRequest{ServiceRequestId: ptr("s2"), TokenIds: ids(2 * testBS), MaxTokens: ptr(uint32(1)),
		SourceXserviceAddr: &sink.addr})
	gs = sink.wait(t, "s2", "second request", finished)
	if got := gs[0].gen.Usage.NumCachedTokens; got != 2*testBS {
		t.Errorf("cached tokens %d, want %d", got, 2*testBS)
	}
	// What the engine did for each is kept by the id its output carried,
	// which is unique to the engine.
	first, ok1 := e.Served(firstID)
	second, ok2 := e.Served(gs[0].gen.ReqId)
	if !ok1 || !ok2 || first.Instance != e.Name() || first.PrefillName != e.Name() || first.DeviceHitTokens != 0 ||
		second.DeviceHitTokens+second.HostHitTokens != 2*testBS || second.PrefillName != "" {
		t.Errorf("served records %+v (%v), %+v (%v)", first, ok1, second, ok2)
	}
	if _, ok := e.Served("cmpl-1"); ok || !strings.Contains(gs[0].gen.ReqId, "-") {
		t.Errorf("request id %q does not name the engine", gs[0].gen.ReqId)
	}
	// The engine counts a request once the service has taken its last
	// generation.
	waitStats(t, e, "two requests completed", func(st EngineStats) bool {
		return st.Requests == 2 && st.Completed == 2 && st.CompletionTokens == 4 && st.Running == 0
	})
	resp, err := http.Get("http://" + e.HTTPAddr() + "/health")
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health on the shared port: %d", resp.StatusCode)
	}
}

// Unstreamed, the whole output comes in one generation; a chat request
// without token ids is tokenized by the engine.
func TestRPCUnstreamedAndChat(t *testing.T) {
	e := inferEngine(t, nil)
	sink := startSink(t)
	c := rpcClient(t, e.HTTPAddr())
	complete(t, c, &xllmpb.CompletionRequest{ServiceRequestId: ptr("whole"), Prompt: "hello there world", MaxTokens: ptr(uint32(4)),
		SourceXserviceAddr: &sink.addr})
	gs := sink.wait(t, "whole", "one generation", finished)
	if len(gs) != 1 || gs[0].gen.Outputs[0].Text != fillerText(4) || len(gs[0].gen.Outputs[0].TokenIds) != 4 ||
		gs[0].gen.Outputs[0].FinishReason != "length" || gs[0].gen.Usage.NumPromptTokens != int32(len(ToyTokenize("hello there world"))) {
		t.Fatalf("unstreamed: %v", gs)
	}

	var resp xllmpb.ChatResponse
	msgs := []*xllmpb.ChatMessage{{Role: ptr("user"), Content: ptr("hi")}}
	must(t, c.CallProto(rpcCtx(t), xllmpb.APIService, xllmpb.MethodChatCompletions, &xllmpb.ChatRequest{
		ServiceRequestId: ptr("chat"), Messages: msgs, MaxTokens: ptr(uint32(2)), Stream: ptr(true), SourceXserviceAddr: &sink.addr}, &resp, nil))
	gs = sink.wait(t, "chat", "chat generations", finished)
	want := len(ChatTokenIDs([]ChatMessage{{Role: "user", Content: "hi"}}))
	if len(gs) != 2 || !strings.HasPrefix(gs[0].gen.ReqId, "chatcmpl-") || gs[1].gen.Usage.NumPromptTokens != int32(want) {
		t.Fatalf("chat: %v", gs)
	}
}

// PD: the prefill instance sends the first token, marked
// finished_on_prefill_instance, and hands the request to the decode
// instance, whose generations carry the rest.
func TestRPCPrefillDecodeHandOff(t *testing.T) {
	p, d := inferEngine(t, nil), inferEngine(t, nil)
	sink := startSink(t)
	c := rpcClient(t, p.HTTPAddr())
	routing := &xllmpb.Routing{PrefillName: p.Name(), DecodeName: d.Name()}
	complete(t, c, &xllmpb.CompletionRequest{ServiceRequestId: ptr("pd"), TokenIds: ids(testBS), MaxTokens: ptr(uint32(4)),
		Stream: ptr(true), SourceXserviceAddr: &sink.addr, Routing: routing})
	gs := sink.wait(t, "pd", "PD stream", finished)
	if len(gs) != 4 || !gs[0].gen.FinishedOnPrefillInstance || gs[1].gen.FinishedOnPrefillInstance {
		t.Fatalf("PD stream: %v", gs)
	}
	if gs[0].conn == gs[1].conn || gs[1].conn != gs[3].conn {
		t.Errorf("first token from %s, the rest from %s..%s: want the prefill, then the decode instance", gs[0].conn, gs[1].conn, gs[3].conn)
	}
	for i, g := range gs {
		if g.gen.Outputs[0].Text != fillerToken(i+1) || g.gen.ReqId != gs[0].gen.ReqId {
			t.Errorf("token %d: %v", i+1, g.gen)
		}
	}
	complete(t, c, &xllmpb.CompletionRequest{ServiceRequestId: ptr("pd-whole"), TokenIds: ids(testBS), MaxTokens: ptr(uint32(3)),
		SourceXserviceAddr: &sink.addr, Routing: routing})
	gs = sink.wait(t, "pd-whole", "PD unstreamed", finished)
	if len(gs) != 2 || !gs[0].gen.FinishedOnPrefillInstance || gs[1].gen.Outputs[0].Text != fillerText(3) {
		t.Fatalf("PD unstreamed: %v", gs)
	}
	waitStats(t, d, "decode side done", func(st EngineStats) bool { return st.Decoded == 2 && st.Completed == 2 })
	if st := p.Stats(); st.Requests != 2 || st.Completed != 0 || st.Misrouted != 0 {
		t.Errorf("prefill stats %+v", st)
	}
	if st := d.Stats(); st.Requests != 0 {
		t.Errorf("decode instance prefilled: %+v", st)
	}
}

// A service that refuses a request's output (its client went away) makes
// the engine stop it and free its slot.
func TestRPCRefusedOutputCancels(t *testing.T) {
	e := inferEngine(t, func(c *Config) { c.BatchSlots = 1 })
	sink := startSink(t)
	sink.refuse("gone")
	c := rpcClient(t, e.HTTPAddr())
	complete(t, c, &xllmpb.CompletionRequest{ServiceRequestId: ptr("gone"), TokenIds: ids(4), MaxTokens: ptr(uint32(1000)),
		Stream: ptr(true), SourceXserviceAddr: &sink.addr})
	waitStats(t, e, "request cancelled", func(st EngineStats) bool { return st.Cancelled == 1 && st.Running == 0 })
	if gs := sink.wait(t, "gone", "refused generation", func(gs []sunk) bool { return len(gs) > 0 }); len(gs) != 1 {
		t.Errorf("%d generations sent after the refusal", len(gs))
	}
}

// Errors go back as an engine sends them: a generation with only the
// service_req_id and the status.
func TestRPCErrorGenerations(t *testing.T) {
	e := inferEngine(t, func(c *Config) { c.BatchSlots, c.MaxQueue, c.DecodePerToken = 1, 1, longStep })
	sink := startSink(t)
	c := rpcClient(t, e.HTTPAddr())
	req := func(id string) *xllmpb.CompletionRequest {
		return &xllmpb.CompletionRequest{ServiceRequestId: ptr(id), TokenIds: ids(4), MaxTokens: ptr(uint32(100)), SourceXserviceAddr: &sink.addr}
	}
	statusOf := func(id string) *xllmpb.GenerationStatus {
		gs := sink.wait(t, id, id+" error", func(gs []sunk) bool { return len(gs) > 0 })
		g := gs[0].gen
		if g.ReqId != "" || len(g.Outputs) != 0 || g.Usage != nil || g.Finished {
			t.Errorf("%s: error generation carries more than its status: %v", id, g)
		}
		return g.GenStatus
	}
	complete(t, c, req("running"))
	waitStats(t, e, "one running", func(st EngineStats) bool { return st.Running == 1 })
	complete(t, c, req("queued"))
	waitStats(t, e, "one queued", func(st EngineStats) bool { return st.Waiting == 1 })
	complete(t, c, req("over"))
	if st := statusOf("over"); st.StatusCode != statusResourceExhausted || st.StatusMsg != "The number of concurrent requests has reached the limit." {
		t.Errorf("overload: %v", st)
	}
	e.SetFailRequests(http.StatusServiceUnavailable)
	complete(t, c, req("failed"))
	if st := statusOf("failed"); st.StatusCode != statusUnavailable {
		t.Errorf("injected failure: %v", st)
	}
	e.SetFailRequests(0)
	complete(t, c, &xllmpb.CompletionRequest{ServiceRequestId: ptr("empty"), SourceXserviceAddr: &sink.addr})
	if st := statusOf("empty"); st.StatusCode != statusInvalidArgument {
		t.Errorf("empty prompt: %v", st)
	}
	// Without a service_request_id nothing could carry the output back:
	// refused on the call.
	err := c.CallProto(rpcCtx(t), xllmpb.APIService, xllmpb.MethodCompletions, &xllmpb.CompletionRequest{TokenIds: ids(4)},
		&xllmpb.CompletionResponse{}, nil)
	if baidustd.CodeOf(err) != baidustd.EREQUEST {
		t.Errorf("no service_request_id: %v", err)
	}
	// Close cuts the requests in flight off, as a dying engine does.
	must(t, e.Close())
	if st := e.Stats(); st.Aborted != 2 {
		t.Errorf("aborted %d, want 2 (running and queued)", st.Aborted)
	}
}

// The engine answers the recorded Completions call, from either brpc
// version, with the recorded empty response.
func TestRPCRecordedCompletions(t *testing.T) {
	e := inferEngine(t, nil)
	for _, v := range []string{"brpc-1.12.1", "brpc-1.17.0"} {
		dir := filepath.Join("..", "baidustd", "testdata", v)
		req, err := os.ReadFile(filepath.Join(dir, "completions.req.bin"))
		must(t, err)
		want, err := os.ReadFile(filepath.Join(dir, "completions.resp.bin"))
		must(t, err)
		conn, err := net.Dial("tcp", e.HTTPAddr())
		must(t, err)
		conn.SetDeadline(time.Now().Add(reqTimeout))
		_, err = conn.Write(req)
		must(t, err)
		got := make([]byte, len(want))
		_, err = io.ReadFull(bufio.NewReader(conn), got)
		conn.Close()
		must(t, err)
		if !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", v, got, want)
		}
	}
}

// As an xLLM engine sends each decode step's outputs in one Generations
// call, the generations of requests streamed at the same time share
// calls: while one call is out, the others' tokens wait for the next.
// Every request still gets each of its tokens once, in order, and a
// request the service refuses stops without holding up the others.
func TestRPCGenerationsShareCalls(t *testing.T) {
	e := inferEngine(t, nil)
	sink := startSink(t)
	c := rpcClient(t, e.HTTPAddr())
	const requests, tokens = 16, 20
	sink.refuse("s-refused")
	var wg sync.WaitGroup
	for i := range requests {
		id := "s" + strconv.Itoa(i)
		if i == requests-1 {
			id = "s-refused"
		}
		wg.Go(func() {
			complete(t, c, &xllmpb.CompletionRequest{Model: "m", ServiceRequestId: &id, TokenIds: ids(testBS),
				MaxTokens: ptr(uint32(tokens)), Stream: ptr(true), SourceXserviceAddr: &sink.addr,
				Routing: &xllmpb.Routing{PrefillName: e.Name()}})
		})
	}
	wg.Wait()
	for i := range requests - 1 {
		id := "s" + strconv.Itoa(i)
		gs := sink.wait(t, id, "request "+id+" finished", finished)
		if len(gs) != tokens {
			t.Fatalf("%s: %d generations, want %d", id, len(gs), tokens)
		}
		for j, g := range gs {
			if o := g.gen.Outputs; len(o) != 1 || o[0].Text != fillerToken(j+1) {
				t.Fatalf("%s: generation %d is %v, want token %d", id, j, g.gen, j+1)
			}
		}
	}
	refused := sink.wait(t, "s-refused", "the refused request's first generation", func(gs []sunk) bool { return len(gs) > 0 })
	time.Sleep(100 * time.Millisecond) // time for more, were it to send more
	if refused = sink.wait(t, "s-refused", "", func([]sunk) bool { return true }); len(refused) != 1 {
		t.Fatalf("the refused request sent %d generations, want 1", len(refused))
	}
	sizes := sink.callSizes()
	total, most := 0, 0
	for _, n := range sizes {
		total += n
		most = max(most, n)
	}
	if want := (requests-1)*tokens + 1; total != want {
		t.Fatalf("%d generations in all, want %d", total, want)
	}
	if most < 2 || len(sizes) >= total {
		t.Fatalf("%d generations in %d calls, at most %d in one: calls are not shared", total, len(sizes), most)
	}
	t.Logf("%d generations in %d calls, at most %d in one", total, len(sizes), most)
}

// An engine stops at once even while its requests' generations wait
// for a call the service does not answer: the call out ends with the
// engine, and so do the generations queued behind it.
func TestRPCStopWhileGenerationsWait(t *testing.T) {
	e := inferEngine(t, nil)
	release := make(chan struct{})
	called := make(chan struct{}, 1)
	srv := baidustd.NewServer(baidustd.ServerOptions{})
	must(t, srv.Register(xllmpb.RPCService, xllmpb.MethodGenerations, func(ctx context.Context, _ *baidustd.Request) (baidustd.Response, error) {
		select {
		case called <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return baidustd.Response{}, errors.New("not answered")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	go srv.Serve(ln)
	defer srv.Close()
	defer close(release)
	addr := ln.Addr().String()
	c := rpcClient(t, e.HTTPAddr())
	for i := range 8 {
		id := "w" + strconv.Itoa(i)
		complete(t, c, &xllmpb.CompletionRequest{Model: "m", ServiceRequestId: &id, TokenIds: ids(testBS),
			MaxTokens: ptr(uint32(4)), Stream: ptr(true), SourceXserviceAddr: &addr,
			Routing: &xllmpb.Routing{PrefillName: e.Name()}})
	}
	select {
	case <-called:
	case <-time.After(reqTimeout):
		t.Fatal("no Generations call came")
	}
	time.Sleep(50 * time.Millisecond) // the other requests' first tokens queue behind it
	t0 := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	select {
	case <-closed:
	case <-time.After(rpcCallTimeout / 2):
		t.Fatalf("the engine took over %v to stop with generations waiting", rpcCallTimeout/2)
	}
	t.Logf("stopped in %v", time.Since(t0).Round(time.Millisecond))
}
