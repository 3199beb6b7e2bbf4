package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/enginesim"
)

// Where a policy's routing decision time comes from.
const (
	decisionFromKvcar  = "kvcar X-Kvcar-Decision-Us header"
	decisionFromGreedy = "in-process pick (engine probes included)"
	decisionNone       = "not reported"
)

// result is one policy's measurements.
type result struct {
	Policy          string `json:"policy"`
	Requests        int    `json:"requests"`
	Errors          int    `json:"errors"`
	PromptTokens    int64  `json:"prompt_tokens"`
	DeviceHitTokens int64  `json:"device_hit_tokens"`
	HostHitTokens   int64  `json:"host_hit_tokens"`
	// SavedTokens = DeviceHitTokens + HostHitTokens: prompt tokens the
	// engines did not recompute, as they reported them.
	SavedTokens int64   `json:"saved_tokens"`
	SavedPct    float64 `json:"saved_pct"`
	// Emulated TTFT: (queue_ms + prefill_ms) / time_scale.
	TTFTP50Ms  float64 `json:"ttft_p50_emulated_ms"`
	TTFTP99Ms  float64 `json:"ttft_p99_emulated_ms"`
	TTFTMeanMs float64 `json:"ttft_mean_emulated_ms"`
	// Wall is from the first send to the last answer.
	WallSeconds    float64 `json:"wall_seconds"`
	RPSWall        float64 `json:"requests_per_second_wall"`
	RPSEmulated    float64 `json:"requests_per_second_emulated"`
	DecisionSource string  `json:"decision_source"`
	DecisionP50Us  float64 `json:"decision_p50_us"`
	DecisionP99Us  float64 `json:"decision_p99_us"`
	// Overhead is the client-observed round trip minus the engine's own
	// queue, prefill and decode time: HTTP, JSON and, through kvcar, the
	// extra hop and the routing decision.
	OverheadP50Us float64 `json:"overhead_p50_us"`
	OverheadP99Us float64 `json:"overhead_p99_us"`

	// BestAvailableTokens adds up, per request, the longest reusable
	// prefix any rank held just before it was sent; SavedTokens over it
	// is how much of what was there the routing got.
	BestAvailableTokens int64   `json:"best_available_tokens"`
	RoutingEfficiency   float64 `json:"routing_efficiency"`
	// Where the difference went, in tokens, request by request:
	// LostOtherInstance: the chosen instance held less on every rank than
	// the best rank elsewhere; LostBehindDPMin is the part of it where
	// the best was on a multi-DP instance whose other rank lacked it (the
	// DP minimum rule hides such prefixes); LostDPRank: the chosen
	// instance had it, on a rank the engine did not pick; LostInFlight:
	// the serving rank held more at probe time than the engine reused
	// (evicted, or the probe and the prefill raced).
	LostOtherInstance int64 `json:"lost_other_instance_tokens"`
	LostBehindDPMin   int64 `json:"lost_behind_dp_min_tokens"`
	LostDPRank        int64 `json:"lost_dp_rank_tokens"`
	LostInFlight      int64 `json:"lost_in_flight_tokens"`

	Instances []instanceShare `json:"instances"`
	// EngineStatsMatch: the engines' own counters agree with the sums of
	// the answers.
	EngineStatsMatch bool `json:"engine_stats_match"`
}

// instanceShare is what one instance served.
type instanceShare struct {
	// Engine is the engine's position in --engines; Instance its
	// address in this run.
	Engine       int    `json:"engine"`
	Instance     string `json:"instance"`
	DPSize       int    `json:"dp_size"`
	HostTier     bool   `json:"host_tier"`
	Requests     int    `json:"requests"`
	PromptTokens int64  `json:"prompt_tokens"`
	SavedTokens  int64  `json:"saved_tokens"`
}

// summarize computes a policy's result from its records and the
// engines' counters.
func summarize(policy string, recs []record, wall time.Duration, engines []*enginesim.Engine, hostEngines int) result {
	r := result{Policy: policy, DecisionSource: decisionNone}
	if isGreedy(policy) {
		r.DecisionSource = decisionFromGreedy
	}
	dpOf := map[string]int{}
	idx := map[string]int{}
	host := map[string]bool{}
	for i, e := range engines {
		dpOf[e.Name()] = e.DPSize()
		idx[e.Name()] = i
		host[e.Name()] = i < hostEngines
	}
	shares := map[string]*instanceShare{}
	var ttft, decision, overhead []float64
	var scale float64
	for i := range recs {
		rec := &recs[i]
		if rec.Err != nil || rec.Instance == "" {
			r.Errors++
			continue
		}
		r.Requests++
		r.PromptTokens += int64(rec.Prompt)
		r.DeviceHitTokens += int64(rec.DeviceHit)
		r.HostHitTokens += int64(rec.HostHit)
		scale = rec.TimeScale
		ttft = append(ttft, (rec.QueueMs+rec.PrefillMs)/rec.TimeScale)
		if rec.HasDecision {
			decision = append(decision, float64(rec.Decision)/float64(time.Microsecond))
			if r.DecisionSource == decisionNone {
				r.DecisionSource = decisionFromKvcar
			}
		}
		overhead = append(overhead, float64(rec.Latency-rec.engineTime())/float64(time.Microsecond))
		sh := shares[rec.Instance]
		if sh == nil {
			sh = &instanceShare{Engine: idx[rec.Instance], Instance: rec.Instance, DPSize: dpOf[rec.Instance], HostTier: host[rec.Instance]}
			shares[rec.Instance] = sh
		}
		sh.Requests++
		sh.PromptTokens += int64(rec.Prompt)
		sh.SavedTokens += int64(rec.saved())
		r.attribute(rec, idx)
	}
	r.SavedTokens = r.DeviceHitTokens + r.HostHitTokens
	r.SavedPct = pct(r.SavedTokens, r.PromptTokens)
	if r.BestAvailableTokens > 0 {
		r.RoutingEfficiency = float64(r.SavedTokens) / float64(r.BestAvailableTokens)
	}
	r.TTFTP50Ms, r.TTFTP99Ms, r.TTFTMeanMs = quantile(ttft, 0.5), quantile(ttft, 0.99), mean(ttft)
	r.DecisionP50Us, r.DecisionP99Us = quantile(decision, 0.5), quantile(decision, 0.99)
	r.OverheadP50Us, r.OverheadP99Us = quantile(overhead, 0.5), quantile(overhead, 0.99)
	r.WallSeconds = wall.Seconds()
	if wall > 0 {
		r.RPSWall = float64(r.Requests) / wall.Seconds()
		r.RPSEmulated = r.RPSWall * scale
	}
	for _, sh := range shares {
		r.Instances = append(r.Instances, *sh)
	}
	slices.SortFunc(r.Instances, func(a, b instanceShare) int { return cmp.Compare(a.Engine, b.Engine) })

	var st enginesim.EngineStats
	for _, e := range engines {
		s := e.Stats()
		st.Requests += s.Requests
		st.PromptTokens += s.PromptTokens
		st.DeviceHitTokens += s.DeviceHitTokens
		st.HostHitTokens += s.HostHitTokens
	}
	r.EngineStatsMatch = r.Errors == 0 && st.Requests == uint64(r.Requests) && st.PromptTokens == uint64(r.PromptTokens) &&
		st.DeviceHitTokens == uint64(r.DeviceHitTokens) && st.HostHitTokens == uint64(r.HostHitTokens)
	return r
}

// attribute adds one request's best available prefix and where what the
// engine did not reuse of it went.
func (r *result) attribute(rec *record, idx map[string]int) {
	if rec.Probe == nil {
		return
	}
	best, bestAt := 0, -1
	for i, ranks := range rec.Probe {
		for _, h := range ranks {
			if h > best {
				best, bestAt = h, i
			}
		}
	}
	r.BestAvailableTokens += int64(best)
	saved := rec.saved()
	if saved >= best {
		return
	}
	lost := int64(best - saved)
	ci, ok := idx[rec.Instance]
	if !ok || rec.DPRank < 0 || rec.DPRank >= len(rec.Probe[ci]) {
		r.LostOtherInstance += lost
		return
	}
	chosen := rec.Probe[ci]
	switch {
	case slices.Max(chosen) < best:
		r.LostOtherInstance += lost
		if ranks := rec.Probe[bestAt]; len(ranks) > 1 && slices.Min(ranks) < best {
			r.LostBehindDPMin += lost
		}
	case chosen[rec.DPRank] < best:
		r.LostDPRank += lost
	default:
		r.LostInFlight += lost
	}
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// ratios compares CAR's saved tokens with LONGEST_PREFIX's and RR's.
type ratios struct {
	CAROverLongest *float64 `json:"car_over_longest_prefix,omitempty"`
	CAROverRR      *float64 `json:"car_over_rr,omitempty"`
}

func computeRatios(rs []result) ratios {
	saved := map[string]int64{}
	for _, r := range rs {
		saved[r.Policy] = r.SavedTokens
	}
	var out ratios
	div := func(a, b string) *float64 {
		x, okA := saved[a]
		y, okB := saved[b]
		if !okA || !okB || y == 0 {
			return nil
		}
		v := float64(x) / float64(y)
		return &v
	}
	out.CAROverLongest = div(policyCAR, policyLongest)
	out.CAROverRR = div(policyCAR, policyRR)
	return out
}

// writeMarkdown prints the tables for the README.
func writeMarkdown(w io.Writer, rep *report) {
	fmt.Fprintf(w, "| policy | requests | prompt tokens | prefill tokens saved | saved %% | TTFT p50 / p99 (emulated ms) | req/s wall / emulated | routing decision p50 / p99 (µs) | client overhead p50 / p99 (µs) |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Results {
		dec := "—"
		if r.DecisionSource != decisionNone {
			dec = fmt.Sprintf("%.0f / %.0f", r.DecisionP50Us, r.DecisionP99Us)
		}
		errs := ""
		if r.Errors > 0 {
			errs = fmt.Sprintf(" (+%d failed)", r.Errors)
		}
		fmt.Fprintf(w, "| %s | %d%s | %d | %d | %.1f%% | %.0f / %.0f | %.1f / %.2f | %s | %.0f / %.0f |\n",
			r.Policy, r.Requests, errs, r.PromptTokens, r.SavedTokens, r.SavedPct, r.TTFTP50Ms, r.TTFTP99Ms,
			r.RPSWall, r.RPSEmulated, dec, r.OverheadP50Us, r.OverheadP99Us)
	}
	fmt.Fprintf(w, "| one unbounded cache shared by all, every request in order (bound) | %d | %d | %d | %.1f%% | — | — | — | — |\n",
		rep.Workload.Requests, rep.Workload.PromptTokens, rep.Workload.IdealReuseTokens,
		pct(rep.Workload.IdealReuseTokens, rep.Workload.PromptTokens))
	fmt.Fprintln(w)
	if v := rep.Ratios.CAROverLongest; v != nil {
		fmt.Fprintf(w, "CAR / LONGEST_PREFIX saved prefill tokens: %.3f\n", *v)
	}
	if v := rep.Ratios.CAROverRR; v != nil {
		fmt.Fprintf(w, "CAR / RR saved prefill tokens: %.2f×\n", *v)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| policy | best prefix available at send time (tokens) | saved / available | lost: another instance (of which behind DP min) | lost: other DP rank | lost: changed in flight |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s | %d | %.1f%% | %d (%d) | %d | %d |\n", r.Policy, r.BestAvailableTokens,
			100*r.RoutingEfficiency, r.LostOtherInstance, r.LostBehindDPMin, r.LostDPRank, r.LostInFlight)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| policy | requests per engine, and the share of its prompt tokens saved |\n|---|---|\n")
	for _, r := range rep.Results {
		var parts []string
		for _, s := range r.Instances {
			tier := ""
			if s.HostTier {
				tier = "+host"
			}
			parts = append(parts, fmt.Sprintf("e%d (DP %d%s): %d, %.0f%%", s.Engine, s.DPSize, tier, s.Requests, pct(s.SavedTokens, s.PromptTokens)))
		}
		fmt.Fprintf(w, "| %s | %s |\n", r.Policy, strings.Join(parts, "; "))
	}
	fmt.Fprintln(w)
	if rep.DecisionNote != "" {
		fmt.Fprintln(w, rep.DecisionNote)
	}
	fmt.Fprintf(w, "\nreproduce: %s\n", rep.Command)
}
