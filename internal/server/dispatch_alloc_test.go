//go:build !race

package server

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestDispatchAllocationsDoNotGrowWithPrompt: once the pools are warm, a
// completion dispatched to an xLLM engine over baidu_std allocates the
// same per request whatever its prompt's length, through the whole
// handler (parse, decision, the encoded message written from reused
// buffers, the Generation back): the prompt is copied once, from the
// body's storage into the message's, both reused. A prompt 32 times
// longer may cost at most 1 KiB and one allocation more, which is noise
// from the process's other goroutines.
func TestDispatchAllocationsDoNotGrowWithPrompt(t *testing.T) {
	engine := frugalXLLMEngine(t)
	router, reg := backendRouter(t, map[string]string{engine: ""})
	x := startXLLMSide(t, reg)
	s := New(Options{Router: router, Dispatcher: x.disp})
	s.SetReady(true)
	h := s.Handler()
	measure := func(ids int) (bytesPerOp, allocsPerOp float64) {
		const runs = 200
		serve := completionLoop(t, h, idsCompletion(ids))
		for range 20 {
			serve()
		}
		runtime.GC()
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			serve()
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / runs, float64(after.Mallocs-before.Mallocs) / runs
	}
	smallB, smallN := measure(2048)
	largeB, largeN := measure(65536)
	t.Logf("per request: 2048 ids %.0f B in %.1f allocations, 65536 ids %.0f B in %.1f allocations", smallB, smallN, largeB, largeN)
	if largeB-smallB > 1024 || largeN-smallN > 1 {
		t.Errorf("a prompt of 65536 ids allocates %.0f B per request in %.1f allocations, %.0f B more than one of 2048",
			largeB, largeN, largeB-smallB)
	}
}
