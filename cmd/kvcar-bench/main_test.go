package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func tinyWorkload(seed uint64) workloadConfig {
	return workloadConfig{
		Seed: seed, Systems: 2, SystemTokens: tokenRange{64, 96}, Sessions: 4,
		UserTokens: tokenRange{16, 48}, AnswerTokens: tokenRange{4, 8}, Requests: 24, MaxPromptTokens: 320,
	}
}

func TestWorkloadDeterministicAndSessionsGrow(t *testing.T) {
	cfg := tinyWorkload(7)
	a, err := generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.requests {
		if !slices.Equal(a.requests[i].Prompt, b.requests[i].Prompt) || a.requests[i].Session != b.requests[i].Session ||
			a.requests[i].MaxTokens != b.requests[i].MaxTokens {
			t.Fatalf("request %d differs between two generations with the same seed", i)
		}
	}
	cfg.Seed = 8
	c, err := generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(a.requests[0].Prompt, c.requests[0].Prompt) {
		t.Fatal("seeds 7 and 8 gave the same first prompt")
	}

	lastOf := map[int]int{} // conversation -> its latest request
	restarts := 0
	for i, r := range a.requests {
		if len(r.Prompt) > cfg.MaxPromptTokens {
			t.Fatalf("request %d: %d tokens, over the maximum %d", i, len(r.Prompt), cfg.MaxPromptTokens)
		}
		for _, tok := range r.Prompt {
			if tok >= vocabSize {
				t.Fatalf("request %d: token %d out of range", i, tok)
			}
		}
		if !slices.Equal(r.Prompt[:len(a.systems[r.System])], a.systems[r.System]) {
			t.Fatalf("request %d does not start with its system prompt %d", i, r.System)
		}
		if r.Prev >= 0 && a.requests[r.Prev].Session != r.Session {
			t.Fatalf("request %d: previous request %d is of another session", i, r.Prev)
		}
		prev, ok := lastOf[r.Conv]
		switch {
		case !ok && r.Turn != 0:
			t.Fatalf("request %d opens conversation %d at turn %d", i, r.Conv, r.Turn)
		case !ok:
			if r.Prev >= 0 {
				restarts++
			}
		default:
			p := a.requests[prev]
			if prev != r.Prev || r.Turn != p.Turn+1 {
				t.Fatalf("request %d: turn %d follows request %d (turn %d), want its session's previous", i, r.Turn, prev, p.Turn)
			}
			// The prompt extends the previous prompt by its answer and
			// the new user part.
			grow := len(r.Prompt) - len(p.Prompt) - p.MaxTokens
			if !slices.Equal(r.Prompt[:len(p.Prompt)], p.Prompt) || grow < cfg.UserTokens.lo || grow > cfg.UserTokens.hi {
				t.Fatalf("request %d does not extend request %d by its answer and %d..%d user tokens (grew %d)",
					i, prev, cfg.UserTokens.lo, cfg.UserTokens.hi, grow)
			}
		}
		lastOf[r.Conv] = i
	}
	if len(lastOf) == cfg.Sessions || restarts == 0 {
		t.Fatalf("%d conversations, %d restarts: the maximum prompt length should have restarted some", len(lastOf), restarts)
	}
	if got, ideal := a.promptTokens(), a.idealReuse(16); ideal <= 0 || ideal >= got {
		t.Fatalf("ideal reuse %d of %d prompt tokens", ideal, got)
	}
}

// TestDriveOrderAndConcurrency checks the load generator alone: a
// session's requests go in order, each after the previous one has been
// answered, and no more than the clients are in flight.
func TestDriveOrderAndConcurrency(t *testing.T) {
	cfg := tinyWorkload(3)
	cfg.Requests = 60
	w, err := generate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []loadMode{{Concurrency: 3}, {Rate: 2000}} {
		mode.Seed, mode.Timeout, mode.MaxErrors = 1, 10*time.Second, 1
		var (
			mu       sync.Mutex
			inFlight int
			peak     int
			done     = make([]bool, len(w.requests))
			bad      []string
		)
		send := func(ctx context.Context, req *benchRequest) record {
			mu.Lock()
			inFlight++
			peak = max(peak, inFlight)
			if req.Prev >= 0 && !done[req.Prev] {
				bad = append(bad, "request sent before its session's previous one was answered")
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			inFlight--
			done[req.Index] = true
			mu.Unlock()
			return record{Index: req.Index, Session: req.Session, Instance: "x"}
		}
		recs, wall, err := drive(context.Background(), w, mode, send)
		if err != nil {
			t.Fatal(err)
		}
		if len(bad) > 0 {
			t.Fatal(bad[0])
		}
		if mode.Concurrency > 0 && peak > mode.Concurrency {
			t.Fatalf("%d requests in flight with %d clients", peak, mode.Concurrency)
		}
		for i, r := range recs {
			if r.Index != i || r.Instance != "x" {
				t.Fatalf("record %d missing", i)
			}
		}
		if wall <= 0 {
			t.Fatal("no wall time")
		}
	}
}

// TestLongestPrefixEndToEnd runs the LONGEST_PREFIX policies on two tiny engines over
// HTTP, no kvcar needed, and checks the report's consistency.
func TestLongestPrefixEndToEnd(t *testing.T) {
	o, err := parseFlags([]string{
		"--policies=LONGEST_PREFIX,LONGEST_PREFIX_MAX", "--seed=5", "--engines=1,2", "--device_blocks=48", "--host_blocks=32",
		"--systems=2", "--system_tokens=64-96", "--sessions=4", "--user_tokens=16-48", "--answer_tokens=4-8",
		"--requests=24", "--max_prompt_tokens=320", "--concurrency=2", "--time_scale=0.01", "--run_timeout=20s",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	wl, err := generate(o.workload)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := bench(context.Background(), o, wl, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Requests != o.workload.Requests || r.Errors != 0 {
			t.Fatalf("%s: %d requests, %d errors", r.Policy, r.Requests, r.Errors)
		}
		if r.PromptTokens != wl.promptTokens() {
			t.Fatalf("%s: %d prompt tokens, the workload has %d", r.Policy, r.PromptTokens, wl.promptTokens())
		}
		if r.SavedTokens <= 0 || r.SavedTokens != r.DeviceHitTokens+r.HostHitTokens || r.SavedTokens > r.PromptTokens {
			t.Fatalf("%s: saved %d = device %d + host %d of %d", r.Policy, r.SavedTokens, r.DeviceHitTokens, r.HostHitTokens, r.PromptTokens)
		}
		if want := 100 * float64(r.SavedTokens) / float64(r.PromptTokens); r.SavedPct != want {
			t.Fatalf("%s: saved %.3f%%, want %.3f%%", r.Policy, r.SavedPct, want)
		}
		if !r.EngineStatsMatch {
			t.Fatalf("%s: the engines' counters disagree with the answers", r.Policy)
		}
		if r.TTFTP50Ms <= 0 || r.TTFTP50Ms > r.TTFTP99Ms || r.RPSWall <= 0 || r.RPSEmulated >= r.RPSWall {
			t.Fatalf("%s: TTFT %v/%v ms, %v req/s wall, %v emulated", r.Policy, r.TTFTP50Ms, r.TTFTP99Ms, r.RPSWall, r.RPSEmulated)
		}
		if r.DecisionSource != decisionFromGreedy || r.DecisionP50Us <= 0 || r.DecisionP50Us > r.DecisionP99Us {
			t.Fatalf("%s: decision %q %v/%v µs", r.Policy, r.DecisionSource, r.DecisionP50Us, r.DecisionP99Us)
		}
		lost := r.LostOtherInstance + r.LostDPRank + r.LostInFlight
		if r.BestAvailableTokens <= 0 || lost < r.BestAvailableTokens-r.SavedTokens || r.LostBehindDPMin > r.LostOtherInstance {
			t.Fatalf("%s: best %d, saved %d, lost %d (%d behind DP min of %d elsewhere)", r.Policy,
				r.BestAvailableTokens, r.SavedTokens, lost, r.LostBehindDPMin, r.LostOtherInstance)
		}
		var reqs int
		var prompt, saved int64
		for _, s := range r.Instances {
			reqs, prompt, saved = reqs+s.Requests, prompt+s.PromptTokens, saved+s.SavedTokens
		}
		if reqs != r.Requests || prompt != r.PromptTokens || saved != r.SavedTokens {
			t.Fatalf("%s: instance shares add up to %d requests, %d prompt and %d saved tokens", r.Policy, reqs, prompt, saved)
		}
	}

	var md bytes.Buffer
	writeMarkdown(&md, rep)
	for _, want := range []string{"| LONGEST_PREFIX | 24 |", "| LONGEST_PREFIX_MAX | 24 |", "--policies=LONGEST_PREFIX,LONGEST_PREFIX_MAX", "(bound) | 24 |", "--seed=5", "reproduce: bin/kvcar-bench "} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("Markdown lacks %q:\n%s", want, md.String())
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil || len(back.Results) != 2 || back.Results[0].SavedTokens != rep.Results[0].SavedTokens {
		t.Fatalf("JSON round trip: %v", err)
	}
}
