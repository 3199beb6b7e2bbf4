package enginesim

import (
	"testing"
	"time"
)

func TestCostModelPrefill(t *testing.T) {
	m := CostModel{PrefillPerToken: 100 * time.Microsecond, AttentionPer1KContext: 2 * time.Microsecond, HostLoadPerToken: 10 * time.Microsecond}
	// 2048 computed tokens, no context before them: linear part plus a
	// triangle of attention, 2048 · 1024 / 1024 · 2 µs.
	if got, want := m.Prefill(2048, 0, 0), 2048*100*time.Microsecond+2048*2*time.Microsecond; got != want {
		t.Fatalf("cold 2048: %v, want %v", got, want)
	}
	// The same 2048 computed after a 4096-token Device hit attend to it.
	if got, want := m.Prefill(6144, 4096, 0), 2048*100*time.Microsecond+2048*(4096+1024)/1024*2*time.Microsecond; got != want {
		t.Fatalf("2048 after 4096 hit: %v, want %v", got, want)
	}
	// Host hits cost their load and count as context.
	if got, want := m.Prefill(6144, 2048, 2048), 2048*100*time.Microsecond+2048*(4096+1024)/1024*2*time.Microsecond+2048*10*time.Microsecond; got != want {
		t.Fatalf("host hit: %v, want %v", got, want)
	}
	// A full hit computes nothing; hits past the prompt are the prompt.
	if got := m.Prefill(512, 512, 0); got != 0 {
		t.Fatalf("full hit: %v", got)
	}
	if got := m.Prefill(512, 4096, 0); got != 0 {
		t.Fatalf("hit past the prompt: %v", got)
	}
	// Without attention the model is the linear one it replaced.
	lin := CostModel{PrefillPerToken: 100 * time.Microsecond, HostLoadPerToken: 20 * time.Microsecond}
	if got, want := lin.Prefill(1000, 200, 100), 700*100*time.Microsecond+100*20*time.Microsecond; got != want {
		t.Fatalf("linear: %v, want %v", got, want)
	}
}
