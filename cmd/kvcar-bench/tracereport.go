package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
)

// byPolicy groups the runs of every policy, in the order given.
func byPolicy(rep *traceReport) [][]*runResult {
	var out [][]*runResult
	for _, p := range rep.Options.Policies {
		var rs []*runResult
		for i := range rep.Runs {
			if rep.Runs[i].Policy == p.Name {
				rs = append(rs, &rep.Runs[i])
			}
		}
		if len(rs) > 0 {
			out = append(out, rs)
		}
	}
	return out
}

// spread is a value over seeds: its mean and range.
type spread struct{ mean, lo, hi float64 }

func spreadOf(rs []*runResult, f func(*runResult) float64) spread {
	vals := make([]float64, len(rs))
	for i, r := range rs {
		vals[i] = f(r)
	}
	return spreadOfValues(vals)
}

func spreadOfValues(vals []float64) spread {
	s := spread{lo: vals[0], hi: vals[0]}
	for _, v := range vals {
		s.mean += v / float64(len(vals))
		s.lo, s.hi = min(s.lo, v), max(s.hi, v)
	}
	return s
}

// format writes the mean and, over several seeds, the range.
func (s spread) format(prec int) string {
	m := strconv.FormatFloat(s.mean, 'f', prec, 64)
	if s.lo == s.hi {
		return m
	}
	return m + " (" + strconv.FormatFloat(s.lo, 'f', prec, 64) + "–" + strconv.FormatFloat(s.hi, 'f', prec, 64) + ")"
}

// pairedRatio is num's value over den's, seed by seed, for the seeds
// both ran.
func pairedRatio(num, den []*runResult, f func(*runResult) float64) (spread, bool) {
	var ratios []float64
	for _, a := range num {
		for _, b := range den {
			if a.Seed == b.Seed && f(b) > 0 {
				ratios = append(ratios, f(a)/f(b))
			}
		}
	}
	if len(ratios) == 0 {
		return spread{}, false
	}
	return spreadOfValues(ratios), true
}

func runsOf(groups [][]*runResult, name string) []*runResult {
	for _, g := range groups {
		if g[0].Policy == name {
			return g
		}
	}
	return nil
}

// writeTraceTables prints the results as Markdown tables.
func writeTraceTables(w io.Writer, rep *traceReport) {
	groups := byPolicy(rep)
	seeds := rep.Options.Seeds
	fmt.Fprintf(w, "| policy | saved prefill, %% of input | TTFT mean (s) | TTFT p50 | TTFT p90 | TTFT p99 | end-to-end mean (s) | load spread max/mean | decision p50 / p99 (µs) | failed |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(w, "| shared unbounded cache (bound) | %.1f | — | — | — | — | — | — | — | — |\n", rep.Bound.savedPct())
	fmt.Fprintf(w, "| pooled capacity, one LRU (reference) | %.1f | — | — | — | — | — | — | — | — |\n", rep.Pooled.savedPct())
	for _, g := range groups {
		dec := "—"
		if g[0].DecisionSource != decisionNotExposed {
			dec = spreadOf(g, func(r *runResult) float64 { return r.DecisionP50Us }).format(0) + " / " +
				spreadOf(g, func(r *runResult) float64 { return r.DecisionP99Us }).format(0)
		}
		failed := 0
		for _, r := range g {
			failed += r.Errors
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", g[0].Policy,
			spreadOf(g, func(r *runResult) float64 { return r.SavedPct }).format(1),
			spreadOf(g, func(r *runResult) float64 { return r.TTFT.Mean }).format(2),
			spreadOf(g, func(r *runResult) float64 { return r.TTFT.P50 }).format(2),
			spreadOf(g, func(r *runResult) float64 { return r.TTFT.P90 }).format(2),
			spreadOf(g, func(r *runResult) float64 { return r.TTFT.P99 }).format(1),
			spreadOf(g, func(r *runResult) float64 { return r.E2EMean }).format(1),
			spreadOf(g, func(r *runResult) float64 { return r.LoadSpread }).format(2),
			dec, failed)
	}
	fmt.Fprintf(w, "\nEach cell: mean over %d seed(s), (min–max) when they differ. Saved prefill is what the engines reported reusing.\n\n", seeds)
	writeGoals(w, rep, groups)
	writeChecks(w, rep, groups)
}

// writeGoals compares every CAR λ with the goals of issue 14, seed by
// seed.
func writeGoals(w io.Writer, rep *traceReport, groups [][]*runResult) {
	var cars [][]*runResult
	for _, g := range groups {
		if strings.HasPrefix(g[0].Policy, tpCARPrefix) {
			cars = append(cars, g)
		}
	}
	if len(cars) == 0 {
		return
	}
	fmt.Fprintf(w, "| goal |")
	for _, c := range cars {
		fmt.Fprintf(w, " %s |", c[0].Policy)
	}
	fmt.Fprintf(w, "\n|---|")
	for range cars {
		fmt.Fprintf(w, "---:|")
	}
	fmt.Fprintln(w)
	ttft := func(r *runResult) float64 { return r.TTFT.Mean }
	row := func(label string, goal func(float64) bool, cell func(c []*runResult) (spread, bool)) {
		fmt.Fprintf(w, "| %s |", label)
		for _, c := range cars {
			s, ok := cell(c)
			if !ok {
				fmt.Fprintf(w, " — |")
				continue
			}
			verdict := "not met"
			if goal(s.mean) {
				verdict = "met"
			}
			fmt.Fprintf(w, " %s %s |", s.format(2), verdict)
		}
		fmt.Fprintln(w)
	}
	if rr := runsOf(groups, tpRR); rr != nil {
		row("mean TTFT / RR's, ≤ 0.60", func(v float64) bool { return v <= 0.6 },
			func(c []*runResult) (spread, bool) { return pairedRatio(c, rr, ttft) })
	}
	for _, peer := range []string{tpLLMD, tpDynamo, tpLeastQueue, tpRandom} {
		if pr := runsOf(groups, peer); pr != nil {
			row("mean TTFT / "+peer+"'s, ≤ 1", func(v float64) bool { return v <= 1 },
				func(c []*runResult) (spread, bool) { return pairedRatio(c, pr, ttft) })
		}
	}
	if rep.Pooled.SavedTokens > 0 {
		row("saved / pooled reference's, ≥ 0.85", func(v float64) bool { return v >= 0.85 },
			func(c []*runResult) (spread, bool) {
				return spreadOf(c, func(r *runResult) float64 { return r.SavedPct / rep.Pooled.savedPct() }), true
			})
	}
	if lq := runsOf(groups, tpLeastQueue); lq != nil {
		row("p99 TTFT / LEAST_QUEUE's, ≤ 1", func(v float64) bool { return v <= 1 },
			func(c []*runResult) (spread, bool) {
				return pairedRatio(c, lq, func(r *runResult) float64 { return r.TTFT.P99 })
			})
	}
	fmt.Fprintf(w, "\nRatios are taken seed by seed (same engine order and arrivals), then averaged; \"met\" judges the mean.\n\n")
}

// writeChecks prints what shows whether the replay itself was sound.
func writeChecks(w io.Writer, rep *traceReport, groups [][]*runResult) {
	fmt.Fprintf(w, "| policy | decision time from | of which HTTP to kvcar, p50 / p99 (µs) | engine-measured TTFT mean (s) | launch lag p99 / max (ms) | runs repeated (still disturbed) | wall per run (s) |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|\n")
	for _, g := range groups {
		httpPart := "—"
		if g[0].DecisionSource == decisionBenchmark && g[0].Policy != tpRandom {
			httpPart = spreadOf(g, func(r *runResult) float64 { return r.DecisionHTTPP50Us }).format(0) + " / " +
				spreadOf(g, func(r *runResult) float64 { return r.DecisionHTTPP99Us }).format(0)
		}
		repeated, disturbed := 0, 0
		for _, r := range g {
			repeated += max(r.Attempts-1, 0)
			if r.disturbed(rep.Options.Speedup) {
				disturbed++
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s / %s | %d (%d) | %s |\n", g[0].Policy, g[0].DecisionSource, httpPart,
			spreadOf(g, func(r *runResult) float64 { return r.EngineTTFTMean }).format(2),
			spreadOf(g, func(r *runResult) float64 { return r.LaunchLagP99Ms }).format(1),
			spreadOf(g, func(r *runResult) float64 { return r.LaunchLagMaxMs }).format(0),
			repeated, disturbed,
			spreadOf(g, func(r *runResult) float64 { return r.WallSeconds }).format(1))
	}
	fmt.Fprintf(w, "\nA run is repeated (at most %d runs in all) when requests failed or more than 1 %% of them left over 1 s of trace time late: the shared machine stalled.\n\n", maxAttempts)
}

// writeTraceReadme prints the README section: what was run, where and
// when, then the tables.
func writeTraceReadme(w io.Writer, rep *traceReport) {
	o, win, c := rep.Options, rep.Window, rep.Options.Cluster
	fmt.Fprintf(w, "Generated %s from %s in %.0f min by\n\n```sh\n%s\n```\n\n",
		rep.Started.Format("2006-01-02 15:04 UTC"), devcluster.Revisions{KVCar: rep.KVCarRevision, Driver: rep.Revision}, rep.Elapsed/60, rep.Command)
	headers := "kvcar has no --" + exposeHeadersFlag + " flag and sends its decision-time header unasked"
	if rep.RoutingHeaders {
		headers = "kvcar ran with --" + exposeHeadersFlag + " for its decision-time header"
	}
	fmt.Fprintf(w, "Trace `%s`: %d requests arriving in [%s, %s) of its clock (mean input %.0f tokens, mean output %.0f), "+
		"replayed %g× faster than recorded (%.0f s a run), each hash id as %d token ids (--token_scale=%d); "+
		"%d engines with DP sizes %s in an order the seed shuffles, %d KV tokens each (%d blocks of 512 trace tokens per DP-1 engine), "+
		"prefill %v per token + %v per token per 1,024 tokens of context per engine, a DP rank of a DP-d engine 1/d of that engine; "+
		"loads reported every %v of trace time; %d seed(s) per policy, %d run(s) at once; %s.\n\n",
		o.Trace, win.Requests, o.Start, o.Start+time.Duration(win.TraceSeconds*float64(time.Second)), win.MeanInput, win.MeanOutput,
		o.Speedup, win.WallSeconds, c.perBlock(), c.TokenScale, len(c.EngineDP), intsString(c.EngineDP), c.CapacityTokens, c.rankBlocks(1),
		c.PrefillPerToken, c.AttentionPer1K, c.Heartbeat, o.Seeds, o.Parallel, headers)
	writeTraceTables(w, rep)
}

func intsString(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// recordsCSV writes every request of every run, one line each.
type recordsCSV struct {
	f *os.File
	w *bufio.Writer
}

const recordsHeader = "policy,seed,index,line,arrival_ms,input,output,engine,engine_dp,dp_rank,device_hit,host_hit," +
	"start_ms,prefill_ms,ttft_ms,engine_ttft_ms,decision_us,decision_http_us,launch_lag_us,error\n"

func newRecordsCSV(path string) (*recordsCSV, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("records: %w", err)
	}
	c := &recordsCSV{f: f, w: bufio.NewWriter(f)}
	if _, err := c.w.WriteString(recordsHeader); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("records: %w", err)
	}
	return c, nil
}

func (c *recordsCSV) write(res runResult) error {
	recs := slices.Clone(res.records)
	for i := range recs {
		r := &recs[i]
		errText, dp := "", 0
		if r.Err != nil {
			errText = strconv.Quote(r.Err.Error())
		}
		if r.Engine >= 0 {
			dp = res.EngineDP[r.Engine]
		}
		_, err := fmt.Fprintf(c.w, "%s,%d,%d,%d,%.3f,%d,%d,%d,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%d,%d,%d,%s\n",
			res.Policy, res.Seed, r.Index, r.Line, r.ArrivalMs, r.Input, r.Output, r.Engine, dp, r.DPRank, r.DeviceHit, r.HostHit,
			r.StartMs, r.PrefillMs, r.TTFTMs, r.EngineTTFTMs, r.Decision.Microseconds(), r.DecisionHTTP.Microseconds(),
			r.LaunchLag.Microseconds(), errText)
		if err != nil {
			return fmt.Errorf("records: %w", err)
		}
	}
	if err := c.w.Flush(); err != nil {
		return fmt.Errorf("records: %w", err)
	}
	return nil
}

func (c *recordsCSV) close() { _ = c.f.Close() }
