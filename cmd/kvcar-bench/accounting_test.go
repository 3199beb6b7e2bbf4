package main

import (
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/kvcar/kvcar/internal/enginesim"
)

// sharedTrace loads one of the Mooncake traces kept in testdata/traces.
func sharedTrace(t *testing.T, name string) []traceRequest {
	t.Helper()
	reqs, err := loadTrace(filepath.Join("testdata", "traces", name))
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestSharedUnboundedReproducesPublishedReuse is the check of the replay's
// accounting: one unbounded cache seeing every request in file order
// reuses 36.64 % of the conversation trace's blocks and 63.96 % of the
// synthetic trace's, the figures the traces' README gives.
func TestSharedUnboundedReproducesPublishedReuse(t *testing.T) {
	for _, tc := range []struct {
		file     string
		requests int
		want     float64
	}{
		{"mooncake_conversation_trace.jsonl", 12031, 36.64},
		{"mooncake_synthetic_trace.jsonl", 3993, 63.96},
	} {
		reqs := sharedTrace(t, tc.file)
		if len(reqs) != tc.requests {
			t.Fatalf("%s: %d requests, want %d", tc.file, len(reqs), tc.requests)
		}
		got := sharedReuse(reqs, 0)
		if math.Abs(got.blockPct()-tc.want) >= 0.005 {
			t.Errorf("%s: %.4f %% of blocks reused, want %.2f %%", tc.file, got.blockPct(), tc.want)
		}
		// Saved tokens count whole blocks only, against every input token.
		if got.SavedTokens%TraceBlockTokens != 0 || got.SavedTokens >= got.InputTokens || got.Requests != tc.requests {
			t.Errorf("%s: saved %d of %d tokens over %d requests", tc.file, got.SavedTokens, got.InputTokens, got.Requests)
		}
		t.Logf("%s: %.2f %% of blocks, %.2f %% of input tokens", tc.file, got.blockPct(), got.savedPct())
	}
}

// TestPrefixLRUMatchesEngine feeds the first requests of the
// conversation trace, expanded into token ids, to a real emulated engine
// whose cache is small enough to evict, and the same requests to the
// accounting model: request by request, the engine's reused tokens must
// be the model's reused blocks × 512. So the bounds computed with the
// model are what the engines would do, and the expansion keeps exactly
// the trace's prefix sharing.
func TestPrefixLRUMatchesEngine(t *testing.T) {
	reqs := sharedTrace(t, "mooncake_conversation_trace.jsonl")[:400]
	// The trace's full lengths, and prompts 8 times shorter with blocks
	// as short (--token_scale=8): the same blocks either way.
	for _, perBlock := range []int{TraceBlockTokens, TraceBlockTokens / 8} {
		t.Run(strconv.Itoa(perBlock), func(t *testing.T) { checkModelAgainstEngine(t, reqs, perBlock) })
	}
}

func checkModelAgainstEngine(t *testing.T, reqs []traceRequest, perBlock int) {
	const capacity = 96 // blocks: a few prompts' worth, so LRU evicts
	e, err := enginesim.New(enginesim.Config{BlockSize: perBlock, DeviceBlocks: capacity})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	model := newPrefixLRU(capacity)
	var tokens []uint32
	var keys []uint64
	reused, evicting := 0, false
	for i := range reqs {
		r := &reqs[i]
		tokens = appendTokens(tokens[:0], r, perBlock)
		if len(tokens) != promptLen(r, perBlock) || perBlock == TraceBlockTokens && len(tokens) != r.Input {
			t.Fatalf("line %d: %d tokens, input_length %d", r.Line, len(tokens), r.Input)
		}
		dev, host, err := e.Prefill(0, tokens)
		if err != nil {
			t.Fatal(err)
		}
		keys = chainKeys(keys[:0], r, r.fullBlocks())
		want := model.serve(keys) * perBlock
		if dev != want || host != 0 {
			t.Fatalf("line %d: engine reused %d Device + %d Host tokens, model %d", r.Line, dev, host, want)
		}
		reused += dev
		evicting = evicting || model.resident() == capacity
	}
	if reused == 0 || !evicting {
		t.Fatalf("the slice reused %d tokens and filled the cache: %v; it checks nothing", reused, evicting)
	}
}

func TestAppendTokensDeterministic(t *testing.T) {
	a := traceRequest{Input: 700, HashIDs: []uint64{5, 9}}
	b := traceRequest{Input: 1024, HashIDs: []uint64{5, 9}}
	ta, tb := appendTokens(nil, &a, TraceBlockTokens), appendTokens(nil, &b, TraceBlockTokens)
	if len(ta) != 700 || len(tb) != 1024 || !slices.Equal(ta, tb[:700]) {
		t.Fatal("equal ids must give equal tokens, cut to input_length")
	}
	// Shorter prompts keep each block's first ids and round the cut up.
	if short := appendTokens(nil, &a, 64); len(short) != promptLen(&a, 64) || len(short) != 64+24 ||
		!slices.Equal(short[:64], ta[:64]) || !slices.Equal(short[64:], ta[512:512+24]) {
		t.Fatalf("scaled prompt of %d ids", len(short))
	}
	c := traceRequest{Input: 512, HashIDs: []uint64{6}}
	if slices.Equal(appendTokens(nil, &c, TraceBlockTokens), ta[:512]) {
		t.Fatal("different ids gave the same block")
	}
	for _, tok := range tb {
		if tok >= traceVocab {
			t.Fatalf("token %d outside the vocabulary", tok)
		}
	}
}
