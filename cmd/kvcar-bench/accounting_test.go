package main

import (
	"math"
	"path/filepath"
	"testing"
)

// sharedTraces is where the Mooncake traces and their README live,
// ../shared from the repository root.
func sharedTrace(t *testing.T, name string) []traceRequest {
	t.Helper()
	path := filepath.Join("..", "..", "..", "shared", "traces", name)
	reqs, err := loadTrace(path)
	if err != nil {
		t.Skipf("trace not available: %v", err)
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
