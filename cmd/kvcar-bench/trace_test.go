package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvcar/kvcar/internal/devcluster"
)

// traceSlice writes the first n requests of the conversation trace to a
// file of the test's own.
func traceSlice(t *testing.T, n int) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "traces", "mooncake_conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, maxTraceLineBytes)
	for i := 0; i < n && sc.Scan(); i++ {
		b.Write(sc.Bytes())
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "slice.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTraceReplayEndToEnd replays a slice of the conversation trace
// through the real kvcar binary to two emulated engines (one with two DP
// ranks) with every kind of policy, and checks that the report adds up:
// every request answered once, saved tokens within the shared unbounded
// bound, whole blocks, requests per engine summing to the total, TTFT
// quantiles in order and at least the prefill, and the Dynamo router's
// tracking back to zero.
func TestTraceReplayEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvcar and runs it as a process")
	}
	const requests = 60
	path := traceSlice(t, requests)
	bin, err := devcluster.BuildKVCar(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out, progress bytes.Buffer
	args := []string{
		"--trace=" + path, "--kvcar=" + bin, "--engines=1,2", "--capacity_tokens=65536", "--token_scale=8",
		"--speedup=50", "--seeds=2", "--parallel=2", "--policies=RANDOM,RR,CAR@0.5,LLMD,DYNAMO", "--json",
	}
	if err := run(t.Context(), args, &out, &progress); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var rep traceReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Window.Requests != requests || rep.Bound.Requests != requests || len(rep.Runs) != 10 {
		t.Fatalf("window %d requests, bound over %d, %d runs", rep.Window.Requests, rep.Bound.Requests, len(rep.Runs))
	}
	if rep.Bound.SavedTokens <= 0 || rep.Pooled.SavedTokens > rep.Bound.SavedTokens {
		t.Fatalf("bound saves %d tokens, pooled reference %d", rep.Bound.SavedTokens, rep.Pooled.SavedTokens)
	}
	seen := map[string]int{}
	for _, r := range rep.Runs {
		seen[r.Policy]++
		name := fmt.Sprintf("%s seed %d", r.Policy, r.Seed)
		if r.Requests != requests || r.Errors != 0 || r.InputTokens != rep.Bound.InputTokens {
			t.Fatalf("%s: %d requests, %d errors, %d input tokens (window %d)", name, r.Requests, r.Errors, r.InputTokens, rep.Bound.InputTokens)
		}
		if r.SavedTokens < 0 || r.SavedTokens > rep.Bound.SavedTokens || r.SavedTokens%TraceBlockTokens != 0 {
			t.Fatalf("%s: saved %d tokens, the bound %d", name, r.SavedTokens, rep.Bound.SavedTokens)
		}
		if len(r.EngineDP) != 2 || r.EngineDP[0]+r.EngineDP[1] != 3 || len(r.RequestsPerEngine) != 2 ||
			r.RequestsPerEngine[0]+r.RequestsPerEngine[1] != requests {
			t.Fatalf("%s: engines %v served %v", name, r.EngineDP, r.RequestsPerEngine)
		}
		if !(r.TTFT.P50 > 0 && r.TTFT.P50 <= r.TTFT.P90 && r.TTFT.P90 <= r.TTFT.P99 && r.TTFT.Mean > 0 && r.E2EMean > r.TTFT.Mean) {
			t.Fatalf("%s: TTFT %+v, end to end %v", name, r.TTFT, r.E2EMean)
		}
		if r.LoadSpread < 1 || r.Busy[0]+r.Busy[1] <= 0 || r.EngineTTFTMean <= 0 {
			t.Fatalf("%s: load spread %v, busy %v, engine TTFT %v", name, r.LoadSpread, r.Busy, r.EngineTTFTMean)
		}
		if r.TrackedAfter != 0 {
			t.Fatalf("%s: the router still tracks %d tokens and blocks after every answer", name, r.TrackedAfter)
		}
		switch {
		case r.Policy == tpLLMD || r.Policy == tpDynamo:
			if r.DecisionSource != decisionBenchmark || r.DecisionHTTPP50Us <= 0 || r.DecisionHTTPP50Us > r.DecisionP50Us*1.0001+1 {
				t.Fatalf("%s: decision %q %v µs, of which HTTP %v µs", name, r.DecisionSource, r.DecisionP50Us, r.DecisionHTTPP50Us)
			}
		case r.Policy == tpRR || strings.HasPrefix(r.Policy, tpCARPrefix):
			if r.DecisionSource != decisionKvcarHeader && r.DecisionSource != decisionNotExposed {
				t.Fatalf("%s: decision from %q", name, r.DecisionSource)
			}
		}
	}
	for _, p := range []string{tpRandom, tpRR, "CAR@0.5", tpLLMD, tpDynamo} {
		if seen[p] != 2 {
			t.Fatalf("%s ran %d times, want 2", p, seen[p])
		}
	}
	// The binary is stamped with the working tree's revision, which this
	// unstamped program also reports: one commit.
	if rep.KVCarRevision != devcluster.Revision() || rep.Revision != devcluster.Revision() {
		t.Fatalf("revisions: kvcar %q, driver %q; want both %q", rep.KVCarRevision, rep.Revision, devcluster.Revision())
	}
	// The tables print from the same report.
	var md bytes.Buffer
	writeTraceReadme(&md, &rep)
	for _, want := range []string{"| shared unbounded cache (bound) |", "| DYNAMO |", "mean TTFT / RR's", "bin/kvcar-bench --trace=",
		"Generated ", " from commit " + rep.Revision + " in "} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("README section lacks %q:\n%s", want, md.String())
		}
	}
}

// Accounting suffixes turn kvcar's accounting flags on for CAR
// policies only, and the pending timeout is passed in wall time.
func TestTracePolicyAccountingSuffixes(t *testing.T) {
	p, err := parseTracePolicy("CAR@0.5+acct+pend")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(p.kvcarFlags(250*time.Millisecond), " ")
	want := "--car_prefill_lambda=0.5 --car_dispatch_accounting --car_pending_prefixes --car_pending_prefix_timeout_ms=250"
	if p.Name != "CAR@0.5+acct+pend" || p.KvcarPolicy != "CAR" || got != want {
		t.Fatalf("policy %+v flags %q, want %q", p, got, want)
	}
	p, err = parseTracePolicy("LEAST_QUEUE+tok")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(p.kvcarFlags(time.Second), " "); got != "--car_prefill_lambda=0 --car_dispatch_accounting --car_dispatch_token_weight=0.5" {
		t.Fatalf("LEAST_QUEUE+tok flags %q", got)
	}
	for _, bad := range []string{"RR+acct", "DYNAMO+pend", "CAR@0.5+nope", "CAR@0.5+"} {
		if _, err := parseTracePolicy(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
