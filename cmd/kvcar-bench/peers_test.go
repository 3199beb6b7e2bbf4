package main

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvcar/kvcar/internal/devcluster"
)

func TestLLMDScores(t *testing.T) {
	v := view{
		// Blocks of 512: 0, 2, 4 and 4 (in tokens).
		hit: []int{0, 2 * TraceBlockTokens, 4 * TraceBlockTokens, 4 * TraceBlockTokens},
		load: []devcluster.InstanceLoad{
			{Waiting: 3, GPUCacheUsagePerc: 0.5},
			{Waiting: 1, GPUCacheUsagePerc: 0.25},
			{Waiting: 5, GPUCacheUsagePerc: 1},
			{Waiting: 1, GPUCacheUsagePerc: 0},
		},
		ok: []bool{true, true, true, true},
	}
	got := llmdScores(v)
	// prefix: 0 (no block), (2−2)/(4−2) = 0, 1, 1; KV: 1 − usage;
	// queue: (5−q)/(5−1).
	want := []float64{2*0 + 0.5 + 0.5, 2*0 + 0.75 + 1, 2*1 + 0 + 0, 2*1 + 1 + 1}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("scores %v, want %v", got, want)
		}
	}
	if e := pickBest(got, v.ok, true, rand.New(rand.NewPCG(1, 1))); e != 3 {
		t.Fatalf("picked %d, want 3", e)
	}
	// One instance with hits scores a full prefix; equal queues score 1.
	v = view{hit: []int{TraceBlockTokens, 0}, load: make([]devcluster.InstanceLoad, 2), ok: []bool{true, true}}
	if got := llmdScores(v); got[0] != 2+1+1 || got[1] != 0+1+1 {
		t.Fatalf("scores %v", got)
	}
}

func TestPickBestTiesAndExclusions(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	counts := make([]int, 4)
	for range 4000 {
		counts[pickBest([]float64{1, 0, 0, 0}, []bool{true, true, false, true}, false, rng)]++
	}
	if counts[0] != 0 || counts[2] != 0 || counts[1] < 1700 || counts[3] < 1700 {
		t.Fatalf("ties 1 and 3 picked %v times", counts)
	}
	if pickBest([]float64{1}, []bool{false}, true, rng) != -1 {
		t.Fatal("picked an excluded instance")
	}
}

// TestDynamoCostTracksInFlight checks the cost and the router-side
// tracking: a request's new tokens count as prefill load and its blocks
// as active until done, shared blocks once.
func TestDynamoCostTracksInFlight(t *testing.T) {
	r := newDynamoRouter(observer{f: &fleet{names: []string{"a", "b"}}}, rand.New(rand.NewPCG(1, 2)))
	req := &traceRequest{Input: 3*TraceBlockTokens - 100, HashIDs: []uint64{1, 2, 3}}
	other := &traceRequest{Input: 2 * TraceBlockTokens, HashIDs: []uint64{1, 9}}
	v := view{hit: []int{TraceBlockTokens, 0}, ok: []bool{true, true}}
	// a: (3·512−100 − 512)/512 prefill blocks + 3 new blocks = 2.8 + 3;
	// b: (3·512−100)/512 + 3: a is cheaper.
	e, done := r.choose(v, &replayRequest{req: req})
	if e != 0 {
		t.Fatalf("picked %d, want 0 (the cached prefix)", e)
	}
	if tokens, blocks := r.inFlight(); tokens != 3*TraceBlockTokens-100-TraceBlockTokens || blocks != 3 {
		t.Fatalf("tracking %d tokens, %d blocks", tokens, blocks)
	}
	// Now a carries 2.8 prefill blocks and 3 active ones: the next
	// request, one cached block at a, costs there (2.8+1) + (3+1), its
	// first block being active already, against b's 2 + 2; b wins.
	e2, done2 := r.choose(v, &replayRequest{req: other})
	if e2 != 1 {
		t.Fatalf("picked %d, want 1 (a is loaded)", e2)
	}
	done()
	done2()
	if tokens, blocks := r.inFlight(); tokens != 0 || blocks != 0 {
		t.Fatalf("after done: %d tokens, %d blocks", tokens, blocks)
	}
}

func TestParseTraceErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"timestamp":0,"input_length":600,"output_length":1,"hash_ids":[1]}`, "line 1: input_length 600 does not fit 1 hash ids"},
		{`{"timestamp":5,"input_length":10,"output_length":1,"hash_ids":[1]}` + "\n" + `{"timestamp":4,"input_length":10,"output_length":1,"hash_ids":[2]}`, "line 2: timestamp 4 is before"},
		{`{"input_length":10,"output_length":1,"hash_ids":[1]}`, "line 1: timestamp is missing"},
		{`{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[-1]}`, "line 1: json"},
		{`{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[]}`, "line 1: hash_ids has 0 ids"},
		{``, "no requests"},
	} {
		_, err := parseTrace(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
	reqs, err := parseTrace(strings.NewReader(`{"timestamp":3,"input_length":513,"output_length":7,"hash_ids":[4,5]}` + "\n\n"))
	if err != nil || len(reqs) != 1 || reqs[0].fullBlocks() != 1 || reqs[0].Output != 7 || reqs[0].Line != 1 {
		t.Fatalf("%+v, %v", reqs, err)
	}
}
