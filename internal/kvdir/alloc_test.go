package kvdir

import (
	"slices"
	"testing"
)

// R-DIR-4: a query (Query, and a router's Hits) reads published views
// only and, once its pooled scratch is warm and dst has room, allocates
// nothing, whether it matches a prompt over every stream or only reads
// their status.
// `make test` runs this without the race detector (tests named *Alloc*).
func TestQueryDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	const streams, shared = 128, 16
	d := viewOf(syncedStreams(t, streams, shared, 64))
	prompt := slices.Concat(promptTokens(0, shared*benchBlockSize), promptTokens(9999, (64-shared)*benchBlockSize))
	dst := make([]Match, 0, streams)
	dst = d.Query(prompt, dst[:0])
	if len(dst) != streams || dst[0].DeviceHitTokens != shared*benchBlockSize {
		t.Fatalf("warm-up query: %d matches, first %+v", len(dst), dst[0])
	}
	for _, tc := range []struct {
		name   string
		tokens []uint32
	}{{"prompt", prompt}, {"status", nil}, {"shorter than a block", prompt[:benchBlockSize-1]}} {
		if n := testing.AllocsPerRun(50, func() { dst = d.Query(tc.tokens, dst[:0]) }); n != 0 {
			t.Errorf("%s: %v allocations per query, want 0", tc.name, n)
		}
		if len(dst) != streams {
			t.Errorf("%s: %d matches, want %d", tc.name, len(dst), streams)
		}
		hits := make([]Hit, 0, streams)
		if n := testing.AllocsPerRun(50, func() { _, hits = d.Hits(tc.tokens, hits[:0]) }); n != 0 {
			t.Errorf("%s: %v allocations per router query, want 0", tc.name, n)
		}
		if len(hits) != streams {
			t.Errorf("%s: %d hits, want %d", tc.name, len(hits), streams)
		}
	}
}
