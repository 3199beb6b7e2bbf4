package main

import (
	"cmp"
	"slices"
	"time"
)

// dist is a distribution's summary.
type dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

func distOf(xs []float64) dist {
	return dist{Mean: mean(xs), P50: quantile(xs, 0.5), P90: quantile(xs, 0.9), P99: quantile(xs, 0.99)}
}

// Where a run's decision times come from.
const (
	decisionKvcarHeader = "kvcar's " + decisionMicrosHeader + " header"
	decisionNotExposed  = "not exposed by this kvcar"
	decisionBenchmark   = "the benchmark's own pick, HTTP to kvcar included"
)

// runResult is one policy's replay with one seed.
type runResult struct {
	Policy   string `json:"policy"`
	Seed     uint64 `json:"seed"`
	Requests int    `json:"requests"`
	Errors   int    `json:"errors"`
	// EngineDP lists the engines' DP sizes in this run's order, which the
	// seed shuffles.
	EngineDP    []int   `json:"engine_dp"`
	InputTokens int64   `json:"input_tokens"`
	SavedTokens int64   `json:"saved_tokens"`
	SavedPct    float64 `json:"saved_pct"`
	// TTFT and E2E are in trace seconds, from the replay-time queue model
	// (replayTimes); EngineTTFTMean is what the engines measured on the
	// wall clock, scaled back, as a check of the emulation.
	TTFT           dist    `json:"ttft_s"`
	E2EMean        float64 `json:"e2e_mean_s"`
	EngineTTFTMean float64 `json:"engine_ttft_mean_s"`
	// Busy is each engine's prefill time in trace seconds, a multi-DP
	// engine's ranks averaged; LoadSpread is max/mean over engines.
	Busy              []float64 `json:"busy_s"`
	LoadSpread        float64   `json:"load_spread"`
	RequestsPerEngine []int     `json:"requests_per_engine"`
	DecisionSource    string    `json:"decision_source"`
	DecisionP50Us     float64   `json:"decision_p50_us"`
	DecisionP99Us     float64   `json:"decision_p99_us"`
	// DecisionHTTP is the part of a benchmark-side decision spent in HTTP
	// round trips to kvcar's query API and registry.
	DecisionHTTPP50Us float64 `json:"decision_http_p50_us"`
	DecisionHTTPP99Us float64 `json:"decision_http_p99_us"`
	// LaunchLag is how late requests left against their due wall time:
	// large values mean the machine could not keep up with the speed-up.
	LaunchLagP99Ms float64 `json:"launch_lag_p99_ms"`
	LaunchLagMaxMs float64 `json:"launch_lag_max_ms"`
	WallSeconds    float64 `json:"wall_seconds"`
	// CPU used during the replay by the kvcar process and by this one
	// (the replay, the emulated engines and etcd).
	KvcarCPUSeconds float64 `json:"kvcar_cpu_s"`
	OwnCPUSeconds   float64 `json:"benchmark_cpu_s"`
	// Attempts is how many runs it took to get one the machine did not
	// disturb (disturbed); the last is reported whatever it was.
	Attempts int `json:"attempts"`
	// TrackedAfter is what a router that tracks its requests still holds
	// once every answer is in (tokens + blocks); anything but 0 is a bug.
	TrackedAfter int `json:"tracked_after"`

	records []traceRecord
}

// replayTimes runs the replay-time model over a run's records: each
// engine rank is a FIFO server of prefills in trace time. A request
// arrives at its trace time (the routing decision costs nothing here,
// whatever it took on the wall clock), starts when its rank is free,
// and takes its engine's CostModel prefill of the prompt with the hits
// the engine reported. It fills StartMs, PrefillMs and TTFTMs of the
// served records and returns each engine's busy time in trace ms, a
// rank of a DP-d engine counting 1/d.
func replayTimes(recs []traceRecord, f *fleet) []float64 {
	order := make([]int, 0, len(recs))
	for i := range recs {
		if recs[i].Err == nil && recs[i].Engine >= 0 {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(recs[a].ArrivalMs, recs[b].ArrivalMs) })
	type rank struct{ engine, dp int }
	free := map[rank]float64{}
	busy := make([]float64, len(f.names))
	for _, i := range order {
		r := &recs[i]
		k := rank{r.Engine, r.DPRank}
		r.StartMs = max(r.ArrivalMs, free[k])
		r.PrefillMs = float64(f.costs[r.Engine].Prefill(r.Input, r.DeviceHit, r.HostHit)) / float64(time.Millisecond)
		free[k] = r.StartMs + r.PrefillMs
		r.TTFTMs = free[k] - r.ArrivalMs
		busy[r.Engine] += r.PrefillMs / float64(f.dp[r.Engine])
	}
	return busy
}

// summarizeRun computes a run's result from its records.
func summarizeRun(p tracePolicy, seed uint64, recs []traceRecord, f *fleet, o traceOptions, wall time.Duration, rt router) runResult {
	res := runResult{Policy: p.Name, Seed: seed, EngineDP: f.dp, WallSeconds: wall.Seconds(), records: recs}
	busy := replayTimes(recs, f)
	res.RequestsPerEngine = make([]int, len(f.names))
	var ttft, e2e, engTTFT, decision, httpPart, lag []float64
	for i := range recs {
		r := &recs[i]
		lag = append(lag, float64(r.LaunchLag)/float64(time.Millisecond))
		if r.Err != nil || r.Engine < 0 {
			res.Errors++
			continue
		}
		res.Requests++
		res.RequestsPerEngine[r.Engine]++
		res.InputTokens += int64(r.Input)
		res.SavedTokens += int64(r.DeviceHit + r.HostHit)
		ttft = append(ttft, r.TTFTMs/1000)
		e2e = append(e2e, (r.TTFTMs+float64(max(r.Output-1, 0))*float64(o.Cluster.TPOT)/float64(time.Millisecond))/1000)
		engTTFT = append(engTTFT, r.EngineTTFTMs/1000)
		if r.HasDecision {
			decision = append(decision, float64(r.Decision)/float64(time.Microsecond))
			httpPart = append(httpPart, float64(r.DecisionHTTP)/float64(time.Microsecond))
		}
	}
	res.SavedPct = pct(res.SavedTokens, res.InputTokens)
	res.TTFT, res.E2EMean, res.EngineTTFTMean = distOf(ttft), mean(e2e), mean(engTTFT)
	res.Busy = make([]float64, len(busy))
	var total, most float64
	for i, b := range busy {
		res.Busy[i] = b / 1000
		total += b
		most = max(most, b)
	}
	if total > 0 {
		res.LoadSpread = most / (total / float64(len(busy)))
	}
	switch {
	case !rt.viaKvcar():
		res.DecisionSource = decisionBenchmark
		res.DecisionHTTPP50Us, res.DecisionHTTPP99Us = quantile(httpPart, 0.5), quantile(httpPart, 0.99)
	case len(decision) > 0:
		res.DecisionSource = decisionKvcarHeader
	default:
		res.DecisionSource = decisionNotExposed
	}
	res.DecisionP50Us, res.DecisionP99Us = quantile(decision, 0.5), quantile(decision, 0.99)
	res.LaunchLagP99Ms = quantile(lag, 0.99)
	if len(lag) > 0 {
		res.LaunchLagMaxMs = slices.Max(lag)
	}
	if d, ok := rt.(*dynamoRouter); ok {
		tokens, blocks := d.inFlight()
		res.TrackedAfter = tokens + blocks
	}
	return res
}

// disturbed reports whether the machine could not keep the replay on the
// trace's clock: more than 1 % of the requests left over a second of
// trace time late (a stall of the shared machine, not of the policy).
// Their TTFT does not count the lag, but what the routers saw then was
// not what they would have seen in time.
func (r *runResult) disturbed(speedup float64) bool {
	return r.LaunchLagP99Ms*speedup > 1000
}
