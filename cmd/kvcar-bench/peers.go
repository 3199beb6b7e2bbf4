package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
)

// The comparison policies below re-implement other routers' scoring from
// their public descriptions, for this benchmark only. Both take the
// prefix each instance holds from kvcar's query API (the directory CAR
// reads) and llm-d's load from kvcar's registry (the loads CAR reads),
// so every policy sees the same state; what differs is the formula. The
// price is an HTTP round trip per request that CAR, inside kvcar, does
// not pay: the report gives it apart, and it is not in any TTFT, which
// is computed from the trace's arrival times.
//
// An instance's prefix is the minimum over its DP ranks, as CAR takes
// it: the engine, not the router, picks the rank, so that is what the
// instance delivers whichever rank serves.

// view is what a comparison policy knows at decision time.
type view struct {
	// hit is each engine's reusable prefix in the trace's tokens.
	hit []int
	// load is each engine's registry entry; ok false when kvcar's
	// registry does not list it as routable.
	load []devcluster.InstanceLoad
	ok   []bool
}

// observer reads kvcar's state for a prompt.
type observer struct {
	f  *fleet
	kv *devcluster.KVCar
	hc *http.Client
}

// observe asks the query API and the registry at once and returns the
// view and the wall time both took.
func (o observer) observe(ctx context.Context, tokens []uint32, withLoads bool) (view, time.Duration, error) {
	n := len(o.f.names)
	v := view{hit: make([]int, n), load: make([]devcluster.InstanceLoad, n), ok: make([]bool, n)}
	t0 := time.Now()
	var (
		wg       sync.WaitGroup
		matches  []devcluster.Match
		loads    []devcluster.InstanceLoad
		qErr, lE error
	)
	wg.Go(func() { matches, qErr = o.kv.Query(ctx, o.hc, devcluster.QueryBody(tokens)) })
	if withLoads {
		wg.Go(func() { loads, lE = o.kv.Instances(ctx, o.hc) })
	}
	wg.Wait()
	took := time.Since(t0)
	if err := errors.Join(qErr, lE); err != nil {
		return v, took, err
	}
	// The minimum over ranks; a rank missing or unsynchronised gives 0.
	ranks := make([]int, n)
	for i := range v.hit {
		v.hit[i] = -1
	}
	for _, m := range matches {
		e, ok := o.f.index[m.InstanceName]
		if !ok || m.DPRank < 0 || m.DPRank >= o.f.dp[e] {
			continue
		}
		h := (m.DeviceHitTokens + m.HostOnlyHitTokens) * o.f.scale
		if !m.Synchronized {
			h = 0
		}
		ranks[e]++
		if v.hit[e] < 0 || h < v.hit[e] {
			v.hit[e] = h
		}
	}
	for e := range v.hit {
		if ranks[e] != o.f.dp[e] {
			v.hit[e] = 0
		}
	}
	for _, l := range loads {
		if e, ok := o.f.index[l.Name]; ok {
			v.load[e], v.ok[e] = l, l.LoadValid && l.State == "ACTIVE"
		}
	}
	if !withLoads {
		for e := range v.ok {
			v.ok[e] = true
		}
	}
	return v, took, nil
}

// pickBest returns the candidate with the best score (higher or lower
// as better says), ties broken at random.
func pickBest(scores []float64, ok []bool, higher bool, rng *rand.Rand) int {
	best, ties := -1, 0
	for i, s := range scores {
		if !ok[i] {
			continue
		}
		switch {
		case best < 0 || higher && s > scores[best] || !higher && s < scores[best]:
			best, ties = i, 1
		case s == scores[best]:
			// Reservoir sampling keeps each tied candidate with equal
			// probability.
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// llmdRouter is llm-d's inference scheduler with the precise prefix
// cache scorer, weighted as its precise-prefix guide sets it up: score =
// 2·prefix + 1·KV utilisation + 1·queue, the highest wins. prefix is the
// instance's longest cached prefix in blocks, min-max normalised over
// the instances holding at least one block (1 when they hold the same,
// 0 for the others); KV utilisation is 1 − gpu_cache_usage_perc; queue
// is (maxQ − q)/(maxQ − minQ) over the waiting requests, 1 when all are
// equal.
type llmdRouter struct {
	obs observer
	mu  sync.Mutex
	rng *rand.Rand
}

func (*llmdRouter) viaKvcar() bool { return false }

func (r *llmdRouter) pick(ctx context.Context, _ *replayRequest, tokens []uint32) (int, time.Duration, func(), error) {
	v, took, err := r.obs.observe(ctx, tokens, true)
	if err != nil {
		return -1, took, nil, err
	}
	scores := llmdScores(v)
	r.mu.Lock()
	e := pickBest(scores, v.ok, true, r.rng)
	r.mu.Unlock()
	if e < 0 {
		return -1, took, nil, errors.New("no instance with a valid load")
	}
	return e, took, func() {}, nil
}

func llmdScores(v view) []float64 {
	n := len(v.hit)
	scores := make([]float64, n)
	minB, maxB := -1, -1
	minQ, maxQ := uint64(0), uint64(0)
	first := true
	for i := range n {
		if !v.ok[i] {
			continue
		}
		if b := v.hit[i] / TraceBlockTokens; b > 0 {
			if minB < 0 || b < minB {
				minB = b
			}
			maxB = max(maxB, b)
		}
		q := v.load[i].Waiting
		if first || q < minQ {
			minQ = q
		}
		if first || q > maxQ {
			maxQ = q
		}
		first = false
	}
	for i := range n {
		prefix := 0.0
		if b := v.hit[i] / TraceBlockTokens; b > 0 {
			prefix = 1
			if maxB > minB {
				prefix = float64(b-minB) / float64(maxB-minB)
			}
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-v.load[i].Waiting) / float64(maxQ-minQ)
		}
		scores[i] = 2*prefix + (1 - v.load[i].GPUCacheUsagePerc) + queue
	}
	return scores
}

// dynamoRouter is Dynamo's KV router cost, with its router-side
// tracking of the requests it has sent: for each instance, cost =
// overlap_score_weight (1) × potential prefill blocks + potential
// decode blocks, the lowest wins. Potential prefill blocks are the
// prompt tokens of the requests it sent there and not yet seen prefilled,
// plus this prompt's tokens beyond the instance's cached prefix, over
// the block size; potential decode blocks are the distinct blocks of the
// requests it sent there and not yet seen finish, plus this prompt's
// blocks not among them. Here a request is finished when its answer
// comes back, which is right after prefill (decode is not emulated).
// Dynamo scores DP ranks apart; here an instance is one worker, since
// the engine picks the rank.
type dynamoRouter struct {
	obs observer
	mu  sync.Mutex
	rng *rand.Rand
	// Per engine: prompt tokens to prefill and block references of the
	// requests in flight.
	prefill []int
	blocks  []map[uint64]int
}

func newDynamoRouter(obs observer, rng *rand.Rand) *dynamoRouter {
	n := len(obs.f.names)
	r := &dynamoRouter{obs: obs, rng: rng, prefill: make([]int, n), blocks: make([]map[uint64]int, n)}
	for i := range r.blocks {
		r.blocks[i] = map[uint64]int{}
	}
	return r
}

func (*dynamoRouter) viaKvcar() bool { return false }

func (r *dynamoRouter) pick(ctx context.Context, rr *replayRequest, tokens []uint32) (int, time.Duration, func(), error) {
	v, took, err := r.obs.observe(ctx, tokens, false)
	if err != nil {
		return -1, took, nil, err
	}
	e, done := r.choose(v, rr)
	if e < 0 {
		return -1, took, nil, errors.New("no instance")
	}
	return e, took, done, nil
}

// choose picks the cheapest instance for the request and starts
// tracking it there until done is called.
func (r *dynamoRouter) choose(v view, rr *replayRequest) (int, func()) {
	// Every block of the prompt, the partial last one included, as
	// Dynamo counts a sequence's blocks.
	keys := chainKeys(nil, rr.req, len(rr.req.HashIDs))
	newTokens := func(e int) int { return rr.req.Input - v.hit[e]/TraceBlockTokens*TraceBlockTokens }
	r.mu.Lock()
	defer r.mu.Unlock()
	costs := make([]float64, len(v.hit))
	for i := range costs {
		newBlocks := 0
		for _, k := range keys {
			if r.blocks[i][k] == 0 {
				newBlocks++
			}
		}
		costs[i] = float64(r.prefill[i]+newTokens(i))/TraceBlockTokens + float64(len(r.blocks[i])+newBlocks)
	}
	e := pickBest(costs, v.ok, false, r.rng)
	if e < 0 {
		return -1, nil
	}
	tokens := newTokens(e)
	r.prefill[e] += tokens
	for _, k := range keys {
		r.blocks[e][k]++
	}
	return e, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.prefill[e] -= tokens
		for _, k := range keys {
			if r.blocks[e][k]--; r.blocks[e][k] <= 0 {
				delete(r.blocks[e], k)
			}
		}
	}
}

// inFlight is what the Dynamo router tracks now, for tests.
func (r *dynamoRouter) inFlight() (tokens, blocks int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.prefill {
		tokens += r.prefill[i]
		blocks += len(r.blocks[i])
	}
	return tokens, blocks
}
