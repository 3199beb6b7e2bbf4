package enginesim

import (
	"math"
	"time"
)

// CostModel is the prefill part of the inference cost model, in emulated
// time (before TimeScale). A prefill computes the prompt tokens the cache
// does not hold: each costs PrefillPerToken (the weights' FLOPs, linear
// in tokens) plus its attention over the context before it,
// AttentionPer1KContext per 1,024 context tokens. The context of a
// computed token is the reused prefix and, on average, half of the
// computed tokens, causal attention over the new part being a triangle.
// A Host-hit token costs HostLoadPerToken to bring back to Device.
//
// Reused tokens are not free of attention: the computed suffix still
// attends to them, so a long cached prefix makes its suffix dearer, as
// it does on a real engine.
type CostModel struct {
	PrefillPerToken       time.Duration
	AttentionPer1KContext time.Duration
	HostLoadPerToken      time.Duration
}

// Prefill is the time to prefill a prompt of prompt tokens of which
// deviceHit are reused from Device and hostHit loaded back from Host.
// Hits beyond the prompt count as the whole prompt.
func (m CostModel) Prefill(prompt, deviceHit, hostHit int) time.Duration {
	reused := min(max(deviceHit, 0)+max(hostHit, 0), max(prompt, 0))
	computed := float64(max(prompt, 0) - reused)
	attention := computed * (float64(reused) + computed/2) / 1024 * float64(m.AttentionPer1KContext)
	d := computed*float64(m.PrefillPerToken) + attention + float64(min(max(hostHit, 0), reused))*float64(m.HostLoadPerToken)
	// A bound no real prompt reaches, so the conversion cannot overflow.
	return time.Duration(min(d, math.MaxInt64/2))
}

// CostModel returns the engine's prefill cost model, defaults applied and
// unscaled: what a request's prefill takes in emulated time.
func (e *Engine) CostModel() CostModel {
	return CostModel{
		PrefillPerToken:       e.cfg.PrefillPerToken,
		AttentionPer1KContext: e.cfg.PrefillAttentionPer1KContext,
		HostLoadPerToken:      e.cfg.HostLoadPerToken,
	}
}
