package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/server"
)

// router is who decides where a replayed request goes. kvcar's own
// policies (viaKvcar) leave it to kvcar; the benchmark's policies pick an
// engine themselves and send the request straight to it, as kvcar would
// relay it, with the name in X-Prefill-Name.
type router interface {
	// pick chooses an engine for the request; http is the part of the
	// decision spent in HTTP round trips to kvcar. The returned done
	// must be called once the request has been answered or has failed.
	pick(ctx context.Context, rr *replayRequest, tokens []uint32) (engine int, http time.Duration, done func(), err error)
	// viaKvcar reports whether kvcar routes (pick is not called).
	viaKvcar() bool
}

func newRouter(p tracePolicy, f *fleet, kv *devcluster.KVCar, hc *http.Client, seed uint64) (router, error) {
	rng := rand.New(rand.NewPCG(seed, 0x726f75746572))
	switch p.Kind {
	case kindKvcar:
		return kvcarRouter{}, nil
	case kindRandom:
		return &randomRouter{rng: rng, n: len(f.names)}, nil
	case kindLLMD:
		return &llmdRouter{obs: observer{f: f, kv: kv, hc: hc}, rng: rng}, nil
	case kindDynamo:
		return newDynamoRouter(observer{f: f, kv: kv, hc: hc}, rng), nil
	}
	return nil, fmt.Errorf("policy %s: no router", p.Name)
}

type kvcarRouter struct{}

func (kvcarRouter) viaKvcar() bool { return true }
func (kvcarRouter) pick(context.Context, *replayRequest, []uint32) (int, time.Duration, func(), error) {
	return -1, 0, nil, fmt.Errorf("kvcar routes this policy")
}

// randomRouter picks an engine uniformly at random.
type randomRouter struct {
	mu  sync.Mutex
	rng *rand.Rand
	n   int
}

func (*randomRouter) viaKvcar() bool { return false }
func (r *randomRouter) pick(context.Context, *replayRequest, []uint32) (int, time.Duration, func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.IntN(r.n), 0, func() {}, nil
}

// serveOne sends one request on its way and records what happened.
func serveOne(ctx context.Context, a replayRequest, rt router, f *fleet, hc *http.Client, kvcarURL string) traceRecord {
	rec := traceRecord{
		Index: a.index, Line: a.req.Line, ArrivalMs: a.arrivalMs, Input: a.req.Input, Output: a.req.Output,
		Engine: -1, DPRank: -1,
	}
	perBlock := TraceBlockTokens / f.scale
	tokens := appendTokens(make([]uint32, 0, promptLen(a.req, perBlock)), a.req, perBlock)
	// One output token: the first comes out of prefill, which is all the
	// emulated engines serve (see the report on decode).
	body := completionBody(tokens, 1)
	url, header := kvcarURL+server.CompletionsPath, http.Header(nil)
	if !rt.viaKvcar() {
		t0 := time.Now()
		e, httpTime, done, err := rt.pick(ctx, &a, tokens)
		rec.Decision, rec.HasDecision, rec.DecisionHTTP = time.Since(t0), true, httpTime
		if err != nil {
			rec.Err = fmt.Errorf("line %d: routing: %w", a.req.Line, err)
			return rec
		}
		defer done()
		url = "http://" + f.names[e] + server.CompletionsPath
		header = http.Header{prefillNameHeader: {f.names[e]}}
	}
	res, err := sendCompletion(ctx, hc, url, body, header, f.engines)
	if err != nil {
		rec.Err = fmt.Errorf("line %d: %w", a.req.Line, err)
		return rec
	}
	if rt.viaKvcar() {
		rec.Decision, rec.HasDecision = res.Decision, res.HasDecision
	}
	eu := &res.Engine
	e, ok := f.index[eu.Instance]
	switch {
	case !ok:
		rec.Err = fmt.Errorf("line %d: served by %q, not an engine of this run", a.req.Line, eu.Instance)
	case res.PromptTokens != len(tokens):
		rec.Err = fmt.Errorf("line %d: the engine counted %d prompt tokens, sent %d", a.req.Line, res.PromptTokens, len(tokens))
	case eu.DPRank < 0 || eu.DPRank >= f.dp[e]:
		rec.Err = fmt.Errorf("line %d: DP rank %d of an engine with %d", a.req.Line, eu.DPRank, f.dp[e])
	}
	if rec.Err != nil {
		return rec
	}
	rec.Engine, rec.DPRank = e, eu.DPRank
	// Hits are whole blocks: in the trace's tokens, f.scale times more.
	rec.DeviceHit, rec.HostHit = eu.DeviceHitTokens*f.scale, eu.HostHitTokens*f.scale
	rec.EngineTTFTMs = (eu.QueueMs + eu.PrefillMs) / eu.TimeScale
	return rec
}
