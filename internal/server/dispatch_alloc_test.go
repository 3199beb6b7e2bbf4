//go:build !race

package server

import "testing"

// TestDispatchAllocationsDoNotGrowWithPrompt: once the pools are warm, a
// completion dispatched to an xLLM engine over baidu_std allocates the
// same per request whatever its prompt's length, through the whole
// handler (parse, decision, the encoded message written from reused
// buffers, the Generation back): the prompt is copied once, from the
// body's storage into the message's, both reused. A prompt 32 times
// longer may cost at most 1 KiB more, which is noise from the process's
// other goroutines, and no allocation more.
func TestDispatchAllocationsDoNotGrowWithPrompt(t *testing.T) {
	engine := frugalXLLMEngine(t)
	router, reg := backendRouter(t, map[string]string{engine: ""})
	x := startXLLMSide(t, reg)
	s := New(Options{Router: router, Dispatcher: x.disp})
	s.SetReady(true)
	checkAllocsFlat(t, s.Handler())
}
