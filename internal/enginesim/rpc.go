package enginesim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/baidustd"
	"github.com/kvcar/kvcar/internal/xllmpb"
)

// The hand-off of a request from a prefill instance to its decode
// instance. xLLM engines have a protocol of their own for it; the
// emulation only needs "decode the rest of this request and send its
// output to the service", so it uses a method of its own, carrying a
// CompletionRequest whose request_id is the engine's request id.
const (
	PDService      = "kvcar.enginesim.DisaggPD"
	PDMethodDecode = "Decode"
)

// xLLM's StatusCode values an engine puts in gen_status.
const (
	statusInvalidArgument   = 3
	statusResourceExhausted = 5
	statusUnavailable       = 6
)

// Bounds of the engine's calls to the service and to other engines.
const (
	rpcCallTimeout = 5 * time.Second
	rpcDialTimeout = time.Second
	maxRPCPeers    = 256
)

// rpcSide is the baidu_std side of the business port of one process:
// XllmAPIService Completions and ChatCompletions, which answer at once
// and send the output later through XllmRpcService.Generations to the
// request's source_xservice_addr, as an xLLM engine does, and the PD
// hand-off. Each accepted request runs on a goroutine of its own, which
// stop ends and waits for.
type rpcSide struct {
	e      *Engine
	srv    *baidustd.Server
	ctx    context.Context // ends at stop
	cancel context.CancelFunc
	reqs   sync.WaitGroup

	mu      sync.Mutex
	clients map[string]*baidustd.Client // by address: services and decode engines
	batches map[string]*outBatch        // by service address
	stopped bool
}

func (e *Engine) newRPCSide() (*rpcSide, error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &rpcSide{e: e, ctx: ctx, cancel: cancel, clients: make(map[string]*baidustd.Client), batches: make(map[string]*outBatch),
		srv: baidustd.NewServer(baidustd.ServerOptions{Logger: e.cfg.Logger})}
	for _, m := range []struct {
		svc, method string
		h           baidustd.Handler
	}{
		{xllmpb.APIService, xllmpb.MethodCompletions, baidustd.Unary(r.completions)},
		{xllmpb.APIService, xllmpb.MethodChatCompletions, baidustd.Unary(r.chatCompletions)},
		{PDService, PDMethodDecode, baidustd.Unary(r.decode)},
	} {
		if err := r.srv.Register(m.svc, m.method, m.h); err != nil {
			cancel()
			return nil, err
		}
	}
	return r, nil
}

// stop ends the requests in flight, waits for them and closes the
// server and the clients.
func (r *rpcSide) stop(ctx context.Context) error {
	r.cancel()
	err := r.srv.Shutdown(ctx)
	r.reqs.Wait()
	r.mu.Lock()
	r.stopped = true
	clients := r.clients
	r.clients = nil
	r.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	return err
}

// rpcRequest is one request as the engine serves it over baidu_std.
type rpcRequest struct {
	chat      bool
	model     string
	reqID     string // the engine's own id, "cmpl-…" or "chatcmpl-…"
	serviceID string // service_request_id, which the output carries back
	source    string // where the output goes
	tokens    []uint32
	maxTokens int
	stream    bool
	prefill   string
	decode    string
}

func (r *rpcSide) completions(_ context.Context, req *xllmpb.CompletionRequest) (*xllmpb.CompletionResponse, error) {
	rr, err := r.accept(false, req.GetModel(), req.GetServiceRequestId(), req.GetSourceXserviceAddr(), req.GetRouting(),
		req.MaxTokens, req.N, req.GetStream())
	if err != nil {
		return nil, err
	}
	if len(req.GetTokenIds()) > 0 {
		rr.tokens = int32s(req.GetTokenIds())
	} else if rr.tokens, err = encodeText(req.GetPrompt(), r.e.cfg.Tokenizer); err != nil {
		rr.tokens = nil
	}
	r.start(rr)
	return &xllmpb.CompletionResponse{}, nil
}

func (r *rpcSide) chatCompletions(_ context.Context, req *xllmpb.ChatRequest) (*xllmpb.ChatResponse, error) {
	rr, err := r.accept(true, req.GetModel(), req.GetServiceRequestId(), req.GetSourceXserviceAddr(), req.GetRouting(),
		req.MaxTokens, req.N, req.GetStream())
	if err != nil {
		return nil, err
	}
	if len(req.GetTokenIds()) > 0 {
		rr.tokens = int32s(req.GetTokenIds())
	} else {
		msgs := make([]ChatMessage, len(req.GetMessages()))
		for i, m := range req.GetMessages() {
			msgs[i] = ChatMessage{Role: m.GetRole(), Content: m.GetContent()}
		}
		if rr.tokens, err = chatTokenIDs(msgs, r.e.cfg.Tokenizer); err != nil {
			rr.tokens = nil
		}
	}
	r.start(rr)
	return &xllmpb.ChatResponse{}, nil
}

// accept reads what both request kinds share. A request without a
// service_request_id or without anywhere to send its output is refused
// on the call itself: no Generations could reach anyone.
func (r *rpcSide) accept(chat bool, model, serviceID, source string, routing *xllmpb.Routing, maxTokens, n *uint32, stream bool) (*rpcRequest, error) {
	if serviceID == "" {
		return nil, baidustd.Errorf(baidustd.EREQUEST, "service_request_id is required: the output is sent back under it")
	}
	if source == "" {
		source = r.e.HeartbeatMaster() // where an engine sends output without one
	}
	if source == "" {
		return nil, baidustd.Errorf(baidustd.EREQUEST, "source_xservice_addr is empty and no master service is known")
	}
	rr := &rpcRequest{chat: chat, model: model, serviceID: serviceID, source: source, maxTokens: defaultMaxTokens, stream: stream,
		prefill: routing.GetPrefillName(), decode: routing.GetDecodeName()}
	if maxTokens != nil {
		rr.maxTokens = int(*maxTokens)
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	// Unique across engines, as an xLLM engine's "cmpl-<hash of its
	// name>-<uuid>" is, so that an answer's id names the request.
	h := fnv.New32a()
	h.Write([]byte(r.e.Name()))
	rr.reqID = prefix + strconv.FormatUint(uint64(h.Sum32()), 36) + "-" + strconv.FormatUint(r.e.serve.nextID(), 10)
	if n != nil && *n != 1 {
		rr.maxTokens = -1 // refused in serve with the reason below
	}
	return rr, nil
}

// start runs the request on a goroutine of its own, unless the side is
// stopping.
func (r *rpcSide) start(rr *rpcRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.ctx.Err() != nil {
		return
	}
	r.reqs.Add(1)
	go func() {
		defer r.reqs.Done()
		r.serve(rr)
	}()
}

// errGone: the service no longer wants the request's output (its client
// went away, or it cannot be reached).
var errGone = errors.New("the service refused the request's output")

// serve runs a request through the cost model, as serveInference does
// for HTTP, and sends its output as Generations: prefill on the least
// loaded rank, then either the whole decode here or, with a decode
// instance named in the routing, the first token from here and the rest
// from there.
func (r *rpcSide) serve(rr *rpcRequest) {
	e := r.e
	switch {
	case e.failStatus.Load() != 0:
		e.serve.count(func(st *EngineStats) { st.Failed++ })
		r.fail(rr, statusUnavailable, "injected engine failure")
		return
	case len(rr.tokens) == 0:
		e.serve.count(func(st *EngineStats) { st.BadRequests++ })
		r.fail(rr, statusInvalidArgument, "the prompt has no tokens")
		return
	case rr.maxTokens < 0:
		e.serve.count(func(st *EngineStats) { st.BadRequests++ })
		r.fail(rr, statusInvalidArgument, "n must be 1: the emulated engine returns exactly one choice")
		return
	case rr.maxTokens > maxCompletionTokens:
		e.serve.count(func(st *EngineStats) { st.BadRequests++ })
		r.fail(rr, statusInvalidArgument, fmt.Sprintf("max_tokens %d is outside [0, %d]", rr.maxTokens, maxCompletionTokens))
		return
	}
	if rr.prefill != "" && rr.prefill != e.Name() {
		e.serve.count(func(st *EngineStats) { st.Misrouted++ })
	}
	t, err := e.serve.admit()
	if err != nil {
		if errors.Is(err, errOverloaded) {
			r.fail(rr, statusResourceExhausted, "The number of concurrent requests has reached the limit.")
		}
		return
	}
	defer t.done()
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	queued, err := t.wait(ctx)
	if err != nil {
		r.ended(err)
		return
	}
	dev, host, prefill, err := e.prefillOn(t, rr.tokens, queued)
	if err == nil {
		err = pause(ctx, t.g, prefill)
	}
	if err != nil {
		r.ended(err)
		return
	}
	usage := &xllmpb.OutputUsage{NumPromptTokens: int32(len(rr.tokens)), NumGeneratedTokens: int32(rr.maxTokens),
		NumTotalTokens: int32(len(rr.tokens) + rr.maxTokens), NumCachedTokens: int32(dev + host)}
	e.served.put(rr.reqID, EngineUsage{Instance: e.Name(), DPRank: t.dp, DeviceHitTokens: dev, HostHitTokens: host,
		QueueMs: ms(queued), PrefillMs: ms(prefill), DecodeMs: ms(time.Duration(max(rr.maxTokens-1, 0)) * e.scaled(e.cfg.DecodePerToken)),
		TimeScale: e.cfg.TimeScale, PrefillName: rr.prefill, DecodeName: rr.decode})
	if rr.decode == "" || rr.decode == e.Name() || rr.maxTokens <= 1 {
		err = r.emit(ctx, t.g, rr, 1, false, usage)
	} else {
		err = r.handOff(ctx, rr, usage)
	}
	r.ended(err)
}

// handOff sends the first token from the prefill instance, marked
// finished_on_prefill_instance, and asks the decode instance for the
// rest.
func (r *rpcSide) handOff(ctx context.Context, rr *rpcRequest, usage *xllmpb.OutputUsage) error {
	first := r.gen(rr)
	first.Outputs = []*xllmpb.SequenceOutput{{Text: fillerToken(1), TokenIds: []int32{1}}}
	first.FinishedOnPrefillInstance = true
	if !r.send(rr.source, first) {
		return errGone
	}
	cctx, cancel := context.WithTimeout(ctx, rpcCallTimeout)
	defer cancel()
	req := &xllmpb.CompletionRequest{
		Model: rr.model, RequestId: &rr.reqID, ServiceRequestId: &rr.serviceID, TokenIds: uint32s(rr.tokens),
		MaxTokens: ptr(uint32(rr.maxTokens)), Stream: ptr(rr.stream), SourceXserviceAddr: &rr.source,
		Routing: &xllmpb.Routing{PrefillName: rr.prefill, DecodeName: rr.decode},
	}
	if err := r.client(rr.decode).CallProto(cctx, PDService, PDMethodDecode, req, &xllmpb.CompletionResponse{}, nil); err != nil {
		r.fail(rr, statusUnavailable, fmt.Sprintf("decode instance %s: %v", rr.decode, err))
		return err
	}
	return nil
}

// decode serves the decode half of a request prefilled elsewhere.
func (r *rpcSide) decode(_ context.Context, req *xllmpb.CompletionRequest) (*xllmpb.CompletionResponse, error) {
	if req.GetServiceRequestId() == "" || req.GetSourceXserviceAddr() == "" || req.GetRequestId() == "" {
		return nil, baidustd.Errorf(baidustd.EREQUEST, "a hand-off needs request_id, service_request_id and source_xservice_addr")
	}
	rr := &rpcRequest{model: req.GetModel(), reqID: req.GetRequestId(), serviceID: req.GetServiceRequestId(),
		source: req.GetSourceXserviceAddr(), tokens: int32s(req.GetTokenIds()), maxTokens: int(req.GetMaxTokens()),
		stream: req.GetStream(), prefill: req.GetRouting().GetPrefillName(), decode: req.GetRouting().GetDecodeName()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.ctx.Err() != nil {
		return nil, baidustd.Errorf(baidustd.ELOGOFF, "engine is stopping")
	}
	r.reqs.Add(1)
	go func() {
		defer r.reqs.Done()
		r.serveDecode(rr)
	}()
	return &xllmpb.CompletionResponse{}, nil
}

func (r *rpcSide) serveDecode(rr *rpcRequest) {
	e := r.e
	t, err := e.serve.admit()
	if err != nil {
		if errors.Is(err, errOverloaded) {
			r.fail(rr, statusResourceExhausted, "The number of concurrent requests has reached the limit.")
		}
		return
	}
	defer t.done()
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	if _, err := t.wait(ctx); err != nil {
		r.ended(err)
		return
	}
	e.serve.count(func(st *EngineStats) { st.Decoded++ })
	usage := &xllmpb.OutputUsage{NumPromptTokens: int32(len(rr.tokens)), NumGeneratedTokens: int32(rr.maxTokens),
		NumTotalTokens: int32(len(rr.tokens) + rr.maxTokens)}
	r.ended(r.emit(ctx, t.g, rr, 2, true, usage))
}

// emit produces output tokens from..maxTokens, each a decode step after
// the one before (the first at once unless stepFirst, when it too is a
// decode step). Streamed, each token is a Generation of its own, the last
// with the finish reason, usage and finished; unstreamed, one Generation
// holds the whole output, as an engine sends a non-streamed result.
func (r *rpcSide) emit(ctx context.Context, g *generation, rr *rpcRequest, from int, stepFirst bool, usage *xllmpb.OutputUsage) error {
	step := r.e.scaled(r.e.cfg.DecodePerToken)
	n := rr.maxTokens
	if !rr.stream {
		steps := n - from
		if stepFirst {
			steps++
		}
		if err := pause(ctx, g, time.Duration(max(steps, 0))*step); err != nil {
			return err
		}
		out := &xllmpb.SequenceOutput{Text: fillerText(n), FinishReason: finishLength}
		for i := 1; i <= n; i++ {
			out.TokenIds = append(out.TokenIds, int32(i))
		}
		return r.finish(ctx, rr, out, usage, time.Duration(max(steps, 0))*step)
	}
	if n < from { // nothing left to generate
		return r.finish(ctx, rr, &xllmpb.SequenceOutput{FinishReason: finishLength}, usage, 0)
	}
	var decoded time.Duration
	for i := from; i <= n; i++ {
		if i > from || stepFirst {
			if err := pause(ctx, g, step); err != nil {
				return err
			}
			decoded += step
		}
		out := &xllmpb.SequenceOutput{Text: fillerToken(i), TokenIds: []int32{int32(i)}}
		if i == n {
			out.FinishReason = finishLength
			return r.finish(ctx, rr, out, usage, decoded)
		}
		gen := r.gen(rr)
		gen.Outputs = []*xllmpb.SequenceOutput{out}
		if !r.send(rr.source, gen) {
			return errGone
		}
	}
	return nil
}

// finish sends the last Generation and counts the request completed.
func (r *rpcSide) finish(ctx context.Context, rr *rpcRequest, out *xllmpb.SequenceOutput, usage *xllmpb.OutputUsage, decoded time.Duration) error {
	gen := r.gen(rr)
	gen.Outputs, gen.Usage, gen.Finished = []*xllmpb.SequenceOutput{out}, usage, true
	if !r.send(rr.source, gen) {
		return errGone
	}
	r.e.serve.count(func(st *EngineStats) {
		st.Completed++
		st.CompletionTokens += uint64(rr.maxTokens)
		st.DecodeTime += decoded
	})
	return nil
}

// ended accounts for how a request ended early, if it did.
func (r *rpcSide) ended(err error) {
	switch {
	case err == nil:
	case errors.Is(err, errAborted) || r.ctx.Err() != nil:
		r.e.serve.count(func(st *EngineStats) { st.Aborted++ })
	default:
		r.e.serve.count(func(st *EngineStats) { st.Cancelled++ })
	}
}

// gen starts a Generation of rr, status OK (present, empty, as an engine
// sends it).
func (r *rpcSide) gen(rr *rpcRequest) *xllmpb.DisaggStreamGeneration {
	return &xllmpb.DisaggStreamGeneration{ReqId: rr.reqID, ServiceReqId: rr.serviceID, GenStatus: &xllmpb.GenerationStatus{}}
}

// fail sends an error Generation as an engine sends one: the
// service_req_id and the status only.
func (r *rpcSide) fail(rr *rpcRequest, code int32, msg string) {
	r.send(rr.source, &xllmpb.DisaggStreamGeneration{ServiceReqId: rr.serviceID,
		GenStatus: &xllmpb.GenerationStatus{StatusCode: code, StatusMsg: msg}})
}

// send hands one generation to addr's Generations calls and reports
// whether the service took it. As an xLLM engine sends each step's
// outputs in one call, the generations of all requests bound for one
// service go together: while a call is out, those that come wait, and
// the next call carries them all (see outBatch). The call's deadline is
// the engine's, not a request's: it carries other requests' outputs too.
func (r *rpcSide) send(addr string, gen *xllmpb.DisaggStreamGeneration) bool {
	return r.batch(addr).send(r, addr, gen)
}

// outBatch gathers the generations bound for one service. The sender
// that finds no call out makes the next one, with everything queued; when
// it returns, it hands the making of the call after to the first sender
// queued meanwhile, so that no sender makes more than one call.
type outBatch struct {
	mu     sync.Mutex
	queue  []*outGen
	active bool // a sender is making a call
}

// outGen is one generation waiting for its call; wake gets its answer,
// or outLead when its sender is to make the next call.
type outGen struct {
	gen  *xllmpb.DisaggStreamGeneration
	wake chan int8
}

const (
	outTaken int8 = iota
	outRefused
	outLead
)

func (b *outBatch) send(r *rpcSide, addr string, gen *xllmpb.DisaggStreamGeneration) bool {
	me := &outGen{gen: gen, wake: make(chan int8, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, me)
	lead := !b.active
	b.active = true
	b.mu.Unlock()
	if !lead {
		// A round ends within its call's timeout, so this wait ends;
		// once the engine stops, no call is made again.
		select {
		case w := <-me.wake:
			if w != outLead {
				return w == outTaken
			}
		case <-r.ctx.Done():
			return false
		}
	}
	b.mu.Lock()
	round := b.queue
	b.queue = nil
	b.mu.Unlock()
	taken := r.call(addr, round)
	mine := false
	for i, g := range round {
		switch {
		case g == me:
			mine = taken[i]
		case taken[i]:
			g.wake <- outTaken
		default:
			g.wake <- outRefused
		}
	}
	b.mu.Lock()
	if len(b.queue) > 0 {
		b.queue[0].wake <- outLead
	} else {
		b.active = false
	}
	b.mu.Unlock()
	return mine
}

// call makes one Generations call with the generations of round and
// reports, for each, whether the service took it.
func (r *rpcSide) call(addr string, round []*outGen) []bool {
	ctx, cancel := context.WithTimeout(r.ctx, rpcCallTimeout)
	defer cancel()
	msg := &xllmpb.DisaggStreamGenerations{Gens: make([]*xllmpb.DisaggStreamGeneration, len(round))}
	for i, g := range round {
		msg.Gens[i] = g.gen
	}
	taken := make([]bool, len(round))
	var set xllmpb.StatusSet
	if err := r.client(addr).CallProto(ctx, xllmpb.RPCService, xllmpb.MethodGenerations, msg, &set, nil); err != nil {
		if r.ctx.Err() == nil {
			r.e.cfg.Logger.Warn("sending generations failed", "engine", r.e.Name(), "service", addr, "err", err)
		}
		return taken
	}
	if st := set.GetAllStatus(); len(st) == len(round) {
		for i := range taken {
			taken[i] = st[i].GetOk()
		}
	}
	return taken
}

// batch is addr's outBatch, made on first use; at most maxRPCPeers are
// kept, as with the clients.
func (r *rpcSide) batch(addr string) *outBatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.batches[addr]
	if b == nil {
		if len(r.batches) >= maxRPCPeers {
			for a := range r.batches {
				delete(r.batches, a) // its rounds in progress end as they are
				break
			}
		}
		b = &outBatch{}
		r.batches[addr] = b
	}
	return b
}

// client is the one connection to addr, made on first use. After stop it
// is a closed client whose calls fail.
func (r *rpcSide) client(addr string) *baidustd.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.clients[addr]; c != nil {
		return c
	}
	c := baidustd.NewClient(addr, baidustd.ClientOptions{DialTimeout: rpcDialTimeout, Logger: r.e.cfg.Logger})
	if r.stopped {
		c.Close()
		return c
	}
	if len(r.clients) >= maxRPCPeers {
		// Addresses come from requests: keep their number bounded, at
		// the price of the calls in flight to the one dropped.
		for a, old := range r.clients {
			old.Close()
			delete(r.clients, a)
			break
		}
	}
	r.clients[addr] = c
	return c
}

func int32s(ids []int32) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

func uint32s(ids []uint32) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
