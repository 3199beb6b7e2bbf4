package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
	"github.com/kvcar/kvcar/internal/enginesim"
)

// Headers kvcar sets on a routed answer.
const (
	decisionMicrosHeader = "X-Kvcar-Decision-Us"
	prefillNameHeader    = "X-Prefill-Name"
)

// completionBody is an OpenAI completion request whose prompt is token
// ids.
func completionBody(prompt []uint32, maxTokens int) []byte {
	b := make([]byte, 0, 64+7*len(prompt))
	b = append(b, `{"model":"enginesim","max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `,"prompt":[`...)
	for i, t := range prompt {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	return append(b, "]}"...)
}

// completionAnswer is the part of the answer the benchmark reads.
type completionAnswer struct {
	ID    string `json:"id"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
	Engine *enginesim.EngineUsage `json:"kvcar_engine"`
}

// completionResult is what one answered completion told.
type completionResult struct {
	Engine       enginesim.EngineUsage
	PromptTokens int
	// Decision is kvcar's decision time, when it sent the header.
	Decision    time.Duration
	HasDecision bool
	// Latency is the client-observed HTTP round trip.
	Latency time.Duration
}

// sendCompletion posts one completion body to url with the extra header
// and reads the engine's report of the request: the answer's kvcar_engine
// object when the engine's HTTP answer came back as it is, else, for a
// request kvcar sent over baidu_std and answered from the engine's
// output, the record the engine kept under the answer's id.
func sendCompletion(ctx context.Context, hc *http.Client, url string, body []byte, header http.Header, engines devcluster.Engines) (completionResult, error) {
	var res completionResult
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return res, err
	}
	hr.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		hr.Header[k] = v
	}
	t0 := time.Now()
	resp, err := hc.Do(hr)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	res.Latency = time.Since(t0)
	if err != nil {
		return res, fmt.Errorf("reading answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	if v := resp.Header.Get(decisionMicrosHeader); v != "" {
		if us, err := strconv.ParseFloat(v, 64); err == nil {
			res.Decision, res.HasDecision = time.Duration(us*float64(time.Microsecond)), true
		}
	}
	var ans completionAnswer
	if err := json.Unmarshal(b, &ans); err != nil {
		return res, fmt.Errorf("answer: %w", err)
	}
	eu := ans.Engine
	if served, ok := engines.Served(ans.ID); eu == nil && ok {
		eu = &served
	}
	if eu == nil {
		return res, fmt.Errorf("neither a %s object in the answer nor an engine's record of %q", enginesim.EngineUsageField, ans.ID)
	}
	res.Engine, res.PromptTokens = *eu, ans.Usage.PromptTokens
	return res, nil
}

// post sends one completion to url and fills rec from the answer and the
// engine's report of the request (see sendCompletion).
func post(ctx context.Context, hc *http.Client, url string, req *benchRequest, header http.Header, engines devcluster.Engines, rec *record) error {
	res, err := sendCompletion(ctx, hc, url, completionBody(req.Prompt, req.MaxTokens), header, engines)
	rec.Latency = res.Latency
	if err != nil {
		return fmt.Errorf("request %d: %w", req.Index, err)
	}
	if res.HasDecision {
		rec.Decision, rec.HasDecision = res.Decision, true
	}
	if res.PromptTokens != len(req.Prompt) {
		return fmt.Errorf("request %d: engine counted %d prompt tokens, sent %d", req.Index, res.PromptTokens, len(req.Prompt))
	}
	eu := &res.Engine
	rec.Instance, rec.DPRank = eu.Instance, eu.DPRank
	rec.DeviceHit, rec.HostHit = eu.DeviceHitTokens, eu.HostHitTokens
	rec.QueueMs, rec.PrefillMs, rec.DecodeMs, rec.TimeScale = eu.QueueMs, eu.PrefillMs, eu.DecodeMs, eu.TimeScale
	return nil
}

// probe reads every rank's reusable prefix for tokens from the engines'
// own caches, all ranks at once: each read is a command to its rank's
// goroutine, which owns the cache.
func probe(engines []*enginesim.Engine, tokens []uint32) [][]int {
	out := make([][]int, len(engines))
	var wg sync.WaitGroup
	for i, e := range engines {
		out[i] = make([]int, e.DPSize())
		for dp := range out[i] {
			wg.Go(func() {
				dev, host := e.Oracle(dp, tokens)
				out[i][dp] = dev + host
			})
		}
	}
	wg.Wait()
	return out
}

// viaKvcar sends each request to kvcar, which routes it by its policy.
func viaKvcar(hc *http.Client, base string, engines []*enginesim.Engine) sender {
	url := base + "/v1/completions"
	return func(ctx context.Context, req *benchRequest) record {
		rec := record{Index: req.Index, Session: req.Session, Turn: req.Turn, Prompt: len(req.Prompt)}
		rec.Probe = probe(engines, req.Prompt)
		rec.Err = post(ctx, hc, url, req, nil, engines, &rec)
		return rec
	}
}

// dpRule says how LONGEST_PREFIX values an instance with several DP
// ranks: the engine, not the router, picks the rank (the least loaded
// one), so a prefix held by one rank only is reused only when the engine
// happens to pick that rank.
type dpRule int

const (
	// rankMin values an instance by its worst rank: the reuse it gets
	// whichever rank the engine picks (the rule CAR also applies).
	rankMin dpRule = iota
	// rankMax values it by its best rank, which the engine's own rank
	// choice may not deliver.
	rankMax
)

// longestPrefix routes each request itself, straight to the engine
// whose cache holds the longest reusable prefix right now (Device +
// Host-only tokens, as the engine reuses both), the fewest waiting
// requests breaking ties, then the fewest running, then a rotating turn.
// It is greedy: perfect knowledge of the caches, no thought for load or
// for what its choice does to later requests.
type longestPrefix struct {
	engines []*enginesim.Engine
	rule    dpRule
	turn    atomic.Uint64
}

// pick chooses an engine from the probe of every rank.
func (o *longestPrefix) pick(p [][]int) int {
	n := len(o.engines)
	start := int(o.turn.Add(1) % uint64(n))
	best := -1
	var bestHit, bestWait, bestRun int
	for k := range n {
		i := (start + k) % n
		hit := p[i][0]
		for _, h := range p[i][1:] {
			if o.rule == rankMin {
				hit = min(hit, h)
			} else {
				hit = max(hit, h)
			}
		}
		st := o.engines[i].Stats()
		better := best < 0 || hit > bestHit ||
			hit == bestHit && (st.Waiting < bestWait || st.Waiting == bestWait && st.Running < bestRun)
		if better {
			best, bestHit, bestWait, bestRun = i, hit, st.Waiting, st.Running
		}
	}
	return best
}

func (o *longestPrefix) sender(hc *http.Client) sender {
	return func(ctx context.Context, req *benchRequest) record {
		rec := record{Index: req.Index, Session: req.Session, Turn: req.Turn, Prompt: len(req.Prompt)}
		t0 := time.Now()
		rec.Probe = probe(o.engines, req.Prompt)
		e := o.engines[o.pick(rec.Probe)]
		rec.Decision, rec.HasDecision = time.Since(t0), true
		h := http.Header{prefillNameHeader: {e.Name()}}
		rec.Err = post(ctx, hc, "http://"+e.Name()+"/v1/completions", req, h, nil, &rec)
		return rec
	}
}
